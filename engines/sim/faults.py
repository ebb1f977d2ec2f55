"""Fault injection for the simulated engine: parsed from the profile or ``X-Sim-Fault``.

Syntax: ``key=value`` pairs separated by ``;`` or ``,``. Keys:

- ``error=P``: answer a fraction P (0-1) of requests with HTTP ``status`` (default 500) and
  vLLM's error body, before any streaming. The draw is seeded per request.
- ``status=N``: the status code for ``error`` (500-599).
- ``reset_after=N``: reset the TCP connection (RST) after N chunks were written.
- ``stall_after=N`` with ``stall_ms=M``: after N chunks, the request stops being scheduled
  for M milliseconds (it keeps its batch slot), then continues.
- ``malformed_after=N``: chunk N+1 is sent as invalid JSON (the stream then continues).
- ``truncate_after=N``: after N chunks, write half of the next event and close.
- ``usage_scale=K``: a lying usage: the final ``usage`` reports K times the completion
  tokens the stream carried (streams only).
- ``empty=P``: a fraction P of the streamed requests is answered 200 with no tokens: no
  content event, then the end (finish reason and usage of 0 tokens). The draw is seeded
  per request.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent_replay.errors import InputError


@dataclass(frozen=True, slots=True)
class FaultSpec:
    error: float = 0.0
    status: int = 500
    reset_after: int = -1
    stall_after: int = -1
    stall_ms: float = 0.0
    malformed_after: int = -1
    truncate_after: int = -1
    usage_scale: float = 1.0
    empty: float = 0.0

    @property
    def any_stream_fault(self) -> bool:
        return (
            self.reset_after >= 0
            or self.stall_after >= 0
            or self.malformed_after >= 0
            or self.truncate_after >= 0
        )

    @property
    def lies(self) -> bool:
        """The answer's content is false (``usage_scale``, ``empty``): the sink encodes it."""
        return self.usage_scale != 1.0 or self.empty > 0.0


NO_FAULTS = FaultSpec()
_INT_KEYS = ("status", "reset_after", "stall_after", "malformed_after", "truncate_after")
_FLOAT_KEYS = ("error", "stall_ms", "usage_scale", "empty")


def parse_faults(text: str, *, source: str = "X-Sim-Fault") -> FaultSpec:
    """Parse a fault string; raises InputError naming the bad part."""
    text = text.strip()
    if not text:
        return NO_FAULTS
    values: dict[str, float | int] = {}
    for part in text.replace(",", ";").split(";"):
        part = part.strip()
        if not part:
            continue
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or key not in _INT_KEYS + _FLOAT_KEYS:
            raise InputError(
                f"{source}: cannot parse {part!r} (keys: {', '.join(_FLOAT_KEYS + _INT_KEYS)})"
            )
        try:
            values[key] = int(raw) if key in _INT_KEYS else float(raw)
        except ValueError:
            raise InputError(f"{source}: {key} needs a number, got {raw.strip()!r}") from None
    spec = FaultSpec(**values)  # type: ignore[arg-type]
    if not 0.0 <= spec.error <= 1.0:
        raise InputError(f"{source}: error must be within [0, 1]")
    if not 0.0 <= spec.empty <= 1.0:
        raise InputError(f"{source}: empty must be within [0, 1]")
    if not 0.0 <= spec.usage_scale <= 1e6:
        raise InputError(f"{source}: usage_scale must be within [0, 1e6]")
    if not 500 <= spec.status <= 599:
        raise InputError(f"{source}: status must be a 5xx code")
    return spec
