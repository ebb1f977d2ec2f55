"""compare refuses runs that differ in a load-shaping option, read from what each run's
run.json declares (``option_kinds``): an option added later is refused without a change to
compare."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from agent_replay.analysis.compare import check_comparable, differences
from agent_replay.errors import InputError
from agent_replay.replay.config import RunConfig
from agent_replay.replay.options import LOAD, OUTPUT, option, option_kinds, record_options


@dataclass(frozen=True)
class WithKnob(RunConfig):
    """A config with two more options: one shapes the load, one is where output goes."""

    knob: int = option(1, kind=LOAD, help="a new load option")
    label: str = option("a", kind=OUTPUT, help="a new output option")


def _meta(cfg: RunConfig) -> dict[str, Any]:
    """run.json's fields compare reads, as a run writes them (``replay.runrecord``)."""
    return {
        "run_meta_version": 1,
        "trace": {"path": cfg.trace, "sha256": "abc"},
        "target": {"model": "m"},
        "options": record_options(cfg),
        "option_kinds": option_kinds(type(cfg)),
    }


def test_the_max_think_pair_is_refused() -> None:
    a = _meta(RunConfig(trace="t", target="http://a:1", max_think_s=5.0))
    b = _meta(RunConfig(trace="t", target="http://b:1"))
    assert differences(a, b) == ["max_think_s 5.0 vs None"]
    with pytest.raises(
        InputError,
        match=r"^compare: not the same experiment \(B differs "
        r"from A: max_think_s 5.0 vs None\); pass --force to compare anyway$",
    ):
        check_comparable([a, b], ["A", "B"], force=False)


def test_a_field_added_as_load_is_refused_and_an_output_one_is_not() -> None:
    base = WithKnob(trace="t", target="http://a:1")
    assert differences(_meta(base), _meta(WithKnob(trace="t", target="http://b:1", knob=2))) == [
        "knob 1 vs 2"
    ]
    assert (
        differences(_meta(base), _meta(WithKnob(trace="t", target="http://b:1", label="b"))) == []
    )
    warned = check_comparable(
        [_meta(base), _meta(WithKnob(trace="t", target="http://b:1", knob=3))],
        ["A", "B"],
        force=True,
    )
    assert warned == ["not comparable, compared because of --force: B differs from A: knob 1 vs 3"]


def test_nested_settings_and_seeds() -> None:
    """A preset's settings are load options one by one; another salt or arrival seed is a
    replicate of the same experiment, compared."""
    a = RunConfig(trace="t", target="http://a:1", salt=1, arrival_seed=1)
    b = RunConfig(trace="t", target="http://a:1", salt=2, arrival_seed=2)
    assert differences(_meta(a), _meta(b)) == []
    from dataclasses import replace

    c = replace(a, agentx=replace(a.agentx, idle_cap_s=3.0))
    assert differences(_meta(a), _meta(c)) == ["agentx.idle_cap_s 10.0 vs 3.0"]


def test_a_file_without_option_kinds_is_read_by_the_load_options_of_its_time() -> None:
    a = _meta(RunConfig(trace="t", target="http://a:1", speedup=2))
    b = _meta(RunConfig(trace="t", target="http://a:1", speedup=3, workers=4))
    for m in (a, b):
        del m["option_kinds"]
    assert differences(a, b) == ["speedup 2 vs 3"]
