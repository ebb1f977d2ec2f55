"""Experiment files: strict keys with one-line errors; the interleaved schedule."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from agent_replay.errors import InputError
from agent_replay.replay.sweep.experiment import load_experiment
from agent_replay.replay.sweep.runner import schedule

BASE = """
trace = "t.parquet"
repeats = 3
seed = 7
[load]
axis = "concurrent_sessions"
points = [1, 2, 4]
[run]
speedup = 4
[[targets]]
name = "a"
sim = "fast"
[[targets]]
name = "b"
url = "http://127.0.0.1:9"
gpus = 2
usd_per_gpu_hour = 2.5
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "t.parquet").write_bytes(b"")
    p = tmp_path / "exp.toml"
    p.write_text(text)
    return p


def test_reads_a_valid_file(tmp_path: Path) -> None:
    exp = load_experiment(_write(tmp_path, BASE))
    assert exp.axis == "concurrent_sessions" and exp.points == (1.0, 2.0, 4.0)
    assert [t.name for t in exp.targets] == ["a", "b"]
    assert exp.targets[1].gpus == 2 and exp.targets[1].usd_per_gpu_hour == 2.5
    assert exp.run == {"speedup": 4} and exp.repeats == 3
    assert exp.output == str((Path("sweeps") / "exp").resolve())


@pytest.mark.parametrize(
    "text, expect",
    [
        ("bogus = 1\n" + BASE, "exp.toml: unknown key 'bogus'"),
        (BASE.replace("speedup = 4", "spedup = 4"), "exp.toml: [run]: unknown key 'spedup'"),
        (
            BASE.replace('axis = "concurrent_sessions"', 'axis = "users"'),
            "[load] axis: must be one of",
        ),
        (
            BASE.replace("points = [1, 2, 4]", "points = [1, 2.5]"),
            "[load] points: 2.5 is not a valid concurrent_sessions",
        ),
        (BASE.replace('name = "b"', 'name = "a"'), "targets: name 'a' is used twice"),
        (
            BASE.replace('url = "http://127.0.0.1:9"', 'url = "127.0.0.1:9"'),
            "targets[1] url: expected an http(s) URL",
        ),
        (BASE.replace("gpus = 2", "gpus = 0"), "targets[1] gpus: must be >= 1"),
        (
            BASE.replace("[run]\nspeedup = 4", "[run]\nconcurrent_sessions = 4"),
            "a load axis; set it in [load]",
        ),
        ("slo = 'p90_tps>>3'\n" + BASE, "exp.toml: slo: --slo: 'p90_tps>>3'"),
        (BASE.replace("repeats = 3", "repeats = 'x'"), "exp.toml repeats: expected int"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(tmp_path: Path, text: str, expect: str) -> None:
    with pytest.raises(InputError) as err:
        load_experiment(_write(tmp_path, text))
    msg = str(err.value)
    assert expect in msg and "\n" not in msg


def test_missing_trace_and_bad_toml(tmp_path: Path) -> None:
    p = tmp_path / "exp.toml"
    p.write_text(BASE)
    with pytest.raises(InputError, match="trace: .*t.parquet does not exist"):
        load_experiment(p)
    p.write_text("trace = [")
    with pytest.raises(InputError, match="not valid TOML"):
        load_experiment(p)


def test_schedule_interleaves_every_repeat_over_every_target() -> None:
    slots = schedule(3, (1.0, 2.0, 4.0, 8.0), repeats=3, seed=5)
    assert len(slots) == 36 and [s.order for s in slots] == list(range(36))
    # repeat-major: all of repeat 0, then 1, then 2; each repeat runs every (target, point) once
    assert [s.repeat for s in slots] == sorted(s.repeat for s in slots)
    for r in range(3):
        cells = Counter((s.target, s.point) for s in slots if s.repeat == r)
        assert len(cells) == 12 and set(cells.values()) == {1}
    # a target's points form one visit per repeat
    for r in range(3):
        seq = [s.target for s in slots if s.repeat == r]
        assert [seq[i] for i in range(0, 12, 4)] == [seq[i + 3] for i in range(0, 12, 4)]
    # seeded: the same seed gives the same order, another seed another one
    assert schedule(3, (1.0, 2.0, 4.0, 8.0), 3, 5) == slots
    assert schedule(3, (1.0, 2.0, 4.0, 8.0), 3, 6) != slots
    # balanced: each repeat's target order is the last one rotated by one place (a Latin
    # square), so over 3 repeats every target goes first, second and last once
    orders = [tuple(dict.fromkeys(s.target for s in slots if s.repeat == r)) for r in range(3)]
    assert orders[1] == orders[0][1:] + orders[0][:1] and orders[2] == orders[1][1:] + orders[1][:1]
    for pos in range(3):
        assert sorted(o[pos] for o in orders) == [0, 1, 2]


@pytest.mark.parametrize("n_targets,repeats", [(2, 3), (2, 4), (3, 7), (4, 8), (5, 3)])
def test_every_target_goes_first_equally_often(n_targets: int, repeats: int) -> None:
    for seed in range(5):
        slots = schedule(n_targets, (1.0, 2.0), repeats=repeats, seed=seed)
        first = Counter(next(s.target for s in slots if s.repeat == r) for r in range(repeats))
        counts = [first.get(t, 0) for t in range(n_targets)]
        # as equal as the repeats allow: a multiple of the targets gives exactly equal counts
        assert max(counts) - min(counts) <= (0 if repeats % n_targets == 0 else 1), (seed, counts)
