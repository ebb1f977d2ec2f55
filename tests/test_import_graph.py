"""The import graph, read from the source with ``ast`` (every import, also those inside
functions): data flows traces -> engines/analysis -> replay, and no shipped module leans
on a test fixture."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("traces", "engines", "analysis", "replay")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import in ``path``, relative ones resolved."""
    return list(_imports(path, path.stat().st_mtime_ns))


@functools.cache
def _imports(path: Path, _mtime: int) -> tuple[tuple[int, str], ...]:
    return tuple(_walk(path))


def _walk(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]  # the package a relative import starts from
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield node.lineno, mod
            for alias in node.names:  # ``from analysis import fixtures``
                yield node.lineno, f"{mod}.{alias.name}"


def production_modules() -> Iterator[tuple[str, Path]]:
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield pkg, path


def _is_fixture(mod: str) -> bool:
    parts = mod.split(".")
    return parts[0] == "tests" or any(p in ("fixtures", "conftest") for p in parts)


def test_the_graph_reader_sees_lazy_relative_and_from_imports(tmp_path):
    pkg = ROOT / "analysis"
    src = pkg / "_graph_probe.py"
    src.write_text("def f():\n    from analysis import fixtures\n    from . import hist\n")
    try:
        got = {m for _, m in imports(src)}
    finally:
        src.unlink()
    assert {"analysis.fixtures", "analysis.hist"} <= got


def test_no_shipped_module_imports_a_test_fixture():
    bad = [f"{path.relative_to(ROOT)}:{line}: imports {mod}"
           for _, path in production_modules() for line, mod in imports(path) if _is_fixture(mod)
           and not _module_name(path).endswith("fixtures")]
    assert bad == []


def test_only_replay_imports_replay():
    bad = [f"{path.relative_to(ROOT)}:{line}: imports {mod}"
           for pkg, path in production_modules() if pkg != "replay"
           for line, mod in imports(path) if mod.split(".")[0] == "replay"]
    assert bad == []
