"""A replay against the simulated engine on a virtual clock: a prediction, not a measurement.

``agent-replay run TRACE --engine sim:PROFILE --virtual`` builds the plan as a real run does
(``replay.run.load_and_validate``) and runs the real drivers (``replay.driver.Driver``,
``replay.agentx.AgentXDriver``: trees, AgentX lanes, warm-ups, idle caps) on a
``FakeClock``. The transport hands each request straight to the simulated engine's core
(``engines.sim.core.EngineCore``), whose steps take the profile's time on that clock: no
sockets, no sleeping. The rows go through the real ``ResultWriter`` and run.json through
``replay.runrecord``, so ``report``, ``compare`` and ``frontier`` read the folder as any
other; run.json's ``prediction`` says it is one and from which profile.

``--gpus N`` (N > 1) predicts N data-parallel copies of the profile's one-GPU deployment
with session-affine routing; run.json's ``prediction.extrapolation`` says so and gives the
rule: nothing was fitted on N GPUs.

The engine's prefix cache is fed block hashes made from the plan's (equal trace blocks of
the same prompt clone hash equal), so it sees the sharing the trace has.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent_replay.engines.sim.core import EngineCore, SimRequest
from agent_replay.engines.sim.profile import SimProfile
from agent_replay.errors import InputError
from agent_replay.replay.clock import FakeClock
from agent_replay.replay.config import RunConfig
from agent_replay.replay.driver import Driver
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.plan import Plan, PlannedRequest
from agent_replay.replay.results import ResultWriter
from agent_replay.replay.runrecord import RunSummary, finish, merge, run_meta, write_run_json
from agent_replay.replay.target import TargetInfo
from agent_replay.replay.worker import WorkerSummary

T0_NS = 1_000_000_000_000
"""The virtual clock's t0 (any value: rows are stored relative to it)."""
TICK_NS = 1_000_000_000


def parse_engine(spec: str) -> str:
    """``sim:PROFILE`` -> PROFILE (a shipped profile's name or a JSON file)."""
    kind, _, profile = spec.partition(":")
    if kind != "sim" or not profile:
        raise InputError(
            f"--engine {spec!r}: expected sim:PROFILE (a shipped profile or a "
            "profile JSON written by 'engines sim-fit')"
        )
    return profile


