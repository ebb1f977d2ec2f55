"""``run --targets A,B``: one plan in lanes side by side, compared request by request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_replay.engines.sim import SimProcess
from agent_replay.errors import InputError
from agent_replay.replay.cli import main
from agent_replay.replay.config import RunConfig
from agent_replay.replay.lanes import lane_configs
from tests.replay.helpers import MS, chain_rows, write_rows


def test_lane_configs_share_the_plan_and_salt() -> None:
    base = RunConfig(trace="t.parquet", target="", output="out", speedup=4)
    a, b = lane_configs(base, ["http://a:1", "http://b:2"])
    assert (a.target, a.output, b.target, b.output) == (
        "http://a:1",
        "out/lane-1",
        "http://b:2",
        "out/lane-2",
    )
    assert a.salt == b.salt and a.salt is not None and a.speedup == b.speedup == 4
    assert (
        lane_configs(RunConfig(trace="t", target="", output="o", salt=5), ["x", "y"])[1].salt == 5
    )
    with pytest.raises(InputError, match="two or more"):
        lane_configs(base, ["http://a:1"])
    with pytest.raises(InputError, match="given twice"):
        lane_configs(base, ["http://a:1", "http://a:1"])
    with pytest.raises(InputError, match="needs --output"):
        lane_configs(RunConfig(trace="t", target=""), ["x", "y"])


def test_two_lanes_at_once_give_a_paired_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = chain_rows(8, 4, gap_ns=20 * MS, think_ns=10 * MS, input_tokens=120, output_tokens=12)
    trace = write_rows(tmp_path / "t.parquet", rows)
    with SimProcess("fast") as a, SimProcess("fast") as b:
        code = main(
            [
                "run",
                str(trace),
                "--targets",
                f"{a.url},{b.url}",
                "-o",
                str(tmp_path / "ab"),
                "--speedup",
                "4",
                "--scrape-interval",
                "0",
                "--no-progress",
            ]
        )
    assert code == 0
    out = capsys.readouterr().out
    metas = [json.loads((tmp_path / "ab" / f"lane-{i}" / "run.json").read_text()) for i in (1, 2)]
    assert metas[0]["salt"] == metas[1]["salt"]
    assert metas[0]["target"]["url"] != metas[1]["target"]["url"]
    assert "paired: 32 requests in 8 sessions" in out
    assert "compare them: agent-replay compare" in out


@pytest.mark.timing
def test_lanes_start_their_plans_together(tmp_path: Path) -> None:
    # each lane waits for the others' imports before its plan starts, so the two runs share
    # their wall time (what ``compare`` needs to pair them under host contention)
    from agent_replay.analysis.paired import simultaneous
    from agent_replay.replay.lanes import run_lanes

    rows = chain_rows(4, 6, gap_ns=100 * MS, think_ns=100 * MS, input_tokens=120, output_tokens=12)
    trace = write_rows(tmp_path / "t.parquet", rows)
    with SimProcess("fast") as a, SimProcess("fast") as b:
        folders, code = run_lanes(
            RunConfig(
                trace=str(trace),
                target="",
                output=str(tmp_path / "ab"),
                scrape_interval_s=0,
                progress=False,
            ),
            [a.url, b.url],
        )
    assert code == 0
    metas = [json.loads((Path(f) / "run.json").read_text()) for f in folders]
    assert simultaneous(metas[0], metas[1])
