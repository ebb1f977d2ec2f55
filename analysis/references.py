"""Published reference points drawn beside a frontier (``agent-replay frontier --reference
FILE``): a small JSON file of points, each with the figures it states, the hardware, engine
and model it ran on, what exactly it is and where it was published.

File format::

    {"title": "...", "note": "...",
     "points": [{"label": "...", "values": {"total_tps_per_gpu": 90885.06,
                                              "north_star": 84.42},
                 "hardware": "GB300", "gpus": 2, "engine": "SGLang", "model": "...",
                 "concurrency": 64, "what": "...", "source": "https://...",
                 "confirmed": true, "approximate": false, "axis_note": "...",
                 "ratio": {"name": "...", "value": 1.26, "note": "..."}}]}

``values`` keys are the frontier's axes (``analysis.frontier.X_AXES`` and ``Y_AXES``). A
point with both coordinates of a plot is drawn as a star; a point with one of them as a
dotted line across the plot. The markdown section lists every point and says how the
hardware differs from ours.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_replay.errors import InputError


@dataclass(frozen=True, slots=True)
class RefPoint:
    label: str
    values: dict[str, float]
    hardware: str
    source: str
    what: str
    gpus: int | None = None
    engine: str = ""
    model: str = ""
    concurrency: int | None = None
    confirmed: bool = False
    approximate: bool = False
    axis_note: str = ""
    ratio: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reference:
    path: str
    title: str
    note: str
    points: tuple[RefPoint, ...]

    def hardware(self) -> list[str]:
        """The distinct hardware of the points, in file order."""
        return list(dict.fromkeys(p.hardware for p in self.points))


def load(path: str | os.PathLike[str], axes: Sequence[str]) -> Reference:
    """Read a reference file; ``axes``: the value keys allowed. Bad input is an InputError
    naming the file, the point and the field."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except OSError as exc:
        raise InputError(f"{p}: cannot read the reference file ({exc.strerror})") from None
    except ValueError as exc:
        raise InputError(f"{p}: not JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("points"), list) or not raw["points"]:
        raise InputError(f"{p}: expected an object with a non-empty 'points' list")
    out = [_ref_point(f"{p}: points[{i}]", pt, axes) for i, pt in enumerate(raw["points"])]
    return Reference(
        path=str(p),
        title=str(raw.get("title") or p.name),
        note=str(raw.get("note") or ""),
        points=tuple(out),
    )


def _ref_point(where: str, pt: Any, axes: Sequence[str]) -> RefPoint:
    """One point of the file, checked."""
    if not isinstance(pt, dict):
        raise InputError(f"{where}: expected an object")
    for key in ("label", "hardware", "source", "what"):
        if not isinstance(pt.get(key), str) or not pt[key].strip():
            raise InputError(f"{where}: '{key}' must be a non-empty string")
    values = _values(where, pt.get("values"), axes)
    gpus = _gpus(where, pt.get("gpus"))
    ratio = _ratio(where, pt.get("ratio") or {})
    return RefPoint(
        label=pt["label"],
        values=values,
        hardware=pt["hardware"],
        source=pt["source"],
        what=pt["what"],
        gpus=gpus,
        engine=str(pt.get("engine") or ""),
        model=str(pt.get("model") or ""),
        concurrency=pt.get("concurrency"),
        confirmed=bool(pt.get("confirmed")),
        approximate=bool(pt.get("approximate")),
        axis_note=str(pt.get("axis_note") or ""),
        ratio=dict(ratio),
    )


def _gpus(where: str, gpus: Any) -> int | None:
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise InputError(f"{where}: 'gpus' must be a positive integer or null")
    return gpus


def _ratio(where: str, ratio: Any) -> Any:
    if ratio and (
        not isinstance(ratio, dict)
        or not isinstance(ratio.get("value"), (int, float))
        or not isinstance(ratio.get("name"), str)
    ):
        raise InputError(f"{where}: 'ratio' must have a 'name' and a numeric 'value'")
    return ratio


def _values(where: str, values: Any, axes: Sequence[str]) -> dict[str, float]:
    """A point's figures: known axes, positive finite numbers, at least one."""
    if not isinstance(values, dict) or not values:
        raise InputError(f"{where}: 'values' must map an axis to a number")
    for k, v in values.items():
        if k not in axes:
            raise InputError(f"{where}: values.{k}: not an axis (known: {', '.join(axes)})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise InputError(f"{where}: values.{k}: expected a positive number, got {v!r}")
    return {k: float(v) for k, v in values.items()}


def hardware_line(ref: Reference, ours: Sequence[str]) -> str:
    """One sentence on how the reference's hardware differs from the sweep's."""
    mine = ", ".join(sorted(set(ours))) if ours else "hardware not recorded in the runs' run.json"
    return (
        f"Hardware differs: the reference ran on {', '.join(ref.hardware())}; this "
        f"frontier on {mine}. Absolute figures place the frontier, they do not rank it."
    )


def _num(v: float) -> str:
    return f"{v:,.2f}".rstrip("0").rstrip(".")


def to_markdown(ref: Reference, ours: Sequence[str], labels: dict[str, str]) -> str:
    """The reference section of frontier.md: the hardware line, then one row per point."""
    lines = [f"## Reference: {ref.title} ({ref.path})", "", hardware_line(ref, ours)]
    if ref.note:
        lines += ["", ref.note]
    lines += [
        "",
        "| point | values | hardware | engine, model | concurrency | what | source |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [_row(p, labels) for p in ref.points]
    return "\n".join(lines) + "\n"


def _row(p: RefPoint, labels: dict[str, str]) -> str:
    """A point's row of the reference table."""
    what = p.what + (f" Axis: {p.axis_note}" if p.axis_note else "")
    src = p.source + ("" if p.confirmed else " (not confirmed against a publication)")
    return (
        "| "
        + " | ".join(
            _cell(x)
            for x in (
                p.label,
                _values_cell(p, labels),
                p.hardware + (f" ({p.gpus} GPUs)" if p.gpus else ""),
                ", ".join(s for s in (p.engine, p.model) if s),
                "-" if p.concurrency is None else str(p.concurrency),
                what,
                src,
            )
        )
        + " |"
    )


def _values_cell(p: RefPoint, labels: dict[str, str]) -> str:
    """The point's figures (``~``: approximate), then its ratio with its note."""
    vals = "; ".join(
        f"{labels.get(k, k)} {'~' if p.approximate else ''}{_num(v)}" for k, v in p.values.items()
    )
    if p.ratio:
        vals += f"; {p.ratio['name']} {_num(float(p.ratio['value']))}"
        if p.ratio.get("note"):
            vals += f" ({p.ratio['note']})"
    return vals


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def draw(ax: Any, ref: Reference, x: str, y: str) -> int:
    """Overlay ``ref`` on a matplotlib axes of ``x`` against ``y``: stars for points with
    both, dotted lines for points with one. Returns how many points were drawn."""
    n = 0
    for p in ref.points:
        px, py = p.values.get(x), p.values.get(y)
        if px is not None and py is not None:
            ax.scatter([px], [py], marker="*", s=140, color="black", zorder=5)
            ax.annotate(p.label, (px, py), fontsize=7, textcoords="offset points", xytext=(4, -10))
        elif px is not None:
            ax.axvline(px, linestyle=":", color="grey", linewidth=1)
            ax.annotate(
                p.label,
                (px, 0),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                rotation=90,
                xytext=(2, 4),
                textcoords="offset points",
                va="bottom",
            )
        elif py is not None:
            ax.axhline(py, linestyle=":", color="grey", linewidth=1)
            ax.annotate(
                p.label,
                (0, py),
                xycoords=("axes fraction", "data"),
                fontsize=7,
                xytext=(4, 2),
                textcoords="offset points",
            )
        else:
            continue
        n += 1
    return n
