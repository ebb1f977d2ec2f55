"""Servers that lie about what they served, played by the simulated engine's faults:

- ``usage_scale=10``: the final ``usage`` says ten times the tokens the stream carried.
  Throughput counts the streamed tokens (what was served), every row is flagged
  ``mismatch`` and the run's summary counts the disagreements.
- ``empty=0.3``: three requests in ten answered 200 with no token although the trace asks
  for tokens: failed rows of their own kind, ``empty``, not ``ok``.

Each probe replays a small trace, then compares what the run and its report say with the
tokens the engine's ground truth says it streamed."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.report import build_report
from agent_replay.engines.sim.process import SimProcess
from agent_replay.engines.sim.profile import SimProfile
from tests.replay.helpers import MS, chain_rows, write_rows

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 120 requests over about 2 s, 6 to 9 output tokens each
    return write_rows(
        tmp_path_factory.mktemp("trace") / "t.parquet",
        chain_rows(30, 4, gap_ns=40 * MS, think_ns=100 * MS, output_tokens=6),
    )


def _lying_run(
    trace: Path, work: Path, faults: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], int]:
    """The run's process, its run.json and the output tokens the engine streamed."""
    prof = json.loads(json.dumps(dataclasses.asdict(SimProfile.load("fast")), default=list))
    prof.update(faults=faults)
    work.mkdir(parents=True, exist_ok=True)
    (work / "prof.json").write_text(json.dumps(prof))
    gt = work / "gt.parquet"
    out = work / "res"
    with SimProcess(work / "prof.json", ground_truth=gt) as sim:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "agent_replay",
                "run",
                str(trace),
                "--target",
                sim.url,
                "-o",
                str(out),
                "--no-progress",
                "--scrape-interval",
                "0",
                "--gpu-metrics",
                "off",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    streamed = sum(
        sum(c) for c in pq.read_table(gt, columns=["chunk_tokens"]).column(0).to_pylist()
    )
    return r, json.loads((out / "run.json").read_text()), streamed


def test_a_usage_ten_times_the_stream_does_not_inflate_throughput(
    trace: Path, tmp_path: Path
) -> None:
    r, meta, streamed = _lying_run(trace, tmp_path, "usage_scale=10")
    rep = build_report(tmp_path / "res")
    tokens = rep.stats.tokens["output"]
    rows = pq.read_table(tmp_path / "res" / "requests", columns=["error_kind", "completion_tokens"])
    kinds = rows.column("error_kind").to_pylist()
    print(
        f"| usage 10x | streamed {streamed} | report output tokens {tokens} "
        f"({tokens / streamed:.2f}x) | output tok/s {rep.stats.extra['throughput']['output_tokens_per_s']:.1f} "
        f"| rows flagged {kinds.count('mismatch')}/{len(kinds)} | summary "
        f"usage_disagree {meta['summary'].get('usage_disagree')} |"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(kinds) == 120 and kinds.count("mismatch") == 120
    assert sum(rows.column("completion_tokens").to_pylist()) == 10 * streamed  # the lie is kept
    assert tokens == streamed
    assert meta["summary"]["output_tokens"] == streamed
    assert meta["summary"]["usage_disagree"] == 120
    assert "120 requests: the server's usage disagrees with the tokens it streamed" in r.stdout


def test_a_200_with_no_tokens_is_a_failure_of_its_own(trace: Path, tmp_path: Path) -> None:
    r, meta, _ = _lying_run(trace, tmp_path, "empty=0.3")
    rows = pq.read_table(
        tmp_path / "res" / "requests",
        columns=["status", "error_kind", "http_status", "chunk_tokens"],
    ).to_pylist()
    no_tokens = [x for x in rows if not sum(x["chunk_tokens"])]
    ok_empty = [x for x in no_tokens if x["status"] == "ok"]
    s = meta["summary"]
    print(
        f"| 200, 0 tokens (30%) | rows without tokens {len(no_tokens)} | of them ok "
        f"{len(ok_empty)} | errors {s['errors']} | status {meta['status']} |"
    )
    assert 20 <= len(no_tokens) <= 60  # 30% of 120, seeded
    assert ok_empty == []
    assert all(x["error_kind"] == "empty" and x["http_status"] == 200 for x in no_tokens)
    assert s["errors"] == {"empty": len(no_tokens)} and s["failed"] == len(no_tokens)
    assert s["ok"] == 120 - len(no_tokens)
    assert meta["status"] == "failed" and r.returncode == 1  # over 10% of the requests failed
    assert f"empty {len(no_tokens)}" in r.stdout
