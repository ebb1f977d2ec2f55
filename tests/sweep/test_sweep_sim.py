"""A real sweep on the simulated engine: plain run folders, the index, resumption, failed
points kept with their reasons, the frontier rebuilt from the tree, capacity at an SLO."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.frontier import build
from agent_replay.analysis.results import read_run_record
from agent_replay.replay.cli import main
from agent_replay.replay.sweep import load_experiment, run_capacity, run_sweep
from tests.replay.helpers import chain_rows, write_rows

pytestmark = pytest.mark.slow

EXP = """
trace = "t.parquet"
output = "out"
repeats = 2
seed = 3
[load]
axis = "concurrent_sessions"
points = [1, 3]
[run]
speedup = 4
scrape_interval_s = 0
[warmup]
burst_s = 0.3
max_bursts = 3
tolerance = 0.5
[[targets]]
name = "a"
sim = "fast"
usd_per_gpu_hour = 2.0
[[targets]]
name = "b"
sim = "fast"
"""


@pytest.fixture
def exp_file(tmp_path: Path) -> Path:
    write_rows(tmp_path / "t.parquet", chain_rows(3, 3, output_tokens=12))
    p = tmp_path / "exp.toml"
    p.write_text(EXP)
    return p


def test_sweep_runs_indexes_resumes_and_builds_the_frontier(exp_file: Path) -> None:
    lines: list[str] = []
    exp = load_experiment(exp_file)
    res = run_sweep(exp, progress=lines.append)
    out = Path(exp.output)
    assert len(res.rows) == 8 and {r["status"] for r in res.rows} == {"complete"}, res.rows
    idx = pq.read_table(out / "index.parquet").to_pylist()
    assert sorted((r["target"], r["point"], r["repeat"]) for r in idx) == sorted(
        (t, p, r) for t in "ab" for p in (1.0, 3.0) for r in (0, 1)
    )
    assert (out / "index.csv").read_text().count("\n") == 9
    for r in idx:
        run_dir = out / r["path"]
        meta = read_run_record(run_dir)
        assert meta.status == "ok" and meta.option("concurrent_sessions") == int(r["point"])
        prov = meta.provenance
        assert prov["command_line"] and prov["dependencies"]["pyarrow"]
        assert prov["server"]["version_endpoint"] is not None and prov["host"]["hostname"]
        warm = json.loads((run_dir.with_name(run_dir.name + ".warmup") / "warmup.json").read_text())
        assert 1 <= len(warm["bursts"]) <= 3 and r["warmup_bursts"] == len(warm["bursts"])
        assert r["p90_tps"] > 0 and r["output_tps_per_gpu"] > 0 and r["north_star"] > 0
        assert r["warmup_steady"] == warm["steady"] and (r["cold_start"] or warm["steady"])
        assert 0 < r["tpot_n"] <= r["requests_ok"] == r["ttft_n"]
        # paired design: the same (point, repeat) has the same salt on both targets
    salts = {(r["point"], r["repeat"]): set() for r in idx}
    for r in idx:
        salts[(r["point"], r["repeat"])].add(r["salt"])
    assert (
        all(len(s) == 1 for s in salts.values())
        and len({next(iter(s)) for s in salts.values()}) == 4
    )
    assert [r["usd_per_m_output"] is not None for r in idx if r["target"] == "a"] == [True] * 4
    assert len(lines) == 8 and lines[0].startswith("[1/8] r0 ")

    again: list[str] = []
    res2 = run_sweep(exp, progress=again.append)
    assert again == ["resuming " + str(out) + ": 8 of 8 runs already done"]
    assert "run_s" not in res2.timing

    built = build([out])
    assert (out / "frontier.md").exists() and (out / "frontier.json").exists()
    assert "| a | 3 | 2 |" in built["markdown"].replace("|  | ", "| ")
    # no GPU telemetry on the simulated engine: the energy figures are null, no energy column
    assert all(
        r["j_per_output_token"] is None and r["output_tokens_per_s_per_kw"] is None for r in idx
    )
    assert "J/output token" not in built["markdown"]
    assert (
        json.loads((out / "frontier.json").read_text())["points"][0]["mean_ci"][
            "j_per_output_token"
        ]["estimate"]
        is None
    )
    assert any("b vs a at 1, p90_tps" in c for c in built["comparisons"])
    # both targets are the same sim profile: no server setting differs
    assert "Targets' server settings" not in built["markdown"]


def test_unreachable_target_is_kept_as_failed_with_its_reason(
    tmp_path: Path, exp_file: Path
) -> None:
    text = exp_file.read_text().replace('sim = "fast"\n[[targets]]', 'sim = "fast"\n[[targets]]', 1)
    text = text.replace('name = "b"\nsim = "fast"', 'name = "b"\nurl = "http://127.0.0.1:9"')
    text = text.replace("points = [1, 3]", "points = [1]").replace("repeats = 2", "repeats = 1")
    exp_file.write_text(text)
    res = run_sweep(load_experiment(exp_file))
    by = {r["target"]: r for r in res.rows}
    assert by["a"]["status"] == "complete"
    assert (
        by["b"]["status"] == "failed"
        and "target 'b' (http://127.0.0.1:9) does not answer" in by["b"]["reason"]
    )
    md = build([res.out])["markdown"]
    assert "r0 failed: target 'b'" in md


def find(exp, slo: str, **kw):  # type: ignore[no-untyped-def]
    """``find_capacity`` in the experiment's tree, with its keyword arguments."""
    from agent_replay.replay.sweep.capacity import find_capacity, parse_slo
    from agent_replay.replay.sweep.runner import _prepare
    from agent_replay.replay.sweep.targets import Servers

    out, rows = _prepare(exp, True)
    with Servers(exp.seed) as servers:
        return find_capacity(exp, parse_slo(slo), rows=rows, out=out, servers=servers, **kw)


