"""``--timing agentx`` settings and the named presets that fill them (``--preset``).

The two presets reproduce AIPerf's scenarios (``src/aiperf/common/scenario/
inferencex_agentx_mvp.py`` in ai-dynamo/aiperf):

* ``inferencex-agentx``: AIPerf's ``agentx`` scenario, the one InferenceX AgentX runs:
  benchmark duration 3,600 s, trajectory start ratios 0.25-0.75, seed 42, failed request
  threshold 0.10, 10 warm-up requests per lane, trace idle gap cap 300 s; from the MVP
  scenario it inherits the 900 s minimum duration, the 10 s system idle gap cap and the
  0.95 profile metric coverage.
* ``aiperf-agentx-mvp``: AIPerf's ``inferencex-agentx-mvp``: duration 1,800 s (minimum
  900 s), start ratios 0-1, one warm-up turn (the prefix of the first measured turn),
  10 s system idle gap cap, metric coverage 0.95; no failure threshold of its own.

Explicit options override a preset's values; every resolved value is in run.json
(``options.agentx`` and ``options.duration_s``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from agent_replay.errors import InputError


@dataclass(frozen=True)
class AgentXSettings:
    preset: str | None = None
    start_min: float = 0.25
    start_max: float = 0.75
    """Range of the first play's start instant t*, as fractions of its session's time span."""
    warmup_requests: int = 0
    """Turns replayed back to back (one output token, flagged warm-up) after the warm-up of
    the first measured turn's prefix, before the measured play starts."""
    idle_cap_s: float | None = 10.0
    """System idle cap: nothing in flight idles at most this long (None: no cap)."""
    tree_idle_cap_s: float | None = None
    """Every recorded stretch where nothing of a session tree was in flight is shortened to
    at most this (AIPerf's trace idle gap cap; ``replay.agentx.idle_warp``)."""
    min_duration_s: float | None = None
    failure_threshold: float | None = None
    metric_coverage: float | None = None
    seed: int | None = None
    """Start sampling seed; None: the prompt salt (0 when none)."""

    def check(self) -> None:
        if not 0 <= self.start_min <= self.start_max <= 1:
            raise InputError(f"--start-range must satisfy 0 <= LO <= HI <= 1, got "
                             f"{self.start_min},{self.start_max}")
        if self.warmup_requests < 0:
            raise InputError(f"--warmup-requests must be >= 0, got {self.warmup_requests}")
        for name in ("idle_cap_s", "tree_idle_cap_s", "min_duration_s"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise InputError(f"--{name.removesuffix('_s').replace('_', '-')} must be >= 0, got {v}")
        for name in ("failure_threshold", "metric_coverage"):
            v = getattr(self, name)
            if v is not None and not 0 <= v <= 1:
                raise InputError(f"--{name.replace('_', '-')} must be within 0..1, got {v}")


@dataclass(frozen=True)
class Preset:
    duration_s: float
    agentx: AgentXSettings


PRESETS: dict[str, Preset] = {
    "inferencex-agentx": Preset(3600.0, AgentXSettings(
        preset="inferencex-agentx", start_min=0.25, start_max=0.75, warmup_requests=10,
        idle_cap_s=10.0, tree_idle_cap_s=300.0, min_duration_s=900.0, failure_threshold=0.10,
        metric_coverage=0.95, seed=42)),
    "aiperf-agentx-mvp": Preset(1800.0, AgentXSettings(
        preset="aiperf-agentx-mvp", start_min=0.0, start_max=1.0, warmup_requests=0,
        idle_cap_s=10.0, tree_idle_cap_s=None, min_duration_s=900.0, failure_threshold=None,
        metric_coverage=0.95, seed=None)),
}

AGENTX_FIELDS = tuple(f.name for f in fields(AgentXSettings) if f.name != "preset")


def resolve(preset: str | None, explicit: dict[str, Any], duration_s: float | None
            ) -> tuple[AgentXSettings, float | None]:
    """The settings and duration of a run: the preset's (or the defaults), with every
    explicitly given value (``explicit``: field name -> value, None = not given) on top."""
    if preset is None:
        base, dur = AgentXSettings(), None
    else:
        p = PRESETS.get(preset)
        if p is None:
            raise InputError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
        base, dur = p.agentx, p.duration_s
    given = {k: v for k, v in explicit.items() if v is not None}
    unknown = set(given) - set(AGENTX_FIELDS)
    if unknown:
        raise ValueError(f"not AgentX settings: {sorted(unknown)}")
    return replace(base, **given), duration_s if duration_s is not None else dur
