"""One-letter names outside comprehensions and math, per file, against a ratchet.

    python scripts/lint_names.py            # exit 1 when a file has more than its baseline
    python scripts/lint_names.py --update   # write the current counts as the baseline

A one-letter name says nothing to a reader: the names a function binds (its parameters,
assignments, loop and ``with`` / ``except`` targets) must be words, except inside a
comprehension or a lambda, where the expression beside it says what it is, and the letters
of math (``MATH``). The files written before this rule keep their count
(``scripts/one_letter_names.json``) and may only lower it; a new file starts at 0.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent_replay", "analysis", "engines", "replay", "traces")
BASELINE = ROOT / "scripts" / "one_letter_names.json"
MATH = frozenset("ijknxyzt")
"""Index, count, coordinate and time letters: the names of math, kept."""


def _targets(node: ast.AST) -> Iterator[ast.Name]:
    """The names an assignment-like target binds."""
    if isinstance(node, ast.Name):
        yield node
    elif isinstance(node, (ast.Tuple, ast.List)):
        for elt in node.elts:
            yield from _targets(elt)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)


class _Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []

    def _flag(self, name: str, line: int) -> None:
        if len(name) == 1 and name != "_" and name not in MATH:
            self.found.append((line, name))

    def _args(self, args: ast.arguments) -> None:
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if arg is not None:
                self._flag(arg.arg, arg.lineno)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._args(node.args)
        self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._args(node.args)
        self.generic_visit(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:  # the expression names it
        return

    def _comprehension(self, node: ast.AST) -> None:
        return

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            for n in _targets(t):
                self._flag(n.id, n.lineno)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        for n in _targets(node.target):
            self._flag(n.id, n.lineno)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        for n in _targets(node.target):
            self._flag(n.id, n.lineno)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._flag(node.target.id, node.target.lineno)
        self.generic_visit(node)

    def _loop(self, node: ast.For | ast.AsyncFor) -> None:
        for n in _targets(node.target):
            self._flag(n.id, n.lineno)
        self.generic_visit(node)

    visit_For = visit_AsyncFor = _loop

    def _with(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            if item.optional_vars is not None:
                for n in _targets(item.optional_vars):
                    self._flag(n.id, n.lineno)
        self.generic_visit(node)

    visit_With = visit_AsyncWith = _with

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._flag(node.name, node.lineno)
        self.generic_visit(node)


def names_in(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every one-letter name ``path`` binds outside comprehensions, lambdas
    and ``MATH``."""
    finder = _Finder()
    finder.visit(ast.parse(path.read_text(), filename=str(path)))
    return sorted(finder.found)


def counts(root: Path = ROOT) -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            found = names_in(path)
            if found:
                out[str(path.relative_to(root))] = found
    return out


def over_baseline(found: dict[str, list[tuple[int, str]]], baseline: dict[str, int]) -> list[str]:
    """One line per file that binds more one-letter names than its baseline allows."""
    lines = []
    for name, hits in sorted(found.items()):
        allowed = baseline.get(name, 0)
        if len(hits) > allowed:
            where = ", ".join(f"{line} {letter!r}" for line, letter in hits[:12])
            lines.append(
                f"{name}: {len(hits)} one-letter names, {allowed} allowed "
                f"(scripts/one_letter_names.json); lines: {where}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--update", action="store_true", help="write the current counts as the baseline"
    )
    args = ap.parse_args(argv)
    found = counts()
    if args.update:
        BASELINE.write_text(
            json.dumps({k: len(v) for k, v in found.items()}, indent=1, sort_keys=True) + "\n"
        )
        print(
            f"lint_names: baseline of {sum(map(len, found.values()))} names in "
            f"{len(found)} files written to {BASELINE.relative_to(ROOT)}"
        )
        return 0
    problems = over_baseline(found, json.loads(BASELINE.read_text()))
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
