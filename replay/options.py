"""Run options declared once: a ``RunConfig`` field made with ``option(...)`` carries its
type (the annotation), default, help, CLI flag, validation and whether an experiment file's
``[run]`` table may set it. From those fields come the ``run`` command's arguments
(``add_options``), the config built from them (``namespace_values``), the sweep's ``[run]``
keys and their checks (``sweep_keys``, ``check_sweep_value``), the field checks of
``RunConfig.check`` (``check_fields``) and run.json's ``options`` entry
(``record_options``). Adding a run option is one field.

Every option declares what it means (``Option.kind``): it shapes the load (``load``: what
is sent, when, or which requests the statistics cover), sets how the run is measured
(``measurement``: the target's address and model, the client, workers, telemetry), where
and what is written (``output``), what is shown (``presentation``), or draws one replicate
of the experiment (``seed``). run.json records
each option's kind (``option_kinds``), and ``compare`` refuses runs that differ in a
``load`` option from those records. A load option may also be a sweep's load axis
(``axis``) and feed the request plan (``plan``): the sweep's axes and
``RunConfig.plan_options`` are made from those declarations. The CLI flag is the field's
name (``max_think_s`` is ``--max-think-s``); the spelling without the unit, ``--max-think``,
stays an alias.

A field holding a nested settings dataclass (``RunConfig.agentx``) declares ``nested=True``;
its own ``option`` fields become a CLI group whose values default to None ("not given"), so
that a preset can fill what the command line leaves out (``nested_values``).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field
from typing import Any

from agent_replay.errors import InputError
from agent_replay.redact import redact

OPTION = "agent_replay.option"
"""The key of a field's ``Option`` in its dataclass metadata."""


@dataclass(frozen=True)
class Check:
    """A rule on a value: ``test`` passes it, else the value ``phrase`` (``must be >= 1``)."""

    phrase: str
    test: Callable[[Any], bool]


def at_least(lo: float) -> Check:
    return Check(f"must be >= {lo:g}", lambda v: v >= lo)


def above(lo: float) -> Check:
    return Check(f"must be > {lo:g}", lambda v: v > lo)


def within(lo: float, hi: float) -> Check:
    return Check(f"must be within {lo:g}..{hi:g}", lambda v: lo <= v <= hi)


LOAD = "load"
MEASUREMENT = "measurement"
OUTPUT = "output"
PRESENTATION = "presentation"
SEED = "seed"
"""Draws one sample of the experiment (prompt salt, arrival seed): runs that differ only in
their seeds are replicates of one experiment, and ``compare`` takes them."""
KINDS = (LOAD, MEASUREMENT, OUTPUT, PRESENTATION, SEED)
OFFERED = "offered"
"""A load axis whose points are offered load (session timing): the throughput it draws is
not a capacity."""
CLOSED = "closed"
"""A load axis that holds requests in flight (max-rate timing)."""


@dataclass(frozen=True)
class Option:
    help: str | None = None
    """The option's one description: the CLI help, and the field's documentation."""
    kind: str | None = None
    """``KINDS``: what the option means; None only for fields that are not options."""
    flag: str | None = None
    """The CLI flag; None: ``--`` and the field name with ``_`` as ``-``."""
    short: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    checks: tuple[Check, ...] = ()
    """Rules on a given (not None) value, for the CLI, the library and the sweep alike."""
    sweep: bool = False
    """An experiment file's ``[run]`` table may set it."""
    cli: bool = True
    record: bool = True
    """Written to run.json's ``options``."""
    group: str | None = None
    """Title of the CLI argument group it is listed in (None: the command's own options)."""
    nargs: str | None = None
    const: Any = None
    parse: Callable[[Any], Any] | None = None
    """The field's value from the CLI's (the default's type converts it otherwise)."""
    repeat: bool = False
    """The flag may be given many times; ``parse`` gets the list."""
    aliases: tuple[tuple[str, Any, str], ...] = ()
    """More flags that set a fixed value: (flag, value, help)."""
    sets: tuple[str, ...] = ()
    """Nested settings: the parsed value is a tuple spread over these fields."""
    nested: bool = False
    """The field is a settings dataclass whose ``option`` fields are options too."""
    axis: str | None = None
    """A sweep's ``[load] axis``: ``OFFERED`` or ``CLOSED``; its points are the field's
    type (int or float)."""
    axis_sets: tuple[tuple[str, Any], ...] = ()
    """Other fields a point of this axis sets: (field, value)."""
    plan: bool | str = False
    """Feeds the request plan (``replay.plan.PlanOptions``): True under its own name, or
    the name of the plan's field."""

    def flag_for(self, name: str) -> str:
        return self.flag or "--" + name.replace("_", "-")

    def flags_for(self, name: str) -> list[str]:
        """The flag, then its aliases: the short one, and for a ``_s`` field the spelling
        without the unit (``--max-think`` for ``--max-think-s``)."""
        out = [self.flag_for(name)]
        if self.flag is None and name.endswith("_s"):
            out.append("--" + name.removesuffix("_s").replace("_", "-"))
        return out + ([self.short] if self.short else [])


