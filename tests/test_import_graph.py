"""The import graph, read with ``ast`` (every import, also those inside functions) from the
files of the package as Python imports it: ``agent_replay`` and the subpackages it maps, walked
from where the import system finds them, so the test checks the tree that runs. Everything
installs under one root, ``agent_replay``; its base (errors, the secrets policy, the results
schema) imports nothing of the project; ``traces``, ``engines`` and ``analysis`` stand side by
side on the base; only ``replay`` imports ``replay``; no shipped module leans on a test fixture.

Run as a script it prints every violation and exits 1 when there is one: the test that plants
a back-arrow in a copy of the tree runs it there."""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOT_PKG = "agent_replay"
PACKAGES = ("traces", "engines", "analysis", "replay")
"""Subpackages of the root, each a top-level folder of the repository (pyproject maps them)."""
BASE = ("errors", "redact", "results_schema")


@functools.cache
def _modules() -> dict[Path, str]:
    """Every shipped module's file and name, found through the import system."""
    spec = importlib.util.find_spec(ROOT_PKG)
    assert spec is not None and spec.submodule_search_locations is not None
    out: dict[Path, str] = {}

    def walk(name: str, dirs: list[str]) -> None:
        for info in pkgutil.iter_modules(dirs):
            path = Path(info.module_finder.path) / info.name  # type: ignore[union-attr]
            if info.ispkg:
                out[(path / "__init__.py").resolve()] = f"{name}.{info.name}"
                walk(f"{name}.{info.name}", [str(path)])
            else:
                out[path.with_suffix(".py").resolve()] = f"{name}.{info.name}"

    init = Path(spec.origin or "").resolve()
    out[init] = ROOT_PKG
    walk(ROOT_PKG, list(spec.submodule_search_locations))
    for sub in PACKAGES:
        s = importlib.util.find_spec(f"{ROOT_PKG}.{sub}")
        assert s is not None and s.origin and s.submodule_search_locations, sub
        out[Path(s.origin).resolve()] = f"{ROOT_PKG}.{sub}"
        walk(f"{ROOT_PKG}.{sub}", list(s.submodule_search_locations))
    return out


def _module_name(path: Path) -> str:
    name = _modules().get(path.resolve())
    if name is None:  # a file outside the package (tests, benchmarks) or made after the walk
        parts = list(path.resolve().relative_to(ROOT).with_suffix("").parts)
        if parts[0] in PACKAGES:
            parts.insert(0, ROOT_PKG)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
    return name


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
    for path, name in sorted(_modules().items(), key=lambda kv: kv[1]):
        yield _sub(name), path


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
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return f"{where}:{line}: imports {mod}"


def test_the_graph_reader_sees_lazy_relative_and_from_imports():
    _modules()  # walked before the probe exists: it is not a shipped module
    src = ROOT / "analysis" / "_graph_probe.py"
    src.write_text(
        "def f():\n    from agent_replay.analysis import fixtures\n"
        "    from . import hist\n    from ..replay import run\n"
    )
    try:
        got = {m for _, m in imports(src)}
    finally:
        src.unlink()
    assert {
        "agent_replay.analysis.fixtures",
        "agent_replay.analysis.hist",
        "agent_replay.replay.run",
    } <= got
    assert _sub("agent_replay.replay.run") == "replay" and _sub("agent_replay.errors") == ""


def test_every_subpackage_is_its_top_level_folder_under_the_one_root():
    names = {name: path for path, name in _modules().items()}
    for pkg in PACKAGES:
        assert names[f"{ROOT_PKG}.{pkg}"] == ROOT / pkg / "__init__.py", pkg
        assert not (ROOT / ROOT_PKG / pkg).exists(), "a link would give its modules two names"
    assert {
        "agent_replay.errors",
        "agent_replay.redact",
        "agent_replay.results_schema",
        "agent_replay.replay.run",
        "agent_replay.traces.schema",
    } <= set(names)
    assert len(names) == len(_modules())  # one name per file


def test_pyproject_ships_every_package_folder():
    tomllib = pytest.importorskip("tomllib")
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {name for path, name in _modules().items() if path.name == "__init__.py"}
    assert set(conf["packages"]) == packages
    assert conf["package-dir"] == {f"{ROOT_PKG}.{p}": p for p in PACKAGES}
    for pkg, globs in conf["package-data"].items():
        top = ".".join(pkg.split(".")[:2])
        folder = (
            ROOT / conf["package-dir"][top] / Path(*pkg.split(".")[2:])
            if top in conf["package-dir"]
            else ROOT / Path(*pkg.split("."))
        )
        assert all(list(folder.glob(g)) for g in globs), (pkg, globs)
    assert conf["package-data"][ROOT_PKG] == ["py.typed"]  # PEP 561: typed for its users
    assert (ROOT / ROOT_PKG / "py.typed").is_file()


