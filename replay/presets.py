"""``--timing agentx`` settings and the named presets that fill them (``--preset``).

The two presets reproduce AIPerf's scenario (``src/aiperf/common/scenario/
inferencex_agentx_mvp.py`` in ai-dynamo/aiperf), alone and as InferenceX runs it:

* ``inferencex-agentx``: ``inferencex-agentx-mvp`` with the settings InferenceX's AgentX
  runs give it (AIPerf versions after 0.13.0): benchmark duration 3,600 s, trajectory start
  ratios 0.25-0.75, seed 42, failed request threshold 0.10, 10 warm-up requests per lane,
  trace idle gap cap 300 s; from the scenario it keeps the 900 s minimum duration, the 10 s
  system idle gap cap and the 0.95 profile metric coverage.
* ``aiperf-agentx-mvp``: AIPerf's ``inferencex-agentx-mvp``: duration 1,800 s (minimum
  900 s), start ratios 0-1, the warm-up of every stream live at t* (its last turn before t*),
  10 s system idle gap cap, metric coverage 0.95; no failure threshold of its own.

Explicit options override a preset's values; every resolved value is in run.json
(``options.agentx`` and ``options.duration_s``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from agent_replay.errors import InputError
from agent_replay.replay.options import (
    LOAD,
    MEASUREMENT,
    SEED,
    at_least,
    check_fields,
    option,
    within,
)

AGENTX_GROUP = "agentx timing (InferenceX AgentX / AIPerf rules; see docs/agentx.md)"
"""The CLI group of the AgentX options."""
PRESET_NAMES = ("inferencex-agentx", "aiperf-agentx-mvp")


def parse_start_range(v: str | None) -> tuple[float | None, float | None]:
    """``--start-range LO,HI`` as (LO, HI); (None, None) when not given."""
    if v is None:
        return None, None
    lo, _, hi = v.partition(",")
    try:
        return float(lo), float(hi)
    except ValueError:
        raise InputError(
            f"--start-range {v!r}: expected LO,HI (fractions, e.g. 0.25,0.75)"
        ) from None


@dataclass(frozen=True)
class AgentXSettings:
    """Run options of ``--timing agentx`` (``replay.options``: on the command line each
    defaults to not given, so that ``resolve`` takes the preset's value)."""

    preset: str | None = option(
        None,
        kind=LOAD,
        choices=PRESET_NAMES,
        group=AGENTX_GROUP,
        help="AgentX parameters as AIPerf's scenario sets them (implies --timing "
        "agentx); the options below override single values",
    )
    start_min: float = option(
        0.25,
        kind=LOAD,
        flag="--start-range",
        metavar="LO,HI",
        parse=parse_start_range,
        sets=("start_min", "start_max"),
        group=AGENTX_GROUP,
        help="first play starts at an instant LO..HI of its session's time span "
        "(default 0.25,0.75)",
    )
    start_max: float = option(0.75, kind=LOAD, cli=False, help="the HI of --start-range")
    warmup_requests: int = option(
        0,
        kind=LOAD,
        metavar="N",
        checks=(at_least(0),),
        group=AGENTX_GROUP,
        help="turns per lane replayed back to back as warm-up (one output token, flagged "
        "warm-up) after the warm-up of every stream live at t*, before the measured play "
        "(default 0)",
    )
    idle_cap_s: float | None = option(
        10.0,
        kind=LOAD,
        metavar="SECONDS",
        checks=(at_least(0),),
        group=AGENTX_GROUP,
        help="nothing in flight idles at most this long (default 10)",
    )
    tree_idle_cap_s: float | None = option(
        None,
        kind=LOAD,
        metavar="SECONDS",
        checks=(at_least(0),),
        group=AGENTX_GROUP,
        help="shorten every recorded stretch where nothing of a session tree was "
        "in flight to at most this: AIPerf's trace idle gap cap (default none)",
    )
    min_duration_s: float | None = option(
        None,
        kind=MEASUREMENT,
        metavar="SECONDS",
        checks=(at_least(0),),
        group=AGENTX_GROUP,
        help="a run measuring less is invalid",
    )
    failure_threshold: float | None = option(
        None,
        kind=MEASUREMENT,
        metavar="FRACTION",
        checks=(within(0, 1),),
        group=AGENTX_GROUP,
        help="a run with more failed requests is invalid",
    )
    metric_coverage: float | None = option(
        None,
        kind=MEASUREMENT,
        metavar="FRACTION",
        checks=(within(0, 1),),
        group=AGENTX_GROUP,
        help="a run whose last first token / token lies less far into --duration is invalid",
    )
    overflow_rule: str = option(
        "aiperf",
        kind=LOAD,
        choices=("aiperf", "agent-replay"),
        group=AGENTX_GROUP,
        help="which error messages are context overflows: AIPerf's list (default) or "
        "ours, which also knows vLLM's 'maximum model length' (docs/agentx.md)",
    )
    warmup_failure: str = option(
        "abort",
        kind=MEASUREMENT,
        choices=("abort", "continue"),
        group=AGENTX_GROUP,
        help="a failed warm-up of a main stream ends the run, as AIPerf's does (abort, "
        "the default), or the run goes on with that stream cold (continue)",
    )
    seed: int | None = option(
        None,
        kind=SEED,
        group=AGENTX_GROUP,
        help="start sampling seed (default: --salt, 0 when none)",
    )

    def check(self) -> None:
        """The rule across fields; each field's own rules are ``options.check_fields``'."""
        if not 0 <= self.start_min <= self.start_max <= 1:
            raise InputError(
                f"--start-range must satisfy 0 <= LO <= HI <= 1, got "
                f"{self.start_min},{self.start_max}"
            )
        check_fields(self)


@dataclass(frozen=True)
class Preset:
    duration_s: float
    agentx: AgentXSettings


PRESETS: dict[str, Preset] = {
    "inferencex-agentx": Preset(
        3600.0,
        AgentXSettings(
            preset="inferencex-agentx",
            start_min=0.25,
            start_max=0.75,
            warmup_requests=10,
            idle_cap_s=10.0,
            tree_idle_cap_s=300.0,
            min_duration_s=900.0,
            failure_threshold=0.10,
            metric_coverage=0.95,
            seed=42,
        ),
    ),
    "aiperf-agentx-mvp": Preset(
        1800.0,
        AgentXSettings(
            preset="aiperf-agentx-mvp",
            start_min=0.0,
            start_max=1.0,
            warmup_requests=0,
            idle_cap_s=10.0,
            tree_idle_cap_s=None,
            min_duration_s=900.0,
            failure_threshold=None,
            metric_coverage=0.95,
            seed=None,
        ),
    ),
}

AGENTX_FIELDS = tuple(f.name for f in fields(AgentXSettings) if f.name != "preset")


def resolve(
    preset: str | None, explicit: dict[str, Any], duration_s: float | None
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
