"""Fixtures shared by the replay client tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.replay.rawserver import RawServer


@pytest.fixture
async def raw() -> AsyncIterator[list[RawServer]]:
    """Scripted loopback servers a test starts (``RawServer``); stopped after the test."""
    servers: list[RawServer] = []
    yield servers
    for s in servers:
        await s.stop()
