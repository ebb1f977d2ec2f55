"""An experiment file (TOML) as a frozen ``Experiment``: targets, a load axis, repeats, a
seed, the run options every run shares, the warm-up policy, prices and an SLO.

Strict: an unknown key, a missing one or a value of the wrong kind is an ``InputError``
naming the file and the key (``exp.toml: [load] points: ...``). Paths in the file are
relative to the file.

    trace = "agent.parquet"
    output = "sweeps/std-vs-mtp"       # default: sweeps/<file stem>
    repeats = 3
    seed = 1

    [load]
    axis = "concurrent_sessions"       # or rate, speedup, concurrency
    points = [2, 4, 8, 16]

    [run]                              # RunConfig options shared by every run (sweep keys)
    speedup = 5
    duration_s = 20

    [warmup]
    burst_s = 3                        # min_bursts, max_bursts, tolerance, enabled

    [prices]                           # USD per million tokens (revenue per GPU-hour)
    input_hit = 0.1
    input_miss = 0.5
    output = 2.0

    [[targets]]
    name = "standard"
    sim = "default"                    # or url = "http://...", or launch = "PROFILE --model M",
                                       # or virtual = "PROFILE" (the sim engine in virtual time)
    gpus = 1
    usd_per_gpu_hour = 2.5
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_replay.errors import InputError
from agent_replay.replay.config import RunConfig
from agent_replay.replay.options import (
    axes,
    axis_values,
    check_sweep_value,
    integer_axes,
    sweep_keys,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads TOML with tomli when it is installed
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None

AXES = tuple(axes(RunConfig))
"""Load axes: the RunConfig options declared ``axis`` (``replay.options``): sessions at
once, session arrivals per second, time compression, requests in flight (max-rate
timing)."""
INTEGER_AXES = integer_axes(RunConfig)

RUN_KEYS = sweep_keys(RunConfig)
"""``[run]`` keys: the RunConfig options declared ``sweep=True`` (``replay.options``), each
checked by its field's rules."""
LIFETIMES = ("sweep", "visit")
MAX_FILE_BYTES = 1 << 20
"""An experiment file is a page of settings; a larger one is not one."""
MAX_DEPTH = 6
"""Nesting of tables and arrays (the schema needs 3: ``targets[i].sim_args``)."""
MAX_NUMBER = 1e12
"""Bound on the magnitude of any number in the file."""
MAX_POINT = 1e6
"""Bound on a load point: a million sessions, requests in flight, sessions/s or speedup."""
MAX_POINTS = 1000
MAX_REPEATS = 1000
MAX_RUNS = 100_000
"""Bound on targets x points x repeats."""


@dataclass(frozen=True)
class Target:
    name: str
    kind: str  # url, sim, launch, virtual
    spec: str  # the URL, the sim profile, or the launch spec
    gpus: int = 1
    usd_per_gpu_hour: float | None = None
    lifetime: str = "sweep"
    """``sweep``: started once and kept for the whole sweep; ``visit``: started for each
    visit (a repeat's pass over its load points) and stopped after it."""
    sim_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Warmup:
    enabled: bool = True
    burst_s: float = 3.0
    min_bursts: int = 2
    max_bursts: int = 5
    tolerance: float = 0.10
    """Steady: the median TPOT of the last burst within this fraction of the one before."""


@dataclass(frozen=True)
class Experiment:
    path: str
    trace: str
    output: str
    targets: tuple[Target, ...]
    axis: str
    points: tuple[float, ...]
    repeats: int = 3
    seed: int = 0
    run: dict[str, Any] = field(default_factory=dict)
    warmup: Warmup = field(default_factory=Warmup)
    prices: dict[str, float] | None = None
    slo: str | None = None

    def point_label(self, point: float) -> str:
        return f"{self.axis}={format_point(point)}"

    def identity(self) -> dict[str, Any]:
        """What must not change between a sweep and its resumption."""
        return {
            "trace": self.trace,
            "axis": self.axis,
            "seed": self.seed,
            "targets": [t.name for t in self.targets],
            "run": self.run,
        }


