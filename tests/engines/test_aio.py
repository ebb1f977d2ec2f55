"""agent_replay.engines.aio.run: the one runner every process entry point uses."""

from __future__ import annotations

import asyncio

import pytest

from agent_replay.engines import aio


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_runs_on_the_loop_kind_asked_for():
    assert aio.run(_loop_module(), "asyncio").startswith("asyncio")
    pytest.importorskip("uvloop")
    assert aio.run(_loop_module(), "uvloop").startswith("uvloop")


def test_an_unknown_kind_fails_before_anything_runs():
    coro = _loop_module()
    with pytest.raises(ValueError, match="unknown event loop kind 'trio'"):
        aio.run(coro, "trio")
    coro.close()


def test_tasks_left_running_are_cancelled_and_the_loop_closed():
    seen: list[str] = []
    loops: list[asyncio.AbstractEventLoop] = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> int:
        loops.append(asyncio.get_running_loop())
        asyncio.get_running_loop().create_task(forever())
        await asyncio.sleep(0)
        return 7

    assert aio.run(main(), "asyncio") == 7
    assert seen == ["cancelled"]
    assert loops[0].is_closed()
