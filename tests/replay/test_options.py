"""Run options declared once (``replay.options``): one ``RunConfig`` field yields the CLI
flag, the config built from it, the sweep's ``[run]`` key with its checks and run.json's
``options`` entry."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent_replay.errors import InputError
from agent_replay.replay.cli import build_parser
from agent_replay.replay.cli.cmd_run import config_from_args
from agent_replay.replay.config import RunConfig
from agent_replay.replay.options import (
    LOAD,
    add_options,
    at_least,
    check_fields,
    check_sweep_value,
    namespace_values,
    option,
    record_options,
    sweep_keys,
)
from agent_replay.replay.presets import PRESET_NAMES, PRESETS
from agent_replay.replay.sweep.experiment import RUN_KEYS, load_experiment


@dataclass(frozen=True)
class WithLabel(RunConfig):
    """A config with one more option, declared as one field."""

    label_count: int | None = option(
        None, kind=LOAD, metavar="N", checks=(at_least(2),), sweep=True, help="a new option"
    )


def _parse(cls: type, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_options(p, cls)
    return p.parse_args(argv)


def test_one_field_is_a_flag_a_sweep_key_a_check_and_a_run_json_entry() -> None:
    args = _parse(WithLabel, ["--label-count", "3", "--workers", "2"])
    values = namespace_values(args, WithLabel)
    assert values["label_count"] == 3 and values["workers"] == 2
    cfg = WithLabel(trace="t", target="http://h", **values)
    assert record_options(cfg)["label_count"] == 3
    assert sweep_keys(WithLabel)["label_count"] == (int,)
    assert "label_count" not in RUN_KEYS  # the subclass's own option only
    check_sweep_value("exp.toml: [run]", WithLabel, "label_count", 5)
    with pytest.raises(InputError, match=r"^exp.toml: \[run\] label_count: must be >= 2, got 1$"):
        check_sweep_value("exp.toml: [run]", WithLabel, "label_count", 1)
    with pytest.raises(InputError, match=r"label_count: expected int, got 2.5"):
        check_sweep_value("exp.toml: [run]", WithLabel, "label_count", 2.5)
    with pytest.raises(InputError, match=r"^--label-count must be >= 2, got 1$"):
        check_fields(WithLabel(trace="t", target="http://h", label_count=1))
    assert _parse(WithLabel, []).label_count is None


def test_low_token_id_is_an_option_everywhere(tmp_path: Path) -> None:
    parser = build_parser()
    args = parser.parse_args(["run", "t.parquet", "--target", "http://h:1", "--low-token-id", "5"])
    cfg = config_from_args(args, args.target)
    assert cfg.low_token_id == 5 and record_options(cfg)["low_token_id"] == 5
    assert RUN_KEYS["low_token_id"] == (int,)
    (tmp_path / "t.parquet").write_bytes(b"")
    exp = tmp_path / "exp.toml"
    exp.write_text(
        'trace = "t.parquet"\n[load]\naxis = "rate"\npoints = [1]\n[run]\n'
        'low_token_id = -1\n[[targets]]\nsim = "fast"\n'
    )
    with pytest.raises(InputError, match=r"\[run\] low_token_id: must be >= 0, got -1"):
        load_experiment(exp)


def test_command_line_to_config_hand_checked() -> None:
    parser = build_parser()
    args = parser.parse_args(
        [
            "run",
            "t.parquet",
            "--target",
            "http://h:1",
            "-o",
            "out",
            "--speedup",
            "2.5",
            "--duration",
            "30",
            "--ramp",
            "4",
            "--no-vllm-extras",
            "--no-progress",
            "--header",
            "X-A=1",
            "--header",
            "X-B=2=3",
            "--no-gpu-metrics",
            "--ray",
            "--request-timeout",
            "9",
            "--max-failure-rate",
            "0.5",
        ]
    )
    cfg = config_from_args(args, args.target)
    assert (cfg.output, cfg.speedup, cfg.duration_s, cfg.ramp_s) == ("out", 2.5, 30.0, 4.0)
    assert cfg.vllm_extras is False and cfg.progress is False
    assert cfg.headers == (("X-A", "1"), ("X-B", "2=3"))
    assert cfg.gpu_metrics == "off" and cfg.ray == "auto"
    assert cfg.request_timeout_s == 9.0 and cfg.max_failure_rate == 0.5
    plain = config_from_args(
        parser.parse_args(["run", "t", "--target", "http://h:1"]), "http://h:1"
    )
    assert plain == RunConfig(trace="t", target="http://h:1")  # every default is the field's


def test_preset_fills_what_the_command_line_leaves_out() -> None:
    parser = build_parser()
    args = parser.parse_args(
        [
            "run",
            "t",
            "--target",
            "http://h:1",
            "--preset",
            "inferencex-agentx",
            "--idle-cap",
            "5",
            "--start-range",
            "0.1,0.2",
            "--concurrency",
            "4",
        ]
    )
    cfg = config_from_args(args, args.target)
    assert cfg.timing == "agentx" and cfg.duration_s == 3600.0
    assert (cfg.agentx.idle_cap_s, cfg.agentx.seed, cfg.agentx.warmup_requests) == (5.0, 42, 10)
    assert (cfg.agentx.start_min, cfg.agentx.start_max) == (0.1, 0.2)
    assert record_options(cfg)["agentx"]["preset"] == "inferencex-agentx"
    assert tuple(PRESETS) == PRESET_NAMES
    with pytest.raises(InputError, match=r"^--idle-cap-s must be >= 0, got -1"):
        config_from_args(
            parser.parse_args(
                [
                    "run",
                    "t",
                    "--target",
                    "http://h:1",
                    "--timing",
                    "agentx",
                    "--concurrency",
                    "1",
                    "--idle-cap",
                    "-1",
                ]
            ),
            "http://h:1",
        ).check()


def test_run_json_options_redact_and_skip_unrecorded() -> None:
    cfg = RunConfig(
        trace="t",
        target="http://h:1",
        api_key="sk-1",
        t0_ns=5,
        headers=(("Authorization", "Bearer x"),),
    )
    rec = record_options(cfg)
    assert "t0_ns" not in rec and rec["api_key"] != "sk-1"
    assert rec["headers"][0][1] != "Bearer x" and rec["trace"] == "t"


def test_a_run_records_its_options_and_reads_back_typed(tmp_path: Path) -> None:
    import json

    from agent_replay.engines.sim import SimProcess
    from agent_replay.replay.run import run
    from agent_replay.runmeta import RUN_META_VERSION, RunMeta
    from tests.replay.helpers import MS, chain_rows, write_rows

    trace = write_rows(
        tmp_path / "t.parquet",
        chain_rows(2, 2, gap_ns=5 * MS, think_ns=1 * MS, input_tokens=40, output_tokens=4),
    )
    with SimProcess("fast") as sim:
        cfg = RunConfig(
            trace=str(trace),
            target=sim.url,
            output=str(tmp_path / "r"),
            salt=3,
            speedup=4,
            scrape_interval_s=0,
            low_token_id=2000,
            gpu_metrics="off",
        )
        s = run(cfg, progress=None)
    assert (s.ok, s.failed) == (4, 0)
    raw = json.loads((tmp_path / "r" / "run.json").read_text())
    m = RunMeta.from_json(raw)
    assert m.version == RUN_META_VERSION and m.status == "ok" and m.salt == 3
    assert m.options["low_token_id"] == 2000 and m.options["speedup"] == 4
    assert set(m.options) == set(record_options(cfg))  # the run.json entry is the fields'
    assert m.summary is not None and (m.summary.ok, m.summary.sent) == (4, 4)
    assert m.planned.requests == 4 and m.trace.block_size is not None
    assert raw == m.to_json()  # written in RunMeta's layout: every key is one of its fields
    assert m.load_options() and "max_think_s" in m.load_options() and not m.extra.get("options")


def test_axes_plan_and_kinds_come_from_the_declarations() -> None:
    from agent_replay.analysis.frontier import OFFERED, axis_kind
    from agent_replay.replay.options import CLOSED, KINDS, axes, axis_values, option_fields
    from agent_replay.replay.plan import PlanOptions
    from agent_replay.replay.sweep.experiment import AXES, INTEGER_AXES

    @dataclass(frozen=True)
    class WithAxis(RunConfig):
        lanes: int | None = option(
            None, kind=LOAD, axis=CLOSED, axis_sets=(("timing", "max-rate"),), help="lanes"
        )

    assert AXES == ("speedup", "concurrency", "rate", "concurrent_sessions")
    assert INTEGER_AXES == ("concurrency", "concurrent_sessions")
    assert list(axes(WithAxis))[-1] == "lanes"
    assert axis_values(WithAxis, "lanes", 4.0) == {"lanes": 4, "timing": "max-rate"}
    assert axis_values(RunConfig, "rate", 2) == {"rate": 2.0}
    assert axis_kind({"axis": "rate", "axis_kind": "offered"}) == OFFERED
    assert axis_kind({"axis": "concurrency"}) == "closed"  # a sweep.json before axis_kind
    cfg = RunConfig(
        trace="t",
        target="http://h",
        speedup=2,
        api="chat",
        max_think_s=3,
        rebase_sessions=True,
        keep_overlaps=True,
        ramp_s=4,
        arrival_seed=7,
        sessions_multiplier=2,
        max_sessions=5,
        duration_s=9,
    )
    assert cfg.plan_options() == PlanOptions(
        speedup=2,
        sessions_multiplier=2,
        max_sessions=5,
        duration_s=9,
        api_override="chat",
        ramp_s=4,
        arrival_seed=7,
        max_think_s=3,
        rebase_sessions=True,
        keep_overlaps=True,
    )
    for f, o in option_fields(RunConfig):  # every option says what it means, once
        if o.cli:
            assert o.kind in KINDS and o.help, f.name


def test_the_cli_spells_a_field_as_its_file_does() -> None:
    parser = build_parser()
    for argv in (["--max-think-s", "2"], ["--max-think", "2"]):
        args = parser.parse_args(["run", "t", "--target", "http://h:1", *argv])
        assert config_from_args(args, args.target).max_think_s == 2.0