def _check_run_options(
    f: str, trace: str, run: dict[str, Any], axis: str, points: list[float]
) -> None:
    """The [run] options at every load point, as the runs will get them, checked by
    ``RunConfig.check`` (a bad speedup or duration is an error now, not a failed run each)."""
    from agent_replay.replay.config import RunConfig

    for point in points:
        extra = axis_values(RunConfig, axis, point)
        try:
            RunConfig(trace=trace, target="http://127.0.0.1", **run, **extra).check()
        except InputError as exc:
            raise InputError(f"{f}: [run] at {axis}={format_point(point)}: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise InputError(f"{f}: [run]: {exc}") from None


def format_point(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else f"{p:g}"


def _check_keys(where: str, table: dict[str, Any], known: set[str] | dict[str, Any]) -> None:
    for key in table:
        if key not in known:
            raise InputError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")


def _typed(where: str, key: str, value: Any, kinds: type | tuple[type, ...]) -> Any:
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and kinds in ((int, float), int))
    if not ok:
        want = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
        raise InputError(f"{where} {key}: expected {want}, got {value!r}")
    return value


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


TARGET_KINDS = ("url", "sim", "launch", "virtual")


def _target(where: str, raw: Any) -> Target:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected a table")
    _check_keys(
        where, raw, {"name", *TARGET_KINDS, "gpus", "usd_per_gpu_hour", "lifetime", "sim_args"}
    )
    kind, spec = _target_spec(where, raw)
    gpus = int(_typed(where, "gpus", raw.get("gpus", 1), int))
    if gpus < 1:
        raise InputError(f"{where} gpus: must be >= 1, got {gpus}")
    price = raw.get("usd_per_gpu_hour")
    if price is not None:
        price = float(_typed(where, "usd_per_gpu_hour", price, (int, float)))
        if price < 0:
            raise InputError(f"{where} usd_per_gpu_hour: must be >= 0")
    sim_args = raw.get("sim_args", [])
    if not isinstance(sim_args, list) or not all(isinstance(a, str) for a in sim_args):
        raise InputError(f"{where} sim_args: expected a list of strings")
    return Target(
        _target_name(where, raw, kind, spec),
        kind,
        spec,
        gpus,
        price,
        _lifetime(where, raw, kind),
        tuple(sim_args),
    )


def _target_spec(where: str, raw: dict[str, Any]) -> tuple[str, str]:
    """The target's kind (the one of url, sim, launch, virtual it gives) and its spec, checked."""
    kinds = [k for k in TARGET_KINDS if k in raw]
    if len(kinds) != 1:
        raise InputError(f"{where}: give exactly one of url, sim, launch, virtual")
    kind = kinds[0]
    spec = str(_typed(where, kind, raw[kind], str))
    if kind == "url" and not spec.startswith(("http://", "https://")):
        raise InputError(f"{where} url: expected an http(s) URL, got {spec!r}")
    if kind == "launch":
        from agent_replay.replay.launch import parse_spec

        try:
            parse_spec(spec)
        except InputError as exc:
            raise InputError(f"{where} launch: {exc}") from None
    return kind, spec


def _target_name(where: str, raw: dict[str, Any], kind: str, spec: str) -> str:
    """The given name; by default a sim's profile, a virtual engine's file stem."""
    name = str(_typed(where, "name", raw.get("name", spec if kind == "sim" else ""), str))
    if kind == "virtual" and "name" not in raw:
        name = Path(spec).stem
    if not _NAME.match(name):
        raise InputError(f"{where} name: {name!r} must be letters, digits, '.', '_' or '-'")
    return name


def _lifetime(where: str, raw: dict[str, Any], kind: str) -> str:
    """``visit`` by default for a launched server, else ``sweep``; a URL only ``sweep``."""
    lifetime = str(
        _typed(
            where, "lifetime", raw.get("lifetime", "visit" if kind == "launch" else "sweep"), str
        )
    )
    if lifetime not in LIFETIMES:
        raise InputError(
            f"{where} lifetime: must be one of {', '.join(LIFETIMES)}, got {lifetime!r}"
        )
    if kind == "url" and lifetime == "visit":
        raise InputError(f"{where} lifetime: a url target cannot be restarted; use 'sweep'")
    return lifetime


def load_experiment(path: str | Path, *, output: str | None = None) -> Experiment:
    """Read and check an experiment file; every problem is one InputError line."""
    p = Path(path)
    if tomllib is None:
        raise InputError(f"{p}: reading experiment files needs Python 3.11+ or the tomli package")
    try:
        with open(p, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise InputError(f"{p}: larger than {MAX_FILE_BYTES:,} bytes; not an experiment file")
        raw = tomllib.loads(data.decode())
    except FileNotFoundError:
        raise InputError(f"{p}: no such experiment file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{p}: not valid TOML: {exc}") from None
    except RecursionError:
        raise InputError(
            f"{p}: nested too deeply (more than {MAX_DEPTH} levels of tables or arrays)"
        ) from None
    _check_shape(str(p), raw)
    return experiment_from_dict(raw, p, output=output)


def _check_shape(where: str, value: Any, key: str = "", depth: int = 0) -> None:
    """Nesting depth and the range of every number, before any value is used."""
    if depth > MAX_DEPTH:
        raise InputError(
            f"{where}: {key or 'the file'}: nested too deeply (more than "
            f"{MAX_DEPTH} levels of tables or arrays)"
        )
    if isinstance(value, dict):
        for k, v in value.items():
            _check_shape(where, v, f"{key}.{k}" if key else str(k), depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_shape(where, v, f"{key}[{i}]", depth + 1)
    elif _out_of_range(value):
        raise InputError(
            f"{where}: {key}: {value!r} is out of range (a finite number "
            f"of magnitude at most {MAX_NUMBER:g})"
        )


def _out_of_range(value: Any) -> bool:
    """A number (not a bool) that is not finite or of magnitude over ``MAX_NUMBER``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    return not math.isfinite(value) or abs(value) > MAX_NUMBER


def experiment_from_dict(raw: dict[str, Any], p: Path, *, output: str | None = None) -> Experiment:
    f = str(p)
    _check_keys(
        f,
        raw,
        {"trace", "output", "repeats", "seed", "load", "run", "warmup", "prices", "slo", "targets"},
    )
    trace, out_path = _paths(f, raw, p, output)
    repeats = int(_typed(f, "repeats", raw.get("repeats", 3), int))
    if not 1 <= repeats <= MAX_REPEATS:
        raise InputError(f"{f}: repeats: must be within 1..{MAX_REPEATS}, got {repeats}")
    seed = int(_typed(f, "seed", raw.get("seed", 0), int))
    axis, points = _load_axis(f, raw)
    run = _run_table(f, raw, axis)
    w = _warmup(f, raw)
    prices = _prices(f, raw)
    slo = _slo(f, raw)
    targets = _targets(f, raw)
    runs = len(targets) * len(points) * repeats
    if runs > MAX_RUNS:
        raise InputError(
            f"{f}: {len(targets)} targets x {len(points)} points x {repeats} "
            f"repeats = {runs:,} runs, more than {MAX_RUNS:,}"
        )
    _check_run_options(f, str(trace.resolve()), dict(run), str(axis), points)
    return Experiment(
        str(p),
        str(trace.resolve()),
        str(out_path.resolve()),
        targets,
        str(axis),
        tuple(points),
        repeats,
        seed,
        dict(run),
        w,
        prices,
        slo,
    )


def _paths(f: str, raw: dict[str, Any], p: Path, output: str | None) -> tuple[Path, Path]:
    """The trace (which must exist) and the output folder, relative to the file; an
    ``output`` given by the caller wins over the file's."""
    if "trace" not in raw:
        raise InputError(f"{f}: missing key 'trace'")
    base = p.resolve().parent
    trace = base / str(_typed(f, "trace", raw["trace"], str))
    if not trace.exists():
        raise InputError(f"{f}: trace: {trace} does not exist")
    out = output or raw.get("output") or str(Path("sweeps") / p.stem)
    out_path = Path(str(_typed(f, "output", out, str)))
    if output is None and "output" in raw and not out_path.is_absolute():
        out_path = base / out_path
    return trace, out_path


def _load_axis(f: str, raw: dict[str, Any]) -> tuple[str, list[float]]:
    """[load]: the axis and its points, each valid for the axis, none repeated."""
    load = raw.get("load")
    if not isinstance(load, dict):
        raise InputError(f"{f}: missing table [load] (axis = ..., points = [...])")
    _check_keys(f"{f}: [load]", load, {"axis", "points"})
    axis = load.get("axis")
    if axis not in AXES:
        raise InputError(f"{f}: [load] axis: must be one of {', '.join(AXES)}, got {axis!r}")
    pts = load.get("points")
    if not isinstance(pts, list) or not pts:
        raise InputError(f"{f}: [load] points: expected a non-empty list of numbers")
    if len(pts) > MAX_POINTS:
        raise InputError(f"{f}: [load] points: {len(pts):,} points, more than {MAX_POINTS}")
    points = [_load_point(f, str(axis), v) for v in pts]
    if len(set(points)) != len(points):
        raise InputError(f"{f}: [load] points: repeated values")
    return str(axis), points


def _load_point(f: str, axis: str, v: Any) -> float:
    _typed(f"{f}: [load]", "points", v, (int, float))
    whole = axis in INTEGER_AXES
    if not 0 < v <= MAX_POINT or (whole and not float(v).is_integer()):
        raise InputError(
            f"{f}: [load] points: {v!r} is not a valid {axis} (positive"
            f"{' whole number' if whole else ''}, at most "
            f"{MAX_POINT:g})"
        )
    return float(v)


def _run_table(f: str, raw: dict[str, Any], axis: str) -> dict[str, Any]:
    """[run]: sweep keys only, each value checked, no load axis, and what the axis needs."""
    run = raw.get("run", {})
    if not isinstance(run, dict):
        raise InputError(f"{f}: [run]: expected a table")
    for k in AXES:
        if k in run and (k == axis or k not in RUN_KEYS):
            raise InputError(f"{f}: [run] {k}: a load axis; set it in [load] (axis, points)")
    _check_keys(f"{f}: [run]", run, RUN_KEYS)
    for k, v in run.items():
        check_sweep_value(f"{f}: [run]", RunConfig, k, v)
    for k, v in axes(RunConfig)[axis].axis_sets:
        if run.get(k, v) != v:
            raise InputError(f"{f}: [run] {k}: the {axis} axis needs {k} = {v!r}")
    return run


def _warmup(f: str, raw: dict[str, Any]) -> Warmup:
    wraw = raw.get("warmup", {})
    if not isinstance(wraw, dict):
        raise InputError(f"{f}: [warmup]: expected a table")
    where = f"{f}: [warmup]"
    _check_keys(where, wraw, {"enabled", "burst_s", "min_bursts", "max_bursts", "tolerance"})
    w = Warmup(
        enabled=bool(_typed(where, "enabled", wraw.get("enabled", True), bool)),
        burst_s=float(_typed(where, "burst_s", wraw.get("burst_s", 3.0), (int, float))),
        min_bursts=int(_typed(where, "min_bursts", wraw.get("min_bursts", 2), int)),
        max_bursts=int(_typed(where, "max_bursts", wraw.get("max_bursts", 5), int)),
        tolerance=float(_typed(where, "tolerance", wraw.get("tolerance", 0.10), (int, float))),
    )
    if w.burst_s <= 0 or w.min_bursts < 1 or w.max_bursts < w.min_bursts or w.tolerance <= 0:
        raise InputError(
            f"{f}: [warmup]: need burst_s > 0, 1 <= min_bursts <= max_bursts, tolerance > 0"
        )
    return w


def _prices(f: str, raw: dict[str, Any]) -> dict[str, float] | None:
    """[prices]: USD per million tokens, all three keys; None without the table."""
    prices = raw.get("prices")
    if prices is None:
        return None
    if not isinstance(prices, dict):
        raise InputError(f"{f}: [prices]: expected a table")
    _check_keys(f"{f}: [prices]", prices, {"input_hit", "input_miss", "output"})
    for k in ("input_hit", "input_miss", "output"):
        if k not in prices:
            raise InputError(f"{f}: [prices]: missing key {k!r} (USD per million tokens)")
        _typed(f"{f}: [prices]", k, prices[k], (int, float))
    return {k: float(v) for k, v in prices.items()}


def _slo(f: str, raw: dict[str, Any]) -> str | None:
    slo = raw.get("slo")
    if slo is None:
        return None
    _typed(f, "slo", slo, str)
    from agent_replay.replay.sweep.capacity import parse_slo

    try:
        parse_slo(slo)
    except InputError as exc:
        raise InputError(f"{f}: slo: {exc}") from None
    return str(slo)


def _targets(f: str, raw: dict[str, Any]) -> tuple[Target, ...]:
    """[[targets]]: at least one, each checked, names unique."""
    traw = raw.get("targets")
    if not isinstance(traw, list) or not traw:
        raise InputError(f"{f}: missing [[targets]] (at least one)")
    targets = tuple(_target(f"{f}: targets[{i}]", t) for i, t in enumerate(traw))
    names = [t.name for t in targets]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(f"{f}: targets: name {dup[0]!r} is used twice")
    return targets
