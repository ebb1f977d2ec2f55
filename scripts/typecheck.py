"""mypy over the one import root: ``agent_replay`` and its subpackages, each top-level folder
(replay/, traces/, engines/, analysis/) under the name pyproject's ``package-dir`` gives it.

mypy finds modules by their path, and an editable install maps these folders with an import
hook mypy does not run, so plain ``mypy`` would see only ``agent_replay/*.py``. This names
every file's module for it; flags come from pyproject's ``[tool.mypy]``. Extra arguments go
to mypy (e.g. ``--no-incremental``). Run from anywhere: ``python scripts/typecheck.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = ("traces", "engines", "analysis", "replay")


def sources() -> list[BuildSource]:
    out = []
    for sub in SUBPACKAGES:
        for path in sorted((ROOT / sub).rglob("*.py")):
            parts = ["agent_replay", *path.relative_to(ROOT).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out.append(BuildSource(str(path.relative_to(ROOT)), ".".join(parts), None, str(ROOT)))
    return out


def main(argv: list[str]) -> int:
    os.chdir(ROOT)
    found, options = process_options(argv)  # pyproject's packages = ["agent_replay"]
    try:
        result = build.build(found + sources(), options)
        errors = result.errors
    except CompileError as e:
        errors = e.messages
    for line in errors:
        print(line)
    n = len({s.module for s in found}) + len(sources())
    if any(": error:" in line for line in errors):
        return 1
    print(f"Success: no issues found in {n} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