def test_capacity_search_and_cli(
    tmp_path: Path, exp_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        exp_file.read_text()
        .replace("points = [1, 3]", "points = [1, 4]")
        .replace("repeats = 2", "repeats = 1")
    )
    text = text.replace('[[targets]]\nname = "b"\nsim = "fast"\n', "")
    exp_file.write_text(text)
    exp = load_experiment(exp_file)
    # met everywhere: the top is doubled (twice here) looking for a load that misses it
    caps = find(exp, "p90_tps>=1,ttft_p99<=60s", expand=2)
    assert caps[0].capacity == 16.0 and caps[0].first_fail is None
    assert [p.point for p in caps[0].probes] == [1.0, 4.0, 8.0, 16.0]
    assert "the highest point probed, so capacity is at least this" in caps[0].line(exp.axis)
    # nothing meets an impossible SLO; the lowest point is the only probe needed
    caps = run_capacity(exp, "ttft_p99<=0.001ms", force=True)
    assert caps[0].capacity is None and [p.point for p in caps[0].probes] == [1.0, 4.0]
    assert (Path(exp.output) / "capacity.md").read_text().startswith("# Capacity at SLO")
    # the CLI: bad SLO is one line, exit 2
    assert main(["sweep", str(exp_file), "--find-capacity", "--slo", "p90_tps>>1"]) == 2
    assert "--slo: 'p90_tps>>1'" in capsys.readouterr().err
    # the CLI's search (every probe already run, so resumed) writes the page too
    assert main(["sweep", str(exp_file), "--find-capacity", "--slo", "ttft_p99<=0.001ms"]) == 0
    wrote = capsys.readouterr().out
    assert "capacity.md" in wrote and "report.html" in wrote
    if importlib.util.find_spec("bokeh") is not None:
        page = (Path(exp.output) / "report.html").read_text()
        assert "<h2>Capacity</h2>" in page
    assert main(["sweep", str(exp_file), "--report-only"]) == 0
    assert "frontier.md" in capsys.readouterr().out
    # reindex: figures recomputed from the run folders, with the prices now in the file
    exp_file.write_text(
        exp_file.read_text().replace(
            "[[targets]]",
            "[prices]\ninput_hit = 0.1\ninput_miss = 0.5\noutput = 2.0\n[[targets]]",
            1,
        )
    )
    assert main(["sweep", str(exp_file), "--report-only", "--reindex"]) == 0
    rows = pq.read_table(Path(exp.output) / "index.parquet").to_pylist()
    assert rows and all(r["revenue_per_gpu_hour"] > 0 for r in rows if r["status"] == "complete")


README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_capacity_example_finds_a_capacity(tmp_path: Path) -> None:
    """The README's --find-capacity example, as written there (experiment file and SLO),
    ends on a load that meets the SLO below one that does not: a capacity, not the top of
    the range."""
    import re
    import shlex

    text = README.read_text()
    m = re.search(r"agent-replay sweep (\S+) --find-capacity(?: \\\n\s*)? --slo '([^']+)'", text)
    if m is None:
        m = re.search(r"agent-replay sweep (\S+) --find-capacity", text)
    assert m is not None, "no --find-capacity example in the README"
    exp = load_experiment(README.parent / m.group(1), output=str(tmp_path / "cap"))
    slo = m.group(2) if m.lastindex == 2 else exp.slo
    assert slo and shlex.split(slo)
    caps = run_capacity(exp, slo)
    for c in caps:
        assert c.capacity is not None and c.first_fail is not None, c.line(exp.axis)
        assert c.capacity < c.first_fail
        assert c.crossing is not None, c.line(exp.axis)  # the answer with its interval
        x, lo, hi = c.crossing
        assert lo <= x <= hi and c.capacity <= x <= c.first_fail
    assert "host contention" in (tmp_path / "cap" / "capacity.md").read_text()
