"""Names that come in a trace, a results folder or a server reply are data: ``[/x]``,
``[bold]``, ANSI colours, a screen clear and OSC titles and hyperlinks in every field
``traces inspect``, ``traces head`` and ``report`` print are shown (visibly escaped in a
terminal, removed in Markdown and CSV), never obeyed and never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from agent_replay.analysis.fixtures import synthetic_results, write_results
from agent_replay.analysis.render import to_csv, to_markdown, to_text
from agent_replay.analysis.report import build_report
from agent_replay.safetext import markup, plain, text, visible
from agent_replay.traces.io import write_trace
from agent_replay.traces.schema import TraceMeta

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = [
    "[/x]",
    "[bold]b",
    "\x1b[31mred\x1b[0m",
    "\x1b[2J",
    "\x1b]0;title\x07t",
    "\x1b]8;;http://evil/\x1b\\link\x1b]8;;\x1b\\",
    "\x9b2J",
    "tab\there",
]
RAW = ("\x1b", "\x07", "\x9b")


def test_the_four_forms_by_hand() -> None:
    assert visible("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert visible("a\nb\x9b") == "a\\nb\\x9b"
    assert plain("\x1b[31mred\x1b[0m") == "red"
    assert plain("\x1b]0;title\x07t") == "t"
    assert plain("\x1b]8;;http://evil/\x1b\\link\x1b]8;;\x1b\\") == "link"
    assert plain("\x9b2J") == "" and plain("a\tb\nc") == "a b c"
    assert markup("[/x]") == "\\[/x]"
    t = text("[bold]b")
    assert t.plain == "[bold]b" and not t.spans


def _assert_clean(out: str) -> None:
    for c in RAW:
        assert c not in out, repr(out[max(0, out.find(c) - 40) : out.find(c) + 40])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_replay", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"},
    )


def _trace(tmp_path: Path) -> Path:
    n = len(HOSTILE)
    t = pa.table(
        {
            "session_id": HOSTILE,
            "request_index": pa.array([0] * n, pa.int32()),
            "parent_index": pa.array([-1] * n, pa.int32()),
            "arrival_ns": pa.array(range(n), pa.int64()),
            "input_tokens": pa.array([32] * n, pa.int32()),
            "output_tokens": pa.array([4] * n, pa.int32()),
            "hash_ids": [[1, 2]] * n,
            "cached_tokens": pa.array([16] * n, pa.int32()),
            "api": HOSTILE,
            "model": HOSTILE,
            "agent_id": HOSTILE,
            "depends_on": pa.array([[]] * n, pa.list_(pa.int32())),
            "error": [None] + HOSTILE[1:],
            HOSTILE[0]: pa.array([1] * n),  # a column name
        }
    )
    meta = TraceMeta(block_size=16, source="imported:[/x]\x1b[2J", content_mode="none")
    return write_trace(t, tmp_path / "t.parquet", meta)


@pytest.mark.parametrize("cmd", ["inspect", "head"])
def test_traces_inspect_and_head_show_names_as_data(tmp_path: Path, cmd: str) -> None:
    trace = _trace(tmp_path)
    r = _cli("traces", cmd, str(trace))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    _assert_clean(r.stdout)
    assert "[/x]" in r.stdout and "\\x1b[2J" in r.stdout
    if cmd == "inspect":
        assert "[bold]b" in r.stdout and "\\x1b]0;title\\x07t" in r.stdout  # failed causes
        assert "imported:[/x]\\x1b[2J" in r.stdout  # the metadata's source


def _results(tmp_path: Path) -> Path:
    t = synthetic_results(80, 1, requests_per_session=10, failed_fraction=0.2)
    sid = t.column("session_id").to_pylist()
    names = {s: HOSTILE[i % len(HOSTILE)] for i, s in enumerate(dict.fromkeys(sid))}
    t = t.set_column(
        t.schema.get_field_index("session_id"),
        "session_id",
        pa.array([names[s] for s in sid], pa.string()),
    )
    kinds = t.column("error_kind").to_pylist()
    kinds = [None if k is None else HOSTILE[i % len(HOSTILE)] for i, k in enumerate(kinds)]
    t = t.set_column(
        t.schema.get_field_index("error_kind"), "error_kind", pa.array(kinds, pa.string())
    )
    return write_results(
        tmp_path / "run[/x]", t, {"options": {"timing": "session"}, "status": "ok"}
    )


def test_report_shows_names_as_data_in_every_format(tmp_path: Path) -> None:
    root = _results(tmp_path)
    rep = build_report(root)
    out = to_text(rep, width=300)
    _assert_clean(out)
    assert "[/x]" in out and "\\x1b[2J" in out and "\\x9b2J" in out
    for f in (to_markdown, to_csv):
        out = f(rep)
        _assert_clean(out)
        assert "[/x]" in out and "[bold]b" in out and "link" in out and "title" not in out
    r = _cli("report", str(root))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    _assert_clean(r.stdout)
    assert "[/x]" in r.stdout
    for fmt in ("md", "csv"):
        r = _cli("report", str(root), "--format", fmt)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        _assert_clean(r.stdout)


def test_an_error_line_shows_names_as_data(tmp_path: Path) -> None:
    """The one error line (here a file named with a screen clear and a line end) is one
    line with the name escaped; so is what ``traces validate`` prints."""
    r = _cli("traces", "inspect", str(tmp_path / "\x1b[2J\nt.parquet"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "\\x1b[2J\\nt.parquet" in lines[0], r.stderr
    _assert_clean(r.stderr)
    trace = _trace(tmp_path)
    bad = tmp_path / "bad\x1b]0;x\x07.parquet"
    trace.rename(bad)
    r = _cli("traces", "validate", str(bad))
    _assert_clean(r.stdout + r.stderr)
    assert "bad\\x1b]0;x\\x07.parquet: valid" in r.stdout, r.stdout