def option(default: Any = MISSING, *, kind: str, default_factory: Any = MISSING, **kw: Any) -> Any:
    """A dataclass field that is a run option of ``kind`` (see ``Option`` for the
    keywords)."""
    if kind not in KINDS:
        raise ValueError(f"option kind must be one of {', '.join(KINDS)}, got {kind!r}")
    meta = {OPTION: Option(kind=kind, **kw)}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def internal(default: Any = None, *, record: bool = True) -> Any:
    """A field the run sets for itself: not a CLI flag, not a sweep key."""
    return field(default=default, metadata={OPTION: Option(cli=False, record=record)})


def spec(f: dataclasses.Field[Any]) -> Option:
    """A field's option declaration (a plain field: recorded, not on the CLI)."""
    o = f.metadata.get(OPTION)
    return o if isinstance(o, Option) else Option(cli=False)


def option_fields(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Option]]:
    for f in dataclasses.fields(cls):
        yield f, spec(f)


def base_type(cls: type, name: str) -> Any:
    """The field's annotation without ``None`` (``float | None`` -> float)."""
    t = typing.get_type_hints(cls)[name]
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        return args[0] if len(args) == 1 else t
    return t


def kinds(cls: type, name: str) -> tuple[type, ...]:
    """The Python types a value of the field may have in a file (TOML, JSON): an int is a
    float too, a bool is not an int."""
    t = base_type(cls, name)
    if t is float:
        return (int, float)
    return (t,) if isinstance(t, type) else (object,)


def default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def problem(o: Option, value: Any) -> str | None:
    """What is wrong with a value of the option (None: nothing, or None given)."""
    if value is None:
        return None
    if o.choices is not None and value not in o.choices:
        return f"must be one of {', '.join(o.choices)}, got {value!r}"
    for c in o.checks:
        if not c.test(value):
            return f"{c.phrase}, got {value}"
    return None


def check_fields(cfg: Any) -> None:
    """Every option field's choices and checks (nested settings included); the first
    problem is one ``InputError`` naming its flag."""
    for f, o in option_fields(type(cfg)):
        value = getattr(cfg, f.name)
        if o.nested:
            check_fields(value)
            continue
        p = problem(o, value)
        if p is not None:
            raise InputError(f"{o.flag_for(f.name)} {p}")


# ---- the CLI


def add_options(
    p: argparse.ArgumentParser, cls: type, *, prefix: str = "", nested: bool = False
) -> None:
    """The CLI arguments of every ``cli`` option field of ``cls``, in field order, each group
    once. Nested settings' flags default to None (not given)."""
    groups: dict[str, Any] = {}
    for f, o in option_fields(cls):
        if not o.cli:
            continue
        if o.nested:
            add_options(p, base_type(cls, f.name), prefix=f"{prefix}{f.name}.", nested=True)
            continue
        where: Any = p
        if o.group is not None:
            where = groups.get(o.group) or _group(p, o.group)
            groups[o.group] = where
        _add(where, cls, f, o, prefix, nested)


def _group(p: argparse.ArgumentParser, title: str) -> Any:
    for g in p._action_groups:  # a group a nested class shares with its parent's fields
        if g.title == title:
            return g
    return p.add_argument_group(title)


def _add(
    where: Any, cls: type, f: dataclasses.Field[Any], o: Option, prefix: str, nested: bool
) -> None:
    flags = o.flags_for(f.name)
    dest = prefix + f.name
    kw: dict[str, Any] = {"dest": dest, "help": o.help}
    metavar = o.metavar or (flags[0].lstrip("-").replace("-", "_").upper() if prefix else None)
    default = None if nested else default_of(f)
    t = base_type(cls, f.name)
    if t is bool and o.parse is None:
        kw["action"] = "store_false" if default is True else "store_true"
        if nested:
            kw["default"] = None
    elif o.repeat:
        kw.update(action="append", default=None, metavar=metavar)
    else:
        kw.update(default=default, metavar=metavar)
        if o.choices is not None:
            kw["choices"] = o.choices
        if o.nargs is not None:
            kw.update(nargs=o.nargs, const=o.const)
        if o.parse is None and t in (int, float):
            kw["type"] = t
    where.add_argument(*flags, **kw)
    for flag, value, text in o.aliases:
        where.add_argument(flag, dest=dest, action="store_const", const=value, help=text)


