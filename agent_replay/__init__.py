"""agent-replay: record coding-agent sessions as Parquet traces and replay them, with their
original timing, against LLM serving deployments.

One import root. ``agent_replay.traces`` (the trace model), ``agent_replay.engines`` (the
simulated engine, vLLM launch and profiles, telemetry) and ``agent_replay.analysis``
(metrics, reports, comparisons) stand side by side: besides themselves they import only the
base here, ``agent_replay.errors`` (the exception hierarchy), ``agent_replay.redact`` (the secrets
policy) and ``agent_replay.results_schema`` (the Parquet schemas a run writes).
``agent_replay.replay`` (the runtime and the CLI) imports them all.
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

__version__ = "0.1.0"

SUBPACKAGES = ("traces", "engines", "analysis", "replay")
"""The subpackages, each a top-level folder of the source tree (pyproject maps them)."""


class _SourceTree:
    """Finds ``agent_replay.<folder>`` in a source checkout's top-level folders.

    An installed wheel holds the subpackages inside this folder and an editable install maps
    them (pyproject's ``package-dir``); a checkout on ``sys.path`` (``PYTHONPATH``, or
    ``python -m agent_replay`` from its root) gets the same mapping from this finder, so every
    module still has one name and one file."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> ModuleSpec | None:
        pkg, _, sub = fullname.rpartition(".")
        if pkg != __name__ or sub not in SUBPACKAGES:
            return None
        return PathFinder.find_spec(fullname, [self.root])


def _map_source_tree() -> None:
    here = Path(__file__).resolve().parent
    if (here / "traces").is_dir() or not (here.parent / "pyproject.toml").is_file():
        return  # installed: the subpackages are in place
    if not any(isinstance(f, _SourceTree) for f in sys.meta_path):
        # first: the subpackages come from the checkout this package came from, even where
        # an editable install of another checkout maps the same names
        sys.meta_path.insert(0, _SourceTree(here.parent))


_map_source_tree()
