"""Hostile traces and experiment files: each is one line naming the file and the limit
or field, exit 2, no traceback, in a process capped at 1 GiB of address space (the files
decode to gigabytes: without the limits the capped process dies of MemoryError, and an
uncapped one takes the machine's memory)."""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from agent_replay.replay.config import RunConfig
from agent_replay.replay.plan import build_plan
from agent_replay.replay.source import read_replayed
from agent_replay.traces.io import read_trace, write_trace
from agent_replay.traces.schema import TraceMeta
from agent_replay.traces.select import first_sessions
from agent_replay.traces.validate import validate_or_raise
from tests.faults import hostile
from tests.replay.helpers import chain_rows, trace_table, write_rows

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "PASS-SECRET-2468"
CAP = 1 << 30


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_replay", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_capped,
    )


def _one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


BOMBS: list[tuple[str, Callable[[Path], Path], str]] = [
    ("string", hostile.string_bomb, "field 'content': decodes to more than 0.50 GiB"),
    ("long-name", hostile.long_name, "row 0, field 'session_id': a value of 1,048,576 bytes"),
    ("name", hostile.name_bomb, "row 0, field 'model': a value of 1,048,576 bytes"),
    ("list", hostile.list_bomb, "field 'hash_ids': 11,000,000 list values in 1 rows"),
    ("nan", hostile.nan_arrival, "row 7, field 'arrival_ns': nan is not a finite number"),
]


@pytest.mark.parametrize(
    ("make", "says"), [(m, s) for _, m, s in BOMBS], ids=[n for n, _, _ in BOMBS]
)
def test_hostile_trace_is_one_line_in_validate_inspect_and_run(
    tmp_path: Path, make: Callable[[Path], Path], says: str
) -> None:
    path = make(tmp_path / "t.parquet")
    assert path.stat().st_size < 200_000  # tiny on disk
    for args in (
        ["traces", "validate", str(path)],
        ["traces", "inspect", str(path)],
        ["run", str(path), "--target", "http://127.0.0.1:9", "-o", str(tmp_path / "r")],
    ):
        if args[1] == "inspect" and "content" in says:  # inspect does not read content
            r = _cli(*args)
            assert r.returncode == 0 and "9,000" in r.stdout, r.stderr
            continue
        line = _one_line(_cli(*args))
        assert str(path) in line and says in line, (args, line)


def test_limits_hold_in_the_library_too(tmp_path: Path) -> None:
    from agent_replay.errors import TraceError
    from agent_replay.traces.limits import TraceLimits

    path = hostile.string_bomb(tmp_path / "t.parquet", rows=40, value_bytes=1000)
    table, _ = read_trace(path)  # 40 KB decoded: within the defaults
    assert table.column("content").type == pa.string() and table.num_rows == 40
    with pytest.raises(TraceError, match=r"decodes to more than 0\.00 GiB"):
        read_trace(path, limits=TraceLimits(max_bytes=30_000))
    with pytest.raises(TraceError, match="more than 39 rows"):
        read_trace(path, limits=TraceLimits(max_rows=39))
    with pytest.raises(TraceError, match=r"row 0, field 'content': a value of 1,000 bytes"):
        read_trace(path, limits=TraceLimits(max_value_bytes=999))
    # a column the schema does not know is kept as it is, NaN included
    table = trace_table(chain_rows(1, 3)).append_column("score", pa.array([1.0, np.nan, 2.0]))
    extra = write_trace(table, tmp_path / "extra.parquet", TraceMeta(block_size=16))
    got, _ = read_trace(extra)
    assert np.isnan(got.column("score").to_numpy()[1])


