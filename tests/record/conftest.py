from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_replay.replay.record import Recorder
from tests.record.upstream import Upstream


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    async with Upstream() as up:
        yield up


@pytest.fixture
async def recorder(upstream: Upstream, tmp_path: Path) -> AsyncIterator[Recorder]:
    rec = Recorder(upstream.url, "127.0.0.1:0", tmp_path / "trace", flush_interval_s=60)
    await rec.start()
    try:
        yield rec
    finally:
        await rec.stop()
