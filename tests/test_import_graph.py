"""The import graph, read from the source with ``ast`` (every import, also those inside
functions). Everything installs under one root, ``agent_replay``; its base (errors, the
secrets policy, the results schema) imports nothing of the project; ``traces``, ``engines``
and ``analysis`` stand side by side on the base; only ``replay`` imports ``replay``; no
shipped module leans on a test fixture."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOT_PKG = "agent_replay"
PACKAGES = ("traces", "engines", "analysis", "replay")
"""Subpackages of the root, each a top-level folder of the repository (linked into
``agent_replay/``)."""
BASE = ("errors", "redact", "results_schema")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] != ROOT_PKG and parts[0] in PACKAGES:
        parts.insert(0, ROOT_PKG)
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
            for alias in node.names:  # ``from agent_replay.analysis import fixtures``
                yield node.lineno, f"{mod}.{alias.name}"


def production_modules() -> Iterator[tuple[str, Path]]:
    """(subpackage or "" for the base, path) of every shipped module, each file once."""
    for path in sorted((ROOT / ROOT_PKG).glob("*.py")):
        yield "", path
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield pkg, path


def _sub(mod: str) -> str:
    """The subpackage a module belongs to ("" for the base, "?" outside the project)."""
    parts = mod.split(".")
    if parts[0] != ROOT_PKG:
        return "?"
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else ""


def _is_fixture(mod: str) -> bool:
    parts = mod.split(".")
    return parts[0] == "tests" or any(p in ("fixtures", "conftest") for p in parts)


def _where(path: Path, line: int, mod: str) -> str:
    return f"{path.relative_to(ROOT)}:{line}: imports {mod}"


def test_the_graph_reader_sees_lazy_relative_and_from_imports():
    src = ROOT / "analysis" / "_graph_probe.py"
    src.write_text("def f():\n    from agent_replay.analysis import fixtures\n"
                   "    from . import hist\n    from ..replay import run\n")
    try:
        got = {m for _, m in imports(src)}
    finally:
        src.unlink()
    assert {"agent_replay.analysis.fixtures", "agent_replay.analysis.hist",
            "agent_replay.replay.run"} <= got
    assert _sub("agent_replay.replay.run") == "replay" and _sub("agent_replay.errors") == ""


def test_every_subpackage_is_linked_under_the_one_root():
    for pkg in PACKAGES:
        link = ROOT / ROOT_PKG / pkg
        assert link.is_symlink() and link.resolve() == (ROOT / pkg).resolve(), link
    names = {_module_name(p) for _, p in production_modules()}
    assert {"agent_replay.errors", "agent_replay.redact", "agent_replay.results_schema",
            "agent_replay.replay.run", "agent_replay.traces.schema"} <= names


def test_nothing_imports_a_package_outside_the_root():
    """``replay``, ``traces``, ``engines`` and ``analysis`` are never imported bare (PyPI's
    ``traces`` is another project): not by the code, the tests or the benchmarks."""
    files = [p for _, p in production_modules()]
    files += sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    bad = [_where(path, line, mod) for path in files for line, mod in imports(path)
           if mod.split(".")[0] in PACKAGES]
    assert bad == []


def test_the_base_imports_nothing_of_the_project():
    bad = [_where(path, line, mod) for pkg, path in production_modules()
           if pkg == "" and path.name != "__main__.py"  # the entry point runs the CLI
           for line, mod in imports(path) if _sub(mod) in PACKAGES]
    assert bad == []


def test_traces_engines_and_analysis_stand_side_by_side_on_the_base():
    bad = [_where(path, line, mod) for pkg, path in production_modules()
           if pkg in ("traces", "engines", "analysis")
           for line, mod in imports(path) if _sub(mod) not in ("?", "", pkg)]
    assert bad == []


def test_no_shipped_module_imports_a_test_fixture():
    bad = [_where(path, line, mod)
           for _, path in production_modules() for line, mod in imports(path) if _is_fixture(mod)
           and not _module_name(path).endswith("fixtures")]
    assert bad == []


def test_only_replay_imports_replay():
    bad = [_where(path, line, mod)
           for pkg, path in production_modules() if pkg not in ("replay", "")
           for line, mod in imports(path) if _sub(mod) == "replay"]
    assert bad == []