def test_max_sessions_reads_only_the_sessions_it_can_use(tmp_path: Path) -> None:
    # 40 sessions, starts 0, 100, 200... ms; the first failed request of s0 and all of s1's
    # fail, so s1 has no start and s0 starts at its second request
    rows = chain_rows(40, 3)
    table = trace_table(rows)
    errors = [None] * len(rows)
    errors[0] = errors[3] = errors[4] = errors[5] = "upstream: HTTP 500"
    table = table.append_column("error", pa.array(errors, pa.string()))
    trace = write_trace(table, tmp_path / "t.parquet", TraceMeta(block_size=16))
    got = first_sessions(trace, 3, skip_failed=True)
    assert got == {"s0", "s2", "s3"}  # s0 starts at 300 ms, after s2 (200 ms), before s4
    assert first_sessions(trace, 40, skip_failed=True) is None
    whole, _ = read_trace(trace)
    for mult in (1, 3):
        cfg = RunConfig(
            trace=str(trace), target="http://127.0.0.1:9", max_sessions=5, sessions_multiplier=mult
        )
        part, _, numbers = read_replayed(cfg)
        # with clones the whole trace is read: their start shifts depend on every session
        assert part.num_rows == (15 if mult == 1 else whole.num_rows)
        assert np.array_equal(
            part.column("request_index").to_numpy(),
            whole.column("request_index").to_numpy()[numbers],
        )
        from agent_replay.traces.failed import drop_failed

        a = build_plan(drop_failed(part)[0], 16, cfg.plan_options())
        b = build_plan(drop_failed(whole)[0], 16, cfg.plan_options())
        assert [(s.session_id, s.clone, s.start_ns) for s in a.sessions] == [
            (s.session_id, s.clone, s.start_ns) for s in b.sessions
        ]
        assert len(a.sessions) == 5


def test_a_problem_in_a_read_part_names_the_trace_row(tmp_path: Path) -> None:
    from agent_replay.errors import TraceError

    rows = chain_rows(6, 2)
    rows[9]["parent_index"] = 5  # s4's second request names a request s4 does not have
    trace = write_rows(tmp_path / "t.parquet", rows)
    cfg = RunConfig(trace=str(trace), target="http://127.0.0.1:9", max_sessions=5)
    part, meta, numbers = read_replayed(cfg)
    assert 9 in numbers and part.num_rows == 10
    with pytest.raises(TraceError, match="row 9, field 'parent_index'"):
        validate_or_raise(part, meta, str(trace), numbers)


def test_max_sessions_bounds_the_memory_of_a_many_row_trace(tmp_path: Path) -> None:
    """300K rows in 30K sessions: the run with --max-sessions 5 reads and plans five
    sessions in a process capped at 1 GiB and fails only on the target, not the trace."""
    trace = hostile.many_rows(tmp_path / "t.parquet", 300_000, 30_000)
    r = _cli(
        "run",
        str(trace),
        "--target",
        "http://127.0.0.1:9",
        "--max-sessions",
        "5",
        "-o",
        str(tmp_path / "r"),
    )
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr, r.stderr
    assert r.returncode == 3 and "127.0.0.1:9" in r.stderr, r.stderr


EXP = """
trace = "t.parquet"
output = "out"
repeats = 1
[load]
axis = "concurrent_sessions"
points = [1]
[warmup]
enabled = false
[[targets]]
name = "down"
url = "http://127.0.0.1:9"
"""


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (("points = [1]", "points = [1e308]"), "load.points[0]: 1e+308 is out of range"),
        (("points = [1]", "points = [inf]"), "load.points[0]: inf is out of range"),
        (("points = [1]", "points = [nan]"), "load.points[0]: nan is out of range"),
        (("points = [1]", "points = [2000000]"), "at most 1e+06"),
        (("repeats = 1", "repeats = 1000000000"), "repeats: must be within 1..1000"),
        (("[warmup]", "[run]\nduration_s = -5\n[warmup]"), "[run] duration_s: must be > 0, got -5"),
        (('axis = "concurrent_sessions"', 'axis = "rate"'), None),
        (("[warmup]", "[run]\nspeedup = 0\n[warmup]"), "[run] speedup: must be > 0, got 0"),
        (
            ("points = [1]", "points = [" + ", ".join(str(i) for i in range(1, 1002)) + "]"),
            "1,001 points, more than 1000",
        ),
        (("[warmup]", "[run]\nx = " + "[" * 4000 + "]" * 4000 + "\n[warmup]"), "nested too deeply"),
        (("[warmup]", "[run]\nx = " + "[" * 10 + "]" * 10 + "\n[warmup]"), "nested too deeply"),
    ],
)
def test_bad_sweep_file_is_one_line(
    tmp_path: Path, change: tuple[str, str], says: str | None
) -> None:
    write_rows(tmp_path / "t.parquet", chain_rows(1, 1))
    text = EXP.replace(*change)
    if says is None:  # the rate axis with a speedup of 0 in [run]
        text = text.replace("[warmup]", "[run]\nspeedup = 0\n[warmup]")
        says = "[run] speedup: must be > 0, got 0"
    (tmp_path / "e.toml").write_text(text)
    if "nested" in says or "1e+308" in says:  # through the CLI: one line, no traceback
        line = _one_line(_cli("sweep", str(tmp_path / "e.toml")))
    else:
        from agent_replay.errors import InputError
        from agent_replay.replay.sweep import load_experiment

        with pytest.raises(InputError) as got:
            load_experiment(tmp_path / "e.toml")
        line = str(got.value)
        assert "\n" not in line
    assert str(tmp_path / "e.toml") in line and says in line, line
    assert not (tmp_path / "out").exists()


