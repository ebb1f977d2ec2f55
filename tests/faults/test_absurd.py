"""Numbers no real trace has are one line and exit 2, in import, validate and run, before
any planning (a 2e9-token request used to plan for minutes at 2 GB)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from agent_replay.traces.io import write_trace
from agent_replay.traces.schema import TraceMeta
from tests.replay.helpers import chain_rows, trace_table, write_rows

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_replay", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        (
            [{"timestamp": 0, "input_length": 1e12, "output_length": 10, "hash_ids": [1]}],
            "does not fit the trace schema",
        ),
        (
            [
                {"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]},
                {"timestamp": 1e300, "input_length": 100, "output_length": 10, "hash_ids": [2]},
            ],
            "does not fit the trace schema",
        ),
        (
            [
                {
                    "timestamp": 0,
                    "input_length": 20_000_000,
                    "output_length": 10,
                    "hash_ids": list(range(-(-20_000_000 // 512))),
                }
            ],
            "row 0, field 'input_tokens': above 10,000,000",
        ),
        (
            [
                {"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]},
                {
                    "timestamp": 400 * 86_400_000,
                    "input_length": 100,
                    "output_length": 10,
                    "hash_ids": [2],
                },
            ],
            "field 'arrival_ns': more than a year",
        ),
    ],
)
def test_import_refuses_absurd_numbers(
    tmp_path: Path, rows: list[dict[str, object]], says: str
) -> None:
    src = tmp_path / "t.jsonl"
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    line = _one_line(
        _cli(
            "traces",
            "import",
            str(src),
            "--format",
            "mooncake",
            "-o",
            str(tmp_path / "out.parquet"),
        )
    )
    assert says in line, line
    assert not (tmp_path / "out.parquet").exists()


def test_validate_and_run_refuse_before_planning(tmp_path: Path) -> None:
    rows = chain_rows(2, 2)
    rows[1]["input_tokens"] = 2_000_000_000
    rows[1]["hash_ids"] = None
    trace = write_rows(tmp_path / "t.parquet", rows)
    line = _one_line(_cli("traces", "validate", str(trace)))
    assert "input_tokens" in line and "above 10,000,000" in line
    t0 = time.monotonic()
    line = _one_line(
        _cli("run", str(trace), "--target", "http://127.0.0.1:9", "-o", str(tmp_path / "res"))
    )
    assert "above 10,000,000" in line
    assert time.monotonic() - t0 < 30  # validation, not minutes of planning


def test_run_of_a_trace_whose_every_request_failed_is_refused(tmp_path: Path) -> None:
    table = trace_table(chain_rows(1, 2))
    table = table.append_column("error", pa.array(["upstream: HTTP 404"] * 2, pa.string()))
    trace = write_trace(table, tmp_path / "t.parquet", TraceMeta(block_size=16))
    line = _one_line(
        _cli("run", str(trace), "--target", "http://127.0.0.1:9", "-o", str(tmp_path / "res"))
    )
    assert "nothing to replay" in line and "2 requests all failed" in line
    assert "--include-failed" in line and str(trace) in line
    assert not (tmp_path / "res").exists()
