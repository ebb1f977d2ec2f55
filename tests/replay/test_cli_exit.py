"""The executable's exit: Python's shutdown steps run, the exit code is the command's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import atexit, multiprocessing, sys, threading, time
from agent_replay.replay.cli import exit_process

def child():
    time.sleep(0.2)

if __name__ == "__main__":
    out = sys.argv[1]
    atexit.register(lambda: open(out, "a").write("atexit\\n"))
    def slow():
        time.sleep(0.3)
        open(out, "a").write("thread\\n")
    threading.Thread(target=slow).start()
    p = multiprocessing.get_context("spawn").Process(target=child)
    p.start()
    sys.stdout.write("unflushed output")
    exit_process(3)
"""


def test_exit_process_runs_python_shutdown_and_keeps_the_code(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    script = tmp_path / "exit_script.py"
    script.write_text(SCRIPT)
    res = subprocess.run(
        [sys.executable, str(script), str(marks)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert res.returncode == 3, res.stderr
    assert res.stdout == "unflushed output"
    # the non-daemon thread is joined before the atexit handlers, as at a normal exit
    assert marks.read_text() == "thread\natexit\n"


def test_module_entry_exit_codes(tmp_path: Path) -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "agent_replay", "report", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert bad.returncode not in (0, -6) and bad.stderr.startswith("agent-replay: error:"), (
        bad.stderr
    )
    ok = subprocess.run(
        [sys.executable, "-m", "agent_replay", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert ok.returncode == 0 and ok.stdout.startswith("agent-replay ")


HOOK_SCRIPT = """
import atexit, sys, threading
from agent_replay.replay.cli import exit_process

def hook():
    raise OSError(9, "Bad file descriptor")

threading._register_atexit(hook)  # as concurrent.futures registers its exit hook
atexit.register(lambda: open(sys.argv[1], "w").write("atexit"))
exit_process(0)
"""


def test_a_raising_exit_hook_is_one_line_and_keeps_the_code(tmp_path: Path) -> None:
    script = tmp_path / "hook_script.py"
    script.write_text(HOOK_SCRIPT)
    marks = tmp_path / "marks"
    res = subprocess.run(
        [sys.executable, str(script), str(marks)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [
        "agent-replay: at exit: OSError: [Errno 9] Bad file descriptor"
    ]
    assert marks.read_text() == "atexit"  # the other exit steps still ran