def test_failed_runs_exit_1_and_are_run_again_on_resume(tmp_path: Path) -> None:
    """Also: the target's user-info is in no file of the sweep and not on stderr."""
    write_rows(tmp_path / "t.parquet", chain_rows(1, 1))
    (tmp_path / "e.toml").write_text(
        EXP.replace("points = [1]", "points = [1, 2]").replace(
            "http://127.0.0.1:9", f"http://user:{PASSWORD}@127.0.0.1:9"
        )
    )
    first = subprocess.run(
        [sys.executable, "-m", "agent_replay", "sweep", str(tmp_path / "e.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.returncode == 1, first.stderr
    assert "Traceback" not in first.stderr
    assert "2 of 2 runs failed" in first.stderr
    assert first.stderr.count(": failed (") == 2
    again = subprocess.run(
        [sys.executable, "-m", "agent_replay", "sweep", str(tmp_path / "e.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 1
    assert "resuming" not in again.stderr  # no run counts as done
    assert again.stderr.count(": failed (") == 2  # both run again
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert any(p.name == "sweep.json" for p in files) and any(p.suffix == ".csv" for p in files)
    leaks = [str(p) for p in files if PASSWORD.encode() in p.read_bytes()]
    assert leaks == [] and PASSWORD not in first.stderr + again.stderr + first.stdout
    assert "127.0.0.1:9" in (tmp_path / "out" / "sweep.json").read_text()


def test_run_json_keeps_header_values_only_for_safe_names() -> None:
    from dataclasses import asdict

    from agent_replay.redact import redact, redact_argv

    cfg = RunConfig(
        trace="t",
        target=f"http://u:{PASSWORD}@h:8000/v1",
        api_key=PASSWORD,
        headers=(
            ("X-Auth", PASSWORD),
            ("X-Trace", PASSWORD),
            ("Accept", "text/x"),
            ("Authorization", f"Bearer {PASSWORD}"),
        ),
    )
    opts = redact(asdict(cfg))
    assert opts["headers"] == [
        ["X-Auth", "<redacted>"],
        ["X-Trace", "<redacted>"],
        ["Accept", "text/x"],
        ["Authorization", "<redacted>"],
    ]
    assert opts["target"] == "http://h:8000/v1" and opts["api_key"] == "<redacted>"
    argv = redact_argv(
        [
            "run",
            "--header",
            f"X-Auth={PASSWORD}",
            f"--header=X-Trace: {PASSWORD}",
            "-H",
            "Accept=text/x",
            "--target",
            f"http://u:{PASSWORD}@h/",
        ]
    )
    assert argv == [
        "run",
        "--header",
        "X-Auth=<redacted>",
        "--header=X-Trace:<redacted>",
        "-H",
        "Accept=text/x",
        "--target",
        "http://h/",
    ]
    assert PASSWORD not in repr(opts) + repr(argv)
