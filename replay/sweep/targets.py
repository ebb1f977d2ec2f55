"""A sweep's targets as servers that can be started, used and stopped: a URL (already
running: only checked), a simulated-engine profile (``engines.sim.SimProcess``) or a launch
profile (``replay.launch.launched``, a local vLLM). ``Servers`` keeps each target's server
for the lifetime its ``Target`` asks for."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from agent_replay.errors import AgentReplayError, TargetError
from agent_replay.replay.sweep.experiment import Target
from agent_replay.replay.target import probe


class Running:
    """One started target: its URL, what is known about the server (for run.json), and how
    long starting it took."""

    def __init__(
        self, url: str, info: dict[str, Any], stack: contextlib.ExitStack, start_s: float
    ) -> None:
        self.url, self.info, self._stack, self.start_s = url, info, stack, start_s

    def stop(self) -> None:
        self._stack.close()


def start(target: Target, seed: int = 0) -> Running:
    """Start (or check) ``target``; a target that does not answer is a TargetError naming it."""
    t0 = time.monotonic()
    stack = contextlib.ExitStack()
    info: dict[str, Any]
    try:
        if target.kind == "url":
            url, info = target.spec, {"kind": "url"}
            try:
                asyncio.run(probe(url))
            except AgentReplayError as exc:
                raise TargetError(
                    f"target {target.name!r} ({url}) does not answer: {exc}"
                ) from None
        elif target.kind == "virtual":  # in-process, on a virtual clock: nothing to start
            from agent_replay.engines.sim.profile import SimProfile

            SimProfile.load(target.spec)  # a bad profile: one line now
            url, info = f"sim:{target.spec}", {"kind": "virtual", "profile": target.spec}
        elif target.kind == "sim":
            from agent_replay.engines.sim import SimProcess

            sim = stack.enter_context(
                SimProcess(target.spec, seed=seed, extra_args=target.sim_args)
            )
            url = sim.url
            info = {"kind": "sim", "profile": target.spec, "argv": sim.command()}
        else:
            from agent_replay.replay.launch import launched

            url, linfo = stack.enter_context(launched(target.spec))
            info = {"kind": "launch", "spec": target.spec, **linfo}
    except BaseException:
        stack.close()
        raise
    return Running(url, info, stack, time.monotonic() - t0)


class Servers:
    """Started targets by name. ``get`` starts one on first use; ``release`` stops it when
    its lifetime is a visit; ``close`` stops everything."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.running: dict[str, Running] = {}
        self.start_s = 0.0

    def get(self, target: Target) -> Running:
        r = self.running.get(target.name)
        if r is None:
            r = start(target, self.seed)
            self.start_s += r.start_s
            self.running[target.name] = r
        return r

    def prestart(self, targets: list[Target]) -> None:
        """Start these targets at once, each in its own thread (start-up is mostly waiting
        for a child process); a target that fails here is tried again, and reported, by
        ``get`` when its first run comes."""
        import threading

        t0 = time.monotonic()
        started: dict[str, Running] = {}

        def one(t: Target) -> None:
            with contextlib.suppress(Exception):
                started[t.name] = start(t, self.seed)

        threads = [
            threading.Thread(target=one, args=(t,), daemon=True)
            for t in targets
            if t.name not in self.running
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.running.update(started)
        self.start_s += time.monotonic() - t0

    def release(self, target: Target) -> None:
        if target.lifetime == "visit":
            r = self.running.pop(target.name, None)
            if r is not None:
                r.stop()

    def drop(self, target: Target) -> None:
        r = self.running.pop(target.name, None)
        if r is not None:
            with contextlib.suppress(Exception):
                r.stop()

    def close(self) -> None:
        for name in list(self.running):
            r = self.running.pop(name)
            with contextlib.suppress(Exception):
                r.stop()

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
