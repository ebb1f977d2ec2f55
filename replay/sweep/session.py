"""``run_capacity``: the capacity search of an experiment, in its sweep tree (resumable like
the sweep: its runs are rows of the same index, phase ``capacity``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from agent_replay.replay.results import write_json_atomic
from agent_replay.replay.sweep.capacity import (
    Capacity,
    check_axis,
    find_capacity,
    other_phase,
    parse_slo,
    run_length,
    to_markdown,
)
from agent_replay.replay.sweep.experiment import Experiment
from agent_replay.replay.sweep.runner import Reporter, RunHook, _prepare, write_state
from agent_replay.replay.sweep.targets import Servers


def run_capacity(
    exp: Experiment,
    slo_text: str,
    *,
    force: bool = False,
    progress: Reporter | None = None,
    hooks: Sequence[RunHook] = (),
) -> list[Capacity]:
    slo = parse_slo(slo_text)
    check_axis(exp)
    t0 = time.monotonic()
    out, rows = _prepare(exp, force)
    timing: dict[str, float] = {}
    write_state(exp, out, timing, "capacity search")
    duration, why = run_length(exp)
    if progress is not None:
        progress(
            f"capacity runs: {'the whole trace' if duration is None else f'{duration:g} s'} each ({why})"
        )
    probe_exp = (
        replace(exp, run={**exp.run, "duration_s": duration}) if duration is not None else exp
    )
    with Servers(exp.seed) as servers:
        caps = find_capacity(
            probe_exp,
            slo,
            rows=rows,
            out=out,
            servers=servers,
            progress=progress,
            hooks=hooks,
            timing=timing,
        )
    timing["wall_s"] = time.monotonic() - t0
    write_state(exp, out, timing, "complete")
    (Path(out) / "capacity.md").write_text(
        to_markdown(caps, exp.axis, slo_text, other_phase(caps, rows, slo))
        + (
            f"\nEach capacity run lasted {'the whole trace' if duration is None else f'{duration:g} s'}: "
            f"{why}.\n"
        )
    )
    write_json_atomic(
        Path(out) / "capacity.json",
        {
            "slo": slo_text,
            "axis": exp.axis,
            "targets": [
                {
                    "target": c.target,
                    "gpus": c.gpus,
                    "capacity": c.capacity,
                    "capacity_per_gpu": None if c.capacity is None else c.capacity / c.gpus,
                    "first_fail": c.first_fail,
                    "disagree": c.disagree,
                    "interval": c.interval,
                    "spread": c.spread,
                    "client_limit": c.client_limit,
                    "run_length_s": duration,
                    "probes": [p.__dict__ for p in c.probes],
                }
                for c in caps
            ],
        },
    )
    return caps
