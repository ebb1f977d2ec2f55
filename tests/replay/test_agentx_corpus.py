"""The whole local AgentX corpus (../shared/data/weka and weka-corpus, 217 traces) planned by
us and by AIPerf 0.13's own code (its weka loader, trajectory source and agentic replay
strategy, run in its venv without a server: benchmarks/aiperf_agentx_plan.py), compared
request by request and lane by lane (benchmarks/agentx_schedule_check.py): no difference.
Needs the AIPerf venv (scripts/setup-aiperf.sh) and ../shared/data."""

from __future__ import annotations

import pytest

from benchmarks import agentx_schedule_check as sc
from benchmarks import bench_agentx_aiperf as bench

pytestmark = [pytest.mark.timing, pytest.mark.slow, pytest.mark.shared_data]


@pytest.mark.timeout(900)
def test_every_trace_planned_as_aiperf_plans_it() -> None:
    if not (bench.AIPERF_VENV / "bin" / "python").exists():
        pytest.skip(
            f"no AIPerf venv at {bench.AIPERF_VENV}: run scripts/setup-aiperf.sh, which needs PyPI"
        )
    missing = [str(d) for d in sc.CORPUS if not d.is_dir()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not found (../shared/data)")
    res = sc.corpus_check(list(sc.CORPUS), list(sc.CONCURRENCIES))
    assert len(res["traces"]) == sum(1 for d in sc.CORPUS for _ in d.glob("*.json")) >= 217
    # every rule and start compared, none differs
    assert res["requests"] > 16_000 and set(res["by_kind"]) == {
        "first",
        "next",
        "join",
        "child-first",
        "child-at-send",
    }
    assert res["barriers"] > 0  # the recorded-interval barriers are among what is compared
    for c in sc.CONCURRENCIES:
        st = res["starts"][str(c)]
        assert len(st["corpus"]["lanes"]) == c and st["alone"]["traces"] == len(res["traces"])
    problems = {
        k: res[k][:5]
        for k in (
            "only_one_side",
            "waits_differ",
            "barriers_differ",
            "branches_differ",
            "kinds_differ",
            "delays_differ",
        )
        if res[k]
    }
    problems.update(
        {
            f"starts c={c}": (st["corpus"]["problems"] + st["alone"]["problems"])[:5]
            for c, st in res["starts"].items()
            if st["corpus"]["problems"] or st["alone"]["problems"]
        }
    )
    assert sc.differences(res) == 0, problems