class _Replica:
    """One engine of the deployment: its core, its loop's task and wake-up."""

    def __init__(self, profile: SimProfile) -> None:
        self.core = EngineCore(profile)
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class SimTransport:
    """The replay's transport to in-process simulated engines on ``clock``: ``replicas``
    data-parallel copies, each session's requests always on the same one (a stable hash of
    its session key)."""

    def __init__(
        self, clock: FakeClock, profile: SimProfile, block_size: int, replicas: int = 1
    ) -> None:
        self.clock = clock
        self.profile = profile
        self.replicas = [_Replica(profile) for _ in range(max(1, replicas))]
        self.block_size = block_size
        self.chunks = 0
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._seq = 0

    def prompt_hashes(self, q: PlannedRequest) -> list[int]:
        """The engine's chained block hashes of the prompt (its full blocks), made from the
        plan's block hashes: the engine's block i lies in the trace's block
        ``i * engine_block // trace_block``; equal trace blocks of the same prompt clone (the
        shared prefix of every clone) give equal hashes, as equal token ids would."""
        bs = self.profile.block_size
        out: list[int] = []
        prev = 0
        hashes = q.hash_ids
        for i in range(q.input_tokens // bs):
            j = i * bs // self.block_size
            if j < len(hashes):
                clone = 0 if j < q.shared_blocks else q.blocks_clone
                key = (prev, hashes[j], clone, i)
            else:  # beyond the trace's hashes: unique to this request
                key = (prev, -1, self._seq, i)
            prev = hash(key)
            out.append(prev)
        return out

    async def prepare(self, q: PlannedRequest, request_id: str, session_key: str) -> Any:
        return q, self.replicas[zlib.crc32(session_key.encode()) % len(self.replicas)]

    async def send(self, prepared: Any, rec: RequestRecord) -> None:
        q, replica = prepared
        now = self.clock.now_ns()
        rec.sent_ns = rec.headers_ns = now
        self._seq += 1
        req = SimRequest(
            request_id=str(self._seq),
            prompt_ids=range(q.input_tokens),
            max_tokens=max(1, q.output_tokens),
            ignore_eos=True,
            seed=self._seq,
            arrival_ns=now,
        )
        if self.profile.prefix_cache_blocks > 0:
            req.hashes = self.prompt_hashes(q)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[id(req)] = fut
        req.sink = rec
        replica.core.add(req)
        rec.prompt_tokens = req.prompt_len
        if replica.task is None:
            replica.task = asyncio.get_running_loop().create_task(self._engine(replica))
        replica.wake.set()
        await fut
        rec.cached_tokens = max(0, req.cached_tokens)
        rec.completion_tokens = req.num_generated
        if rec.chunk_ns:
            rec.first_token_ns = rec.chunk_ns[0]
            rec.end_ns = rec.chunk_ns[-1]
        rec.http_status = 200

    async def _engine(self, replica: _Replica) -> None:
        core, clock, wake_ev = replica.core, self.clock, replica.wake
        while True:
            if not core.has_work():
                wake_ev.clear()
                await wake_ev.wait()
                continue
            now = clock.now_ns()
            res = core.step(now)
            if res is None:
                wake = core.next_wakeup_ns()
                wake_ev.clear()
                if wake is None:
                    await wake_ev.wait()
                else:
                    await clock.sleep_until(max(wake, now + 1))
                continue
            await clock.sleep_until(res.end_ns)
            for em in res.emissions:
                rec: RequestRecord = em.request.sink
                rec.chunk_ns.append(res.end_ns)
                rec.chunk_tokens.append(len(em.token_ids))
                self.chunks += 1
                if em.finish_reason is not None:
                    fut = self._waiters.pop(id(em.request))
                    if not fut.done():
                        fut.set_result(None)

    def close(self) -> None:
        for r in self.replicas:
            if r.task is not None:
                r.task.cancel()


def _driver(
    config: RunConfig, plan: Plan, transport: SimTransport, clock: FakeClock, on_record: Any
) -> Driver:
    duration = None if config.duration_s is None else int(config.duration_s * 1e9)
    if config.timing == "agentx":
        from agent_replay.replay.agentx import AgentXDriver

        ax = config.agentx
        return AgentXDriver(
            plan,
            transport,
            clock,
            t0_ns=T0_NS,
            on_record=on_record,
            lanes=config.concurrency or 1,
            first_lane=0,
            seed=ax.seed if ax.seed is not None else (config.salt or 0),
            worker=0,
            run_id=config.run_id,
            duration_ns=duration,
            start_range=(ax.start_min, ax.start_max),
            warmup_requests=ax.warmup_requests,
            idle_cap_ns=None if ax.idle_cap_s is None else int(ax.idle_cap_s * 1e9),
            tree_idle_cap_ns=None if ax.tree_idle_cap_s is None else int(ax.tree_idle_cap_s * 1e9),
            overflow_rule=ax.overflow_rule,
        )
    return Driver(
        plan,
        transport,
        clock,
        mode=config.timing,
        t0_ns=T0_NS,
        on_record=on_record,
        worker=0,
        run_id=config.run_id,
        concurrency=config.concurrency,
        duration_ns=duration,
        warmup_ns=int(config.warmup_s * 1e9),
    )


def replay_virtual(
    config: RunConfig, plan: Plan, profile: SimProfile, out: Path, replicas: int = 1
) -> tuple[WorkerSummary, float, float]:
    """Run the plan on the simulated engine in virtual time; rows go to ``out``. Returns the
    worker's summary and this host's wall and CPU seconds for it."""
    wall0, cpu0 = time.monotonic_ns(), time.process_time()
    clock = FakeClock(start_ns=T0_NS - 1_000_000_000)
    summary = WorkerSummary(shard=0, total=plan.n_requests)
    writer = ResultWriter(out, T0_NS, 0, retry_s=config.write_retry_s)

    def on_record(rec: RequestRecord) -> None:
        writer.add(rec)
        if rec.status == "ok":
            summary.ok += 1
        else:
            kind = rec.error_kind or "unknown"
            summary.errors[kind] = summary.errors.get(kind, 0) + 1
        summary.output_tokens += sum(rec.chunk_tokens)

    transport = SimTransport(clock, profile, plan.block_size, replicas)
    driver = _driver(config, plan, transport, clock, on_record)

    async def main() -> None:
        async def tick() -> None:
            while True:
                await clock.pause(TICK_NS)
                writer.tick(clock.now_ns())

        ticker = asyncio.get_running_loop().create_task(tick())
        try:
            await driver.run()
        finally:
            ticker.cancel()
            transport.close()

    try:
        clock.run(main())
    finally:
        writer.close()
    summary.sent, summary.done, summary.skipped = driver.sent, driver.done, driver.skipped
    summary.schedule_lag = driver.schedule_lag.tobytes()
    summary.chunks = transport.chunks
    summary.idle_skipped_ns = getattr(driver, "idle_skipped_ns", 0)
    summary.overflow_dropped = getattr(driver, "dropped", 0)
    summary.unwritten, summary.write_error = writer.unwritten, writer.error
    # the load generator is not part of a prediction: its virtual time is the run's wall,
    # and it spent no CPU on that clock (the host's own cost is in run.json's prediction)
    summary.wall_s = (clock.now_ns() - T0_NS) / 1e9
    summary.cpu_s = summary.cpu_run_s = 0.0
    return summary, (time.monotonic_ns() - wall0) / 1e9, time.process_time() - cpu0


def run_virtual(config: RunConfig, engine: str) -> RunSummary:
    """``agent-replay run TRACE --engine sim:PROFILE --virtual``: the whole run, run.json
    included, in virtual time."""
    from agent_replay.replay.folderlock import acquire
    from agent_replay.replay.run import _sha256, load_and_validate

    profile_name = parse_engine(engine)
    profile = SimProfile.load(profile_name)
    config = replace(
        config, target="http://virtual.invalid", model=config.model or profile.model_name
    )
    config.check()
    plan = load_and_validate(config)
    out = Path(config.output or ".")
    lock = acquire(out, config.force)
    try:
        info = TargetInfo(
            url=config.target,
            models=[profile.model_name],
            max_model_len=profile.max_model_len,
            has_metrics=False,
        )
        config = replace(config, t0_ns=T0_NS, workers=1)
        meta = run_meta(config, info, plan, _sha256(config.trace), T0_NS, time.time_ns(), "running")
        fit = profile.extra.get("fit") or {}
        prediction: dict[str, Any] = {
            "engine": "sim",
            "profile": profile_name,
            "profile_name": profile.name,
            "clock": "virtual",
            "fitted_on": fit.get("fitted_on"),
            "note": "a prediction of the simulated engine on a virtual clock, not a measurement",
        }
        meta.extra["prediction"] = prediction
        gpus = config.gpus or 1
        meta.gpus, meta.gpus_source = gpus, "--gpus" if config.gpus else "default"
        if gpus > 1:
            prediction["extrapolation"] = {
                "gpus": gpus,
                "replicas": gpus,
                "rule": f"{gpus} data-parallel copies of the profile's one-GPU deployment, each "
                "session's requests on one copy (a stable hash of its session key); "
                "no copy shares KV or prefix cache with another. Not fitted on "
                f"{gpus} GPUs: an extrapolation",
            }
        write_run_json(out, meta)
        ws, host_wall, host_cpu = replay_virtual(config, plan, profile, out, replicas=gpus)
        prediction["host_wall_s"] = round(host_wall, 3)
        prediction["host_cpu_s"] = round(host_cpu, 3)
        summary = merge(str(out), [ws], config, False)
        finish(out, meta, summary, config.timing, config)
        return summary
    finally:
        lock.release()
