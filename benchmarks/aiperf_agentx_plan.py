"""AIPerf's own plan of an agentic replay run, computed by AIPerf's code (run with the
AIPerf venv's Python; see scripts/setup-aiperf.sh): its ``TrajectorySource`` samples each
lane's trace and t* as a run with the same dataset, concurrency, seed and start range does,
and its ``AgenticReplayStrategy`` plans the warm-up and the first profiling sends; the
calls they would make to the credit issuer and the scheduler are recorded, not sent.

    AIPERF_PYTHON benchmarks/aiperf_agentx_plan.py CACHE_DIR --concurrency N --seed S
        [--start-range LO,HI] [--recycles K]
    AIPERF_PYTHON benchmarks/aiperf_agentx_plan.py --traces DIR [DIR ...] --concurrency N
        [--concurrency M ...] --seed S [--start-range LO,HI] [--recycles K] [--per-trace]

CACHE_DIR: the dataset cache an AIPerf run leaves (``AIPERF_DATASET_MMAP_CACHE_DIR``; the
newest manifest in it is read). ``--traces``: the dataset is built here from the weka trace
files of the folders (taken together, in file-name order, as one folder given to
``--input-file``) by AIPerf's own weka loader (``WekaTraceLoader``, configured by its
``profile`` command line for the ``inferencex-agentx-mvp`` scenario), with no server and no
prompt text: the loader's text synthesis (``ConversationReconstructor``) is replaced by one
that writes no text, which leaves every timing, branch and dependency field as a run builds
it. ``--per-trace``: also each trace alone as the dataset (so every trace gets its lanes).

Prints JSON: per concurrency, per lane its trace, t* (ms) and the requests
(``[trace, outer, inner]``) AIPerf sends as warm-ups and as the first profiling sends, each
with its offset (ms after its phase starts, before the system idle cap moves it); and the
next K traces the lanes recycle into, in the order the sampler hands them out. With
``--traces``, also the dataset metadata (``metadata``: the ``dataset_metadata_json`` a run
would cache).
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
        out.append(
            {
                "key": [t.source_trace_id, t.source_outer_idx, t.source_inner_idx],
                "offset_ms": delay_s * 1000.0,
            }
        )
    return out


def cached_metadata(cache: Path) -> Any:
    """The dataset metadata of the newest manifest in an AIPerf dataset cache."""
    from aiperf.common.models import DatasetMetadata

    manifests = sorted(glob.glob(str(cache / "*" / "manifest.json")), key=os.path.getmtime)
    if not manifests:
        raise SystemExit(f"aiperf_agentx_plan: no dataset manifest under {cache}")
    return DatasetMetadata.model_validate_json(
        json.loads(Path(manifests[-1]).read_text())["dataset_metadata_json"]
    )


class _NoText:
    """Stands in for the weka loader's ``ConversationReconstructor``: no prompt text (none
    of the plan's fields depends on it)."""

    class _Delta:
        delta_messages: list[Any] = []
        reset_context = False

    def __init__(self, **kwargs: Any) -> None:
        return None

    def init_turn_0(self, **kwargs: Any) -> None:
        return None

    def advance_turn(self, **kwargs: Any) -> None:
        return None

    def turn_delta(self) -> Any:
        return self._Delta()


class _NoPrompts:
    """Stands in for the loader's prompt generator, which only the text synthesis uses."""

    class _Rng:
        def set_trace_id(self, trace_id: str) -> None:
            return None

    _cache: dict[Any, Any] = {}
    _hash_id_corpus_rng = _Rng()
    _bpe_stable_terminator_tokens: list[int] = []
    tokenizer = None


def built_metadata(folders: list[Path], seed: int) -> Any:
    """The dataset metadata AIPerf's weka loader builds from the trace files of ``folders``
    (one folder of links to them all, as ``--input-file`` takes one), configured as
    ``aiperf profile --scenario inferencex-agentx-mvp --custom-dataset-type weka_trace``
    configures it."""
    import tempfile

    os.environ["AIPERF_DATASET_WEKA_PARALLEL_WORKERS"] = "1"  # in-process, before AIPerf reads it
    import aiperf.dataset.loader.weka_synth_buf as synth
    from aiperf.cli_commands.profile import app
    from aiperf.cli_runner import _make_benchmark_run
    from aiperf.common.models import DatasetMetadata
    from aiperf.config.flags.resolver import resolve_config
    from aiperf.config.loader import build_benchmark_plan
    from aiperf.dataset.loader.weka_trace import WekaTraceLoader

    with tempfile.TemporaryDirectory() as tmp:
        for folder in folders:
            for f in sorted(folder.glob("*.json")):
                link = Path(tmp) / f.name
                if link.exists():
                    raise SystemExit(f"aiperf_agentx_plan: {f.name} is in two of the folders")
                link.symlink_to(f.resolve())
        argv = [
            "--scenario",
            "inferencex-agentx-mvp",
            "--unsafe-override",
            "--url",
            "localhost:1",
            "--model",
            "m",
            "--endpoint-type",
            "chat",
            "--custom-dataset-type",
            "weka_trace",
            "--input-file",
            tmp,
            "--concurrency",
            "1",
            "--random-seed",
            str(seed),
            "--ui",
            "none",
            "--benchmark-duration",
            "1800",
        ]
        _, bound, _ = app.parse_args(argv, exit_on_error=False, print_error=True)
        cfg = build_benchmark_plan(resolve_config(bound.kwargs["cli_config"], None)).configs[0]
        run = _make_benchmark_run(cfg, random_seed=seed)
        from aiperf.common.environment import Environment

        assert Environment.DATASET.WEKA_PARALLEL_WORKERS == 1
        synth.ConversationReconstructor = _NoText  # type: ignore[misc,assignment]
        loader = WekaTraceLoader(filename=tmp, run=run, prompt_generator=_NoPrompts())  # type: ignore[arg-type]
        conversations = loader.convert_to_conversations(loader.load_dataset())
    return DatasetMetadata(
        conversations=[c.metadata() for c in conversations],
        sampling_strategy=loader.get_preferred_sampling_strategy(),
    )