def _value(
    args: argparse.Namespace, dest: str, f: dataclasses.Field[Any], o: Option, fallback: Any
) -> Any:
    raw = getattr(args, dest, fallback)
    return o.parse(raw) if o.parse is not None else raw


def nested_values(args: argparse.Namespace, cls: type, prefix: str) -> dict[str, Any]:
    """The nested settings given on the command line: field -> value, None where not given."""
    out: dict[str, Any] = {}
    for f, o in option_fields(cls):
        if not o.cli:
            continue
        v = _value(args, prefix + f.name, f, o, None)
        if o.sets:
            out.update(zip(o.sets, v if v is not None else (None,) * len(o.sets), strict=True))
        else:
            out[f.name] = v
    return out


def namespace_values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """Every top-level ``cli`` option of ``cls`` from parsed arguments (nested settings are
    the caller's: see ``nested_values``)."""
    out: dict[str, Any] = {}
    for f, o in option_fields(cls):
        if o.cli and not o.nested:
            out[f.name] = _value(args, f.name, f, o, default_of(f))
    return out


# ---- experiment files (the sweep's [run] table)


def sweep_keys(cls: type) -> dict[str, tuple[type, ...]]:
    """The ``[run]`` keys of an experiment file: name -> the kinds of value it takes."""
    return {f.name: kinds(cls, f.name) for f, o in option_fields(cls) if o.sweep}


def check_sweep_value(where: str, cls: type, key: str, value: Any) -> None:
    """An ``InputError`` (``exp.toml: [run] workers: must be >= 1, got 0``) when ``value``
    has the wrong kind or breaks the field's rules."""
    want = sweep_keys(cls)[key]
    if not isinstance(value, want) or (isinstance(value, bool) and bool not in want):
        raise InputError(
            f"{where} {key}: expected {' or '.join(k.__name__ for k in want)}, got {value!r}"
        )
    o = spec(next(f for f in dataclasses.fields(cls) if f.name == key))
    p = problem(o, value)
    if p is not None:
        raise InputError(f"{where} {key}: {p}")


# ---- what the declarations give: the sweep's axes, the plan, the load options


def axes(cls: type) -> dict[str, Option]:
    """The sweep's load axes: field name -> its option, in field order."""
    return {f.name: o for f, o in option_fields(cls) if o.axis is not None}


def integer_axes(cls: type) -> tuple[str, ...]:
    return tuple(k for k in axes(cls) if base_type(cls, k) is int)


def axis_values(cls: type, axis: str, point: float) -> dict[str, Any]:
    """The fields one point of a load axis sets: the axis (as its field's type) and the
    fields it implies (``Option.axis_sets``)."""
    o = axes(cls)[axis]
    return {axis: int(point) if base_type(cls, axis) is int else float(point), **dict(o.axis_sets)}


def plan_values(cfg: Any) -> dict[str, Any]:
    """The plan's fields from the options declared ``plan``: plan field -> value."""
    return {
        (o.plan if isinstance(o.plan, str) else f.name): getattr(cfg, f.name)
        for f, o in option_fields(type(cfg))
        if o.plan
    }


def option_kinds(cls: type, prefix: str = "") -> dict[str, str]:
    """Every recorded option's kind, nested settings as ``agentx.preset``: run.json's
    ``option_kinds``."""
    out: dict[str, str] = {}
    for f, o in option_fields(cls):
        if o.nested:
            out.update(option_kinds(base_type(cls, f.name), f"{prefix}{f.name}."))
        elif o.kind is not None and o.record:
            out[prefix + f.name] = o.kind
    return out


# ---- run.json


def record_options(cfg: Any) -> dict[str, Any]:
    """run.json's ``options``: every recorded field, credentials redacted."""
    out = {f.name: _jsonable(getattr(cfg, f.name)) for f, o in option_fields(type(cfg)) if o.record}
    return dict(redact(out))


def _jsonable(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return dataclasses.asdict(v)
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    return v
