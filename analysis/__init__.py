"""Pure computation and presentation over the results dataset: per-request metrics,
histograms, percentiles, goodput, economics, comparison, dashboard, report, plots.

Reads only the results and trace schemas; never imports ``replay``.
"""

from __future__ import annotations

if __name__ != "agent_replay.analysis":  # the folder on sys.path would be a second copy
    raise ImportError(f"import agent_replay.analysis, not {__name__}")

from agent_replay.results_schema import (
    REQUEST_SCHEMA,
    RESULTS_SCHEMA_VERSION,
    SERVER_METRICS_SCHEMA,
)

__all__ = ["REQUEST_SCHEMA", "RESULTS_SCHEMA_VERSION", "SERVER_METRICS_SCHEMA"]