def trace_metadata(meta: Any, trace: str) -> Any:
    """``meta`` cut to one trace: its root and its children."""
    from aiperf.common.models import DatasetMetadata

    convs = [
        c
        for c in meta.conversations
        if c.conversation_id == trace or c.conversation_id.startswith(trace + "::")
    ]
    return DatasetMetadata(conversations=convs, sampling_strategy=meta.sampling_strategy)


def plan(
    cache: Path | Any,
    concurrency: int,
    seed: int,
    start_range: tuple[float, float] | None,
    recycles: int,
) -> dict[str, Any]:
    """The start plan for ``concurrency`` lanes: ``cache`` an AIPerf dataset cache folder,
    or dataset metadata."""
    from aiperf.common.enums import CreditPhase
    from aiperf.dataset.dataset_samplers import SequentialSampler
    from aiperf.plugin.enums import TimingMode
    from aiperf.timing.config import CreditPhaseConfig
    from aiperf.timing.strategies.agentic_replay import AgenticReplayStrategy
    from aiperf.timing.trajectory_source import TrajectorySource

    meta = cached_metadata(cache) if isinstance(cache, Path) else cache
    if str(meta.sampling_strategy) not in ("sequential", "DatasetSamplingStrategy.SEQUENTIAL"):
        raise SystemExit(f"aiperf_agentx_plan: sampling {meta.sampling_strategy}, not sequential")
    roots = [c.conversation_id for c in meta.conversations if getattr(c, "is_root", True)]
    lo, hi = start_range if start_range is not None else (0.0, 1.0)  # the MVP scenario's
    source = TrajectorySource(
        dataset_metadata=meta,
        dataset_sampler=SequentialSampler(roots),
        concurrency=concurrency,
        random_seed=seed,
        start_min_ratio=lo,
        start_max_ratio=hi,
        cache_bust_enabled=True,
    )
    lanes: list[dict[str, Any]] = []
    for lane, tr in enumerate(source.trajectories):
        assert tr.snapshot is not None, f"lane {lane}: {tr.conversation_id} has no timestamps"
        lanes.append(
            {"lane": lane, "trace": tr.conversation_id, "t_star_ms": tr.snapshot.t_star_ms}
        )
    for phase in (CreditPhase.WARMUP, CreditPhase.PROFILING):
        issuer = _Issuer()
        config = CreditPhaseConfig(
            phase=phase, timing_mode=TimingMode.AGENTIC_REPLAY, concurrency=concurrency
        )
        strategy = AgenticReplayStrategy(
            config=config,
            conversation_source=source,
            scheduler=_Scheduler(issuer),
            stop_checker=None,
            credit_issuer=issuer,
            lifecycle=None,
        )
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
    return {
        "lanes": lanes,
        "recycles": [source.next_recycle_conversation_id() for _ in range(recycles)],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cache", type=Path, nargs="?")
    ap.add_argument("--traces", type=Path, nargs="+", metavar="DIR")
    ap.add_argument("--concurrency", type=int, action="append", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--start-range", default=None, metavar="LO,HI")
    ap.add_argument("--recycles", type=int, default=0)
    ap.add_argument("--per-trace", action="store_true")
    args = ap.parse_args()
    sr = None
    if args.start_range:
        a, b = (float(x) for x in args.start_range.split(","))
        sr = (a, b)
    if args.traces is None:
        if args.cache is None or len(args.concurrency) != 1:
            ap.error("give CACHE_DIR and one --concurrency, or --traces")
        json.dump(plan(args.cache, args.concurrency[0], args.seed, sr, args.recycles), sys.stdout)
        return 0
    meta = built_metadata(args.traces, args.seed)
    out: dict[str, Any] = {"metadata": json.loads(meta.model_dump_json()), "starts": {}}
    roots = [c.conversation_id for c in meta.conversations if c.is_root]
    for c in args.concurrency:
        one = {"corpus": plan(meta, c, args.seed, sr, args.recycles)}
        if args.per_trace:
            one["traces"] = {t: plan(trace_metadata(meta, t), c, args.seed, sr, 0) for t in roots}
        out["starts"][str(c)] = one
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