def test_a_folder_imported_by_its_bare_name_refuses_in_one_line():
    """With the repository root on sys.path (``python -m agent_replay`` from it), ``import
    traces`` would load the folder a second time as another module; it refuses instead."""
    code = (
        "import sys, agent_replay.traces.schema as s\n"
        "try:\n    import traces\nexcept ImportError as e:\n    print('refused:', e)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('traces', 'engines', 'analysis', 'replay')), s.__file__)\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert got.returncode == 0, got.stderr
    first, second = got.stdout.splitlines()
    assert first == "refused: import agent_replay.traces, not traces"
    assert second == f"[] {ROOT / 'traces' / 'schema.py'}"


def test_a_back_arrow_planted_in_a_copy_of_the_tree_fails_the_check(tmp_path: Path):
    """This module run on a copy of the tree whose ``traces`` imports ``replay``: the copy's
    own package is the one walked (even where an editable install maps this checkout)."""
    ignore = shutil.ignore_patterns("__pycache__")
    for name in (ROOT_PKG, *PACKAGES, "tests"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    script = [sys.executable, str(tmp_path / "tests" / "test_import_graph.py")]
    clean = subprocess.run(
        script, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert clean.returncode == 0, clean.stdout + clean.stderr
    (tmp_path / "traces" / "back.py").write_text("from agent_replay.replay import run\n")
    got = subprocess.run(script, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 1
    assert "traces/back.py:1: imports agent_replay.replay.run" in got.stdout, got.stdout


def test_nothing_imports_a_package_outside_the_root():
    """``replay``, ``traces``, ``engines`` and ``analysis`` are never imported bare (PyPI's
    ``traces`` is another project): not by the code, the tests or the benchmarks."""
    files = [p for _, p in production_modules()]
    files += sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    bad = [
        _where(path, line, mod)
        for path in files
        for line, mod in imports(path)
        if mod.split(".")[0] in PACKAGES
    ]
    assert bad == []


def base_arrows() -> list[str]:
    return [
        _where(path, line, mod)
        for pkg, path in production_modules()
        if pkg == "" and path.name != "__main__.py"  # the entry point runs the CLI
        for line, mod in imports(path)
        if _sub(mod) in PACKAGES
    ]


def cross_arrows() -> list[str]:
    return [
        _where(path, line, mod)
        for pkg, path in production_modules()
        if pkg in ("traces", "engines", "analysis")
        for line, mod in imports(path)
        if _sub(mod) not in ("?", "", pkg)
    ]


def fixture_arrows() -> list[str]:
    return [
        _where(path, line, mod)
        for _, path in production_modules()
        for line, mod in imports(path)
        if _is_fixture(mod) and not _module_name(path).endswith("fixtures")
    ]


def replay_arrows() -> list[str]:
    return [
        _where(path, line, mod)
        for pkg, path in production_modules()
        if pkg not in ("replay", "")
        for line, mod in imports(path)
        if _sub(mod) == "replay"
    ]


def wire_arrows() -> list[str]:
    """The wire code (``engines.apis``, ``engines.sse``, ``engines.dialects``) serves the
    simulated engine and never imports it."""
    wire = (
        "agent_replay.engines.apis",
        "agent_replay.engines.sse",
        "agent_replay.engines.dialects",
        "agent_replay.engines.replies",
    )
    return [
        _where(path, line, mod)
        for _, path in production_modules()
        if _module_name(path).startswith(wire)
        for line, mod in imports(path)
        if mod.startswith("agent_replay.engines.sim")
    ]


_BARE = re.compile(r"(?<!`)\b(?:from|import) (?:traces|engines|analysis|replay)\b(?!\.md)")
"""A bare import in code (an import quoted in prose, in backticks, is not one)."""


def test_no_script_or_doc_imports_a_folder_by_its_bare_name():
    """Code in strings, shell scripts and docs (``python -c '...'``) imports through the root
    too: a bare folder name is refused at import time."""
    files = [
        p
        for p in (
            *ROOT.glob("benchmarks/**/*"),
            *ROOT.glob("scripts/**/*"),
            *ROOT.glob("tests/**/*.py"),
            *ROOT.glob("docs/*.md"),
            ROOT / "README.md",
        )
        if p.suffix in (".py", ".sh", ".md")
        and p.name
        not in (
            "test_import_graph.py",  # its refusal test imports one
            "test_install_beside_traces.py",
        )  # PyPI's traces, on purpose
        and "journal" not in p.parts
        and "results" not in p.parts
    ]
    bad = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if _BARE.search(line)
    ]
    assert bad == []


def test_the_base_imports_nothing_of_the_project():
    assert base_arrows() == []


def test_traces_engines_and_analysis_stand_side_by_side_on_the_base():
    assert cross_arrows() == []


def test_no_shipped_module_imports_a_test_fixture():
    assert fixture_arrows() == []


def test_only_replay_imports_replay():
    assert replay_arrows() == []


def test_the_wire_code_never_imports_the_simulated_engine():
    assert wire_arrows() == []


if __name__ == "__main__":
    bad = sorted(
        {*base_arrows(), *cross_arrows(), *fixture_arrows(), *replay_arrows(), *wire_arrows()}
    )
    print("\n".join(bad) or f"{len(_modules())} modules, no arrow against the layout")
    sys.exit(1 if bad else 0)
