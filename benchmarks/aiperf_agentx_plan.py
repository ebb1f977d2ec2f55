"""AIPerf's own start plan of an agentic replay run, computed by AIPerf's code (run with the
AIPerf venv's Python; see scripts/setup-aiperf.sh): its ``TrajectorySource`` samples each
lane's trace and t* as a run with the same dataset, concurrency, seed and start range does,
and its ``AgenticReplayStrategy`` plans the warm-up and the first profiling sends; the
calls they would make to the credit issuer and the scheduler are recorded, not sent.

    AIPERF_PYTHON benchmarks/aiperf_agentx_plan.py CACHE_DIR --concurrency N --seed S
        [--start-range LO,HI] [--recycles K]

CACHE_DIR: the dataset cache an AIPerf run leaves (``AIPERF_DATASET_MMAP_CACHE_DIR``; the
newest manifest in it is read). Prints JSON: per lane its trace, t* (ms) and the requests
(``[trace, outer, inner]``) AIPerf sends as warm-ups and as the first profiling sends, each
with its offset (ms after its phase starts, before the system idle cap moves it); and the
next K traces the lanes recycle into, in the order the sampler hands them out.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import sys
from pathlib import Path
from typing import Any


class _Issuer:
    """Records the turns the strategy would issue; ``schedule_later`` pairs the last one
    with its delay."""

    def __init__(self) -> None:
        self.turns: list[list[Any]] = []  # [turn, offset s]

    def issue_credit(self, turn: Any) -> Any:
        self.turns.append([turn, 0.0])

        async def done() -> bool:
            return True
        return done()

    async def acquire_lane_credit(self, *args: Any, **kwargs: Any) -> None:
        return None

    def signal_sending_complete(self) -> None:
        return None


class _Scheduler:
    def __init__(self, issuer: _Issuer) -> None:
        self.issuer = issuer

    def schedule_later(self, delay_s: float, coro: Any) -> None:
        coro.close()
        self.issuer.turns[-1][1] = delay_s

    def set_drain_observer(self, observer: Any) -> None:
        return None


def _keys(source: Any, issued: list[list[Any]]) -> list[dict[str, Any]]:
    out = []
    for turn, delay_s in issued:
        t = source.get_metadata(turn.conversation_id).turns[turn.turn_index]
        out.append({"key": [t.source_trace_id, t.source_outer_idx, t.source_inner_idx],
                    "offset_ms": delay_s * 1000.0})
    return out


def plan(cache: Path, concurrency: int, seed: int, start_range: tuple[float, float] | None,
         recycles: int) -> dict[str, Any]:
    from aiperf.common.enums import CreditPhase
    from aiperf.common.models import DatasetMetadata
    from aiperf.dataset.dataset_samplers import SequentialSampler
    from aiperf.plugin.enums import TimingMode
    from aiperf.timing.config import CreditPhaseConfig
    from aiperf.timing.strategies.agentic_replay import AgenticReplayStrategy
    from aiperf.timing.trajectory_source import TrajectorySource

    manifests = sorted(glob.glob(str(cache / "*" / "manifest.json")), key=os.path.getmtime)
    if not manifests:
        raise SystemExit(f"aiperf_agentx_plan: no dataset manifest under {cache}")
    meta = DatasetMetadata.model_validate_json(
        json.loads(Path(manifests[-1]).read_text())["dataset_metadata_json"])
    if str(meta.sampling_strategy) not in ("sequential", "DatasetSamplingStrategy.SEQUENTIAL"):
        raise SystemExit(f"aiperf_agentx_plan: sampling {meta.sampling_strategy}, not sequential")
    roots = [c.conversation_id for c in meta.conversations if getattr(c, "is_root", True)]
    lo, hi = start_range if start_range is not None else (0.0, 1.0)  # the MVP scenario's
    source = TrajectorySource(dataset_metadata=meta, dataset_sampler=SequentialSampler(roots),
                              concurrency=concurrency, random_seed=seed, start_min_ratio=lo,
                              start_max_ratio=hi, cache_bust_enabled=True)
    lanes: list[dict[str, Any]] = []
    for lane, tr in enumerate(source.trajectories):
        assert tr.snapshot is not None, f"lane {lane}: {tr.conversation_id} has no timestamps"
        lanes.append({"lane": lane, "trace": tr.conversation_id, "t_star_ms": tr.snapshot.t_star_ms})
    for phase in (CreditPhase.WARMUP, CreditPhase.PROFILING):
        issuer = _Issuer()
        config = CreditPhaseConfig(phase=phase, timing_mode=TimingMode.AGENTIC_REPLAY,
                                   concurrency=concurrency)
        strategy = AgenticReplayStrategy(
            config=config, conversation_source=source, scheduler=_Scheduler(issuer),
            stop_checker=None, credit_issuer=issuer, lifecycle=None)
        if phase == CreditPhase.WARMUP:
            asyncio.run(strategy._execute_warmup())
            warm = _keys(source, issuer.turns)
            # the warm-up's turns go lane by lane, stream by stream (its pass 1)
            it = iter(warm)
            for lane, tr in zip(lanes, source.trajectories, strict=True):
                n = sum(1 for s in tr.snapshot.states if s.warmup_turn_index is not None)
                lane["warmups"] = [next(it) for _ in range(n)]
        else:
            for lane, tr in zip(lanes, source.trajectories, strict=True):
                issuer.turns.clear()
                asyncio.run(strategy._dispatch_snapshot_for_profiling(tr, lane["lane"]))
                lane["first"] = _keys(source, issuer.turns)
    return {"lanes": lanes,
            "recycles": [source.next_recycle_conversation_id() for _ in range(recycles)]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cache", type=Path)
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--start-range", default=None, metavar="LO,HI")
    ap.add_argument("--recycles", type=int, default=0)
    args = ap.parse_args()
    sr = None
    if args.start_range:
        a, b = (float(x) for x in args.start_range.split(","))
        sr = (a, b)
    json.dump(plan(args.cache, args.concurrency, args.seed, sr, args.recycles), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
