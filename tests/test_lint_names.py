"""scripts/lint_names.py: one-letter names outside comprehensions, lambdas and math letters,
counted per file and held to a ratchet."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("lint_names", ROOT / "scripts" / "lint_names.py")
assert _spec is not None and _spec.loader is not None
lint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lint)

SOURCE = """
def f(a, rows, *, k=1):
    b = [r for r in rows]
    total = sum(x for x in rows)
    key = lambda q: q.name
    for i, (c, d) in enumerate(rows):
        pass
    with open("p") as fh, open("q") as g:
        pass
    try:
        pass
    except OSError as e:
        pass
    if (m := total):
        return m
"""


def test_it_finds_bound_one_letter_names_but_not_comprehensions_lambdas_or_math(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.py"
    path.write_text(SOURCE)
    # a, b, c, d, g, e, m; not r, x, q (comprehensions, lambda), i, k (math) nor _
    assert lint.names_in(path) == [
        (2, "a"),
        (3, "b"),
        (6, "c"),
        (6, "d"),
        (8, "g"),
        (12, "e"),
        (14, "m"),
    ]


def test_a_file_over_its_baseline_is_named_with_its_lines(tmp_path: Path) -> None:
    found = {"replay/x.py": [(3, "b"), (7, "c")], "replay/y.py": [(1, "q")]}
    lines = lint.over_baseline(found, {"replay/x.py": 1, "replay/y.py": 1})
    assert lines == [
        "replay/x.py: 2 one-letter names, 1 allowed (scripts/one_letter_names.json); "
        "lines: 3 'b', 7 'c'"
    ]
    assert lint.over_baseline(found, {"replay/x.py": 2, "replay/y.py": 5}) == []


def test_the_project_holds_its_baseline() -> None:
    import json

    assert lint.over_baseline(lint.counts(), json.loads(lint.BASELINE.read_text())) == []
