"""Fixtures shared by the suite. Every pytest process imports every test module to collect
it, so a module imports a library that is slow to import (the openai and anthropic SDKs:
1-3 s each) inside the tests that use it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("AGENT_REPLAY_SHARED", ROOT.parent / "shared"))
SHARED_DATA = SHARED / "data"


@pytest.fixture
def shared_data() -> Path:
    """../shared/data, or skip when this checkout has none beside it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real traces not available: {SHARED_DATA} does not exist")
    return SHARED_DATA


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} does not exist")
    return SHARED
