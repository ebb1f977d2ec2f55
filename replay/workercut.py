"""A worker process that died mid-run without its report (``kill -9``, a crash), as its
pool saw it: which shard, how it ended, when the pool noticed, and what of its work has
rows. The pool stops the run on it (``pools.LocalProcessPool``); run.json keeps it under
``workers_cut`` and the run's summary says it in one line."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
from typing import Any


@dataclasses.dataclass
class WorkerCut:
    """Exit code, when the pool saw the death (CLOCK_MONOTONIC ns) and the run's t0; once
    counted, the worker's rows and how many of them came from its row journal."""

    shard: int
    shards: int
    exitcode: int
    noticed_ns: int
    t0_ns: int
    rows: int = 0
    recovered: int = 0

    @property
    def signal(self) -> str | None:
        """The signal that ended the worker (None: it exited with a code)."""
        if self.exitcode >= 0:
            return None
        with contextlib.suppress(ValueError):
            return signal.Signals(-self.exitcode).name
        return f"signal {-self.exitcode}"

    def line(self) -> str:
        how = self.signal or f"exit code {self.exitcode}"
        return (
            f"worker {self.shard} (shard {self.shard} of {self.shards}) died ({how}) "
            f"{max(0, self.noticed_ns - self.t0_ns) / 1e9:.1f} s into the run"
        )

    def summary_line(self) -> str:
        return (
            f"{self.line()}: the run was stopped; its {self.rows} finished requests have "
            f"rows ({self.recovered} from its row journal), those it had in flight have none"
        )

    def record(self) -> dict[str, Any]:
        """Its entry in run.json's ``workers_cut``."""
        return {
            "shard": self.shard,
            "exitcode": self.exitcode,
            "signal": self.signal,
            "noticed_monotonic_ns": self.noticed_ns,
            "rows": self.rows,
            "rows_from_journal": self.recovered,
        }
