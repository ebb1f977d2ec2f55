"""Failed or cancelled: one rule for every count of unsuccessful requests.

A request still in flight when the run's own stop came (Ctrl-C, SIGTERM,
``--abort-after-failures``, ``--duration``) ends with error kind ``cancelled``: the server did
not fail it, so it is counted as cancelled, never as failed. Every other unsuccessful request
is failed. The run summary, the live dashboard, the report and ``compare`` all split their
counts with ``split``, so they show the same two numbers.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent_replay.results_schema import ErrorKind


def split(errors: Mapping[str, int]) -> tuple[int, int]:
    """(failed, cancelled) from the unsuccessful requests counted by error kind."""
    cancelled = int(errors.get(ErrorKind.CANCELLED, 0))
    return int(sum(errors.values())) - cancelled, cancelled


def text(errors: Mapping[str, int]) -> str:
    """``3 failed`` or ``3 failed, 59 cancelled by the stop``."""
    failed, cancelled = split(errors)
    return f"{failed:,} failed" + (f", {cancelled:,} cancelled by the stop" if cancelled else "")
