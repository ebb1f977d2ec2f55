"""Counters that merge by declaration: each field says how two values of it combine (sum,
largest, keyed sum, ...), and ``Counters.merge_counts`` adds another object's counts by
those rules. A worker's summary, the run's merged summary and the live statistics merged
across workers are such objects: a new count is one declared field, never a line in a
hand-written merge.

A dataclass declares a field with ``counter(default, rule)``; a plain class (one with a
hand-written ``__init__``) lists its rules in ``MERGES``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

Merge = Callable[[Any, Any], Any]
RULE = "agent_replay.merge"
"""The key of a field's merge rule in its dataclass metadata."""


def add(a: Any, b: Any) -> Any:
    """Sum (numbers); concatenation (lists, bytes)."""
    return a + b


def largest(a: Any, b: Any) -> Any:
    return max(a, b)


def first(a: Any, b: Any) -> Any:
    """The first value that is not None (a worker's first error, say)."""
    return a if a is not None else b


def either(a: bool, b: bool) -> bool:
    return bool(a or b)


def keyed(a: Mapping[Any, Any], b: Mapping[Any, Any]) -> dict[Any, Any]:
    """Per-key sum: {"timeout": 2} + {"timeout": 1, "http": 3} = {"timeout": 3, "http": 3}."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out[k] + v if k in out else v
    return out


def keyed_lists(a: Mapping[Any, list[int]], b: Mapping[Any, list[int]]) -> dict[Any, list[int]]:
    """Per-key, element-wise sum of equal-length lists."""
    out = {k: list(v) for k, v in a.items()}
    for k, v in b.items():
        out[k] = [x + y for x, y in zip(out[k], v, strict=True)] if k in out else list(v)
    return out


def keyed_by(rules: Mapping[Any, Merge], default: Merge) -> Merge:
    """Per-key merge with a rule per key (``default`` for the others)."""

    def merge(a: Mapping[Any, Any], b: Mapping[Any, Any]) -> dict[Any, Any]:
        out = dict(a)
        for k, v in b.items():
            out[k] = rules.get(k, default)(out[k], v) if k in out else v
        return out

    return merge


def merged_by(rule: Merge) -> dict[str, Merge]:
    """Field metadata declaring a merge rule, for a field with a default factory:
    ``field(default_factory=dict, metadata=merged_by(keyed))``."""
    return {RULE: rule}


def counter(
    default: Any = 0, rule: Merge = add, *, factory: Callable[[], Any] | None = None
) -> Any:
    """A dataclass field that is a count merged by ``rule``."""
    meta = {RULE: rule}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class Counters:
    """Something with counts that merge by declared rules."""

    MERGES: ClassVar[Mapping[str, Merge]] = {}
    """Rules of a plain class's attributes (a dataclass declares them on its fields)."""

    @classmethod
    def merges(cls) -> dict[str, Merge]:
        """Every counted attribute and its rule."""
        out = dict(cls.MERGES)
        if dataclasses.is_dataclass(cls):
            out.update(
                {f.name: f.metadata[RULE] for f in dataclasses.fields(cls) if RULE in f.metadata}
            )
        return out

    def merge_counts(self, other: Any) -> None:
        """Add ``other``'s counts (any object with the attributes; those it lacks are left
        as they are) into this one by this class's rules."""
        for name, rule in self.merges().items():
            if hasattr(other, name):
                setattr(self, name, rule(getattr(self, name), getattr(other, name)))


def merge_all(into: Counters, items: Iterable[Any]) -> Counters:
    """``into`` with every item's counts merged in, in order."""
    for item in items:
        into.merge_counts(item)
    return into
