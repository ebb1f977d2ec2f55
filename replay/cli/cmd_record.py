"""CLI commands for this area (registered by replay.cli)."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    """Add this area's parsers to ``sub``."""
