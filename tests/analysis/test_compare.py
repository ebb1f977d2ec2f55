from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent_replay.analysis.compare import (
    bootstrap_percentile,
    compare_arrays,
    compare_dirs,
    to_json,
)
from agent_replay.analysis.fixtures import synthetic_batches, synthetic_results, write_results
from agent_replay.analysis.metrics import request_metrics
from agent_replay.analysis.replicates import holm
from agent_replay.analysis.settings import server_settings, setting_differences
from agent_replay.replay.cli import main


def test_beta_order_statistic_bootstrap_matches_explicit_resampling() -> None:
    rng = np.random.default_rng(0)
    x = np.sort(rng.lognormal(0, 0.5, 300))
    fast = bootstrap_percentile(x, 90.0, 20_000, np.random.default_rng(1))
    idx = np.random.default_rng(2).integers(0, x.size, (20_000, x.size))
    slow = np.sort(x[idx], axis=1)[:, 269]  # rank(90, 300) = 270
    assert np.mean(fast) == pytest.approx(np.mean(slow), rel=2e-3)
    assert np.std(fast) == pytest.approx(np.std(slow), rel=0.05)


def _arrays(n: int, seed: int, scale: float) -> dict[str, np.ndarray]:
    m = request_metrics(
        synthetic_results(n, seed, tpot_scale=scale, median_output_tokens=30, failed_fraction=0.0)
    )
    return {"tpot": m.tpot, "ttft": m.ttft}


def test_no_interval_from_fewer_requests_than_the_percentile_and_two_blocks_need() -> None:
    """One request a side resamples to itself: a zero-width interval around any change,
    which would read as significant. Below what each statistic needs there is no interval,
    the change is still shown, and the verdict says why."""
    one = {"tpot": np.array([6.41e6]), "ttft": np.array([781.5e6])}
    other = {"tpot": np.array([6.39e6]), "ttft": np.array([8.77e6])}
    t = np.array([0.0])
    ds = {d.key: d for d in compare_arrays(one, other, order=(t, t))}
    head = ds["p90_tps"]
    assert not head.significant and head.ci_low is None
    assert head.change == pytest.approx(6.41 / 6.39 - 1)
    assert (
        head.verdict("b")
        == "P90 TPS (= 1 / P90 TPOT): no interval: 1 and 1 requests, it needs 10 a side"
    )
    assert not any(d.significant for d in ds.values())

    rng = np.random.default_rng(0)
    for n, has_ci in ((9, False), (10, True)):  # the block bootstrap: two blocks of 5
        a = {"tpot": rng.normal(6e6, 1e5, n), "ttft": rng.normal(20e6, 1e6, n)}
        b = {"tpot": a["tpot"] * 0.5, "ttft": a["ttft"] * 2}
        order = np.arange(n, dtype=np.float64)
        ds = {d.key: d for d in compare_arrays(a, b, order=(order, order))}
        assert (ds["p90_tps"].ci_low is not None) is has_ci, n
        assert ds["p90_tps"].significant is has_ci, n
    # the per-request bootstrap: P50 needs 2 samples, P90 10
    two = np.array([1e6, 2e6])
    ds = {
        d.key: d
        for d in compare_arrays(
            {"tpot": two, "ttft": two}, {"tpot": two * 3, "ttft": two * 3}, seed=1
        )
    }
    assert ds["median_tps"].ci_low is not None and ds["p90_tps"].ci_low is None


@pytest.mark.slow
def test_five_percent_tpot_difference_is_found_and_zero_is_not() -> None:
    hits = {1.05: 0, 1.0: 0}
    false_p90 = 0
    for trial in range(100):
        for scale in hits:
            ds = {
                d.key: d
                for d in compare_arrays(
                    _arrays(2000, 2 * trial, 1.0), _arrays(2000, 2 * trial + 1, scale), seed=trial
                )
            }
            hits[scale] += ds["median_tps"].significant
            if scale == 1.0:
                false_p90 += ds["p90_tps"].significant
    assert hits[1.05] >= 95
    assert 100 - hits[1.0] >= 95
    assert 100 - false_p90 >= 92  # one statistic (P90 TPS = 1 / P90 TPOT) at a 5% rate


def test_compare_cli_and_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_results(tmp_path / "a", synthetic_batches(3000, 1))
    b = write_results(tmp_path / "b", synthetic_batches(3000, 2, tpot_scale=1 / 1.26))
    c = compare_dirs([a, b], seed=3)
    head = c.verdicts[0]
    assert head.startswith("b is 2") and "% faster at P90 TPS (= 1 / P90 TPOT), 95% CI" in head
    assert '"significant": true' in to_json(c)
    assert main(["compare", str(a), str(a)]) == 0
    out = capsys.readouterr().out
    assert "inconclusive" in out and "P90 TPS" in out and "not between runs" in out
    assert main(["compare", str(a)]) == 2


def test_compare_refuses_different_experiments_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meta = {
        "trace": {"path": "t1.parquet", "sha256": "aa"},
        "target": {"model": "m"},
        "options": {"timing": "session", "speedup": 1.0},
    }
    a = write_results(tmp_path / "a", synthetic_batches(500, 1), meta)
    b = write_results(
        tmp_path / "b",
        synthetic_batches(500, 2),
        meta
        | {
            "trace": {"path": "t2.parquet", "sha256": "bb"},
            "options": {"timing": "session", "speedup": 4.0},
        },
    )
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "trace t1.parquet vs t2.parquet" in err
        and "speedup 1.0 vs 4.0" in err
    )
    assert "--force" in err
    assert main(["compare", str(a), str(b), "--force", "--format", "md"]) == 0
    assert "compared because of --force: b differs from a: trace" in capsys.readouterr().out


def test_time_block_bootstrap_is_wider_on_drifting_runs() -> None:
    from agent_replay.analysis.compare import block_bootstrap_percentile

    rng = np.random.default_rng(5)
    # a run whose server had slow and fast phases: 10 blocks of 200 requests, each block
    # shifted by its own random level (requests within a block are alike)
    levels = np.repeat(rng.normal(0, 3, 10), 200)
    x = 20 + levels + rng.normal(0, 1, 2000)
    t = np.arange(2000)
    blk = block_bootstrap_percentile(x, t, 90.0, 2000, np.random.default_rng(1))
    iid = bootstrap_percentile(np.sort(x), 90.0, 2000, np.random.default_rng(1))
    assert np.std(blk) > 3 * np.std(iid)
    # independent requests: about the same spread (10 blocks estimate a variance with ~9
    # degrees of freedom, so the ratio of spreads itself varies by tens of percent)
    ratios = []
    for seed in range(5):
        y = 20 + np.random.default_rng(100 + seed).normal(0, 1, 2000)
        blk = block_bootstrap_percentile(y, t, 90.0, 1000, np.random.default_rng(seed))
        iid = bootstrap_percentile(np.sort(y), 90.0, 1000, np.random.default_rng(seed))
        ratios.append(np.std(blk) / np.std(iid))
    assert 0.7 < float(np.median(ratios)) < 1.4, ratios


def test_replicate_arms_give_run_level_intervals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [write_results(tmp_path / f"r{i}", synthetic_batches(400, i)) for i in range(3)]
    arm = ",".join(str(r) for r in runs)
    # the same three runs on both sides: every difference is 0, every verdict inconclusive
    assert main(["compare", arm, arm, "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert (
        "P90 TPS (= 1 / P90 TPOT): +0.0% (95% CI +0.0% to +0.0%, paired t on log ratios, "
        "3 pairs, p=1, Holm p=1): inconclusive"
    ) in out
    assert "TPOT P90:" not in out  # the reciprocal of P90 TPS: no second test
    faster = [
        write_results(tmp_path / f"f{i}", synthetic_batches(400, 10 + i, tpot_scale=0.5))
        for i in range(3)
    ]
    assert main(["compare", arm, ",".join(str(r) for r in faster), "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert "P90 TPS (= 1 / P90 TPOT): +" in out and "): better" in out
    assert "Holm-corrected across the 6 comparisons" in out


BUSY = {
    "self_check": {
        "loop_lag_p99_ns": 20_000_000,
        "loop_lag_n": 500,
        "cpu_fraction": 0.2,
        "machine": {"cpus": 2, "busy_cores": 1.9, "steal": 0.0, "ours_cores": 0.2},
    }
}


def test_single_run_compare_gives_no_verdict_under_host_contention(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_results(tmp_path / "a", synthetic_batches(3000, 1))
    quiet = compare_dirs(
        [a, write_results(tmp_path / "b", synthetic_batches(3000, 2, tpot_scale=1 / 1.26))], seed=3
    )
    assert any(d.significant for d in quiet.deltas[0])
    busy = compare_dirs(
        [
            a,
            write_results(tmp_path / "busy", synthetic_batches(3000, 2, tpot_scale=1 / 1.26), BUSY),
        ],
        seed=3,
    )
    assert not any(d.significant for d in busy.deltas[0])
    assert all(d.ci_low is None and d.change is not None for d in busy.deltas[0])
    line = (
        "busy vs a: no verdict: host contention in run busy: rerun on a quiet host or with "
        "replicates (compare A1,A2,A3 B1,B2,B3)"
    )
    assert busy.verdicts[0] == line
    assert main(["compare", str(a), str(tmp_path / "busy"), "--format", "md"]) == 0
    assert line in capsys.readouterr().out


def test_one_verdict_for_p90_tps_and_its_reciprocal_and_holm_in_the_table(tmp_path: Path) -> None:
    a = write_results(tmp_path / "a", synthetic_batches(3000, 1))
    c = compare_dirs([a, write_results(tmp_path / "b", synthetic_batches(3000, 2))], seed=3)
    keys = [d.key for d in c.deltas[0]]
    assert keys == ["p90_tps", "median_tps", "ttft_p90", "ttft_p50"]  # no TPOT test beside TPS
    assert c.verdicts[-1].startswith("Verdicts are Holm-corrected across the 4 comparisons")
    ps = [d.p for d in c.deltas[0]]
    assert [d.p_holm for d in c.deltas[0]] == holm(ps)
    for d in c.deltas[0]:  # bounds on the log ratio: never at or below -100%
        assert d.ci_low is not None and d.ci_low > -1


def test_server_setting_differences_are_listed() -> None:
    base = {
        "launch": {
            "kind": "launch",
            "profile": "standard",
            "command": [
                "python",
                "-m",
                "vllm.entrypoints.cli.main",
                "serve",
                "M",
                "--port",
                "8100",
                "--max-num-seqs",
                "256",
                "--enable-prefix-caching",
            ],
            "env": {"VLLM_X": "1"},
        }
    }
    other = {
        "launch": {
            "kind": "launch",
            "profile": "mtp",
            "command": [
                "python",
                "-m",
                "vllm.entrypoints.cli.main",
                "serve",
                "M",
                "--port",
                "8200",
                "--max-num-seqs",
                "128",
                "--speculative-config",
                '{"method": "mtp"}',
            ],
            "env": {"VLLM_X": "1"},
        }
    }
    assert server_settings(base) == {
        "profile": "standard",
        "model": "M",
        "--max-num-seqs": "256",
        "--enable-prefix-caching": "true",
        "env VLLM_X": "1",
    }
    (line,) = setting_differences([base, other], ["standard", "mtp"])
    assert line == (
        "mtp vs standard: the servers differ in 4 settings: --enable-prefix-caching "
        "true vs (unset); --max-num-seqs 256 vs 128; --speculative-config (unset) vs "
        '{"method": "mtp"}; profile standard vs mtp'
    )  # the port is not a setting
    sim = {
        "launch": {
            "kind": "sim",
            "profile": "fast",
            "argv": ["py", "--port", "1", "--profile", "fast"],
        }
    }
    assert setting_differences([sim, sim], ["a", "b"]) == []
    (none,) = setting_differences([{"launch": {"kind": "url"}}, sim], ["u", "s"])
    assert none.startswith("server settings not recorded for u (a server given by URL)")


def test_compare_of_differently_named_models_says_that_is_expected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's two-deployment recipe with two simulated engine profiles: only the
    model names differ; the refusal says when that is expected and what to do."""
    meta = {
        "trace": {"path": "t.parquet", "sha256": "aa"},
        "target": {"model": "sim-8b"},
        "options": {"timing": "session", "speedup": 1.0},
    }
    a = write_results(tmp_path / "a", synthetic_batches(300, 1), meta)
    b = write_results(
        tmp_path / "b", synthetic_batches(300, 2), meta | {"target": {"model": "sim-8b-mtp"}}
    )
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model sim-8b vs sim-8b-mtp" in err
    assert "expected when the deployments name their model differently" in err and "--force" in err
    assert main(["compare", str(a), str(b), "--force", "--format", "md"]) == 0


def test_run_names_are_data_in_every_compare_output(tmp_path: Path) -> None:
    """Folders named like rich markup or holding terminal escapes: the table shows them as
    they are (no MarkupError, no markup taken), the Markdown has no control sequence."""
    from io import StringIO

    from rich.console import Console

    from agent_replay.analysis.compare import compare_dirs, render_compare, to_markdown

    a = write_results(tmp_path / "[red]a", synthetic_batches(400, 1))
    b = write_results(tmp_path / "b[bold]\x1b]0;pwn\x07\x1b[2J", synthetic_batches(400, 2))
    c = compare_dirs([a, b], resamples=50)
    out = StringIO()
    Console(file=out, width=400, color_system=None).print(render_compare(c))
    text = out.getvalue()
    assert "[red]a" in text and "b[bold]" in text and "\x1b" not in text
    assert "\\x1b]0;pwn" in text  # the escape shown, not obeyed
    md = to_markdown(c)
    assert "\x1b" not in md and "\x07" not in md and "b[bold]" in md


def test_a_margin_turns_an_interval_inside_it_into_equivalence() -> None:
    from agent_replay.analysis.compare import Delta
    from agent_replay.analysis.replicates import Interval, verdict

    # a real but small change: +0.6%, 95% CI +0.4% to +0.8%, p = 0.001
    small = Interval(0.006, 0.004, 0.008, 3, "paired t", p=0.001)
    assert verdict("P90 TPS", small).endswith(": better")
    assert verdict("P90 TPS", small, margin=0.02).endswith(
        ": a real difference of +0.6%, smaller than the +-2% margin"
    )
    # an interval across 0 is equivalent only where it lies wholly inside the margin
    wide = Interval(0.001, -0.01, 0.012, 3, "paired t", p=0.5)
    assert verdict("P90 TPS", wide, margin=0.02).endswith(": equivalent within the +-2% margin")
    assert verdict("P90 TPS", wide, margin=0.01).endswith(
        ": inconclusive, the run-to-run spread covers the difference"
    )
    d = Delta("p90_tps", "P90 TPS", 100.0, 100.6, 0.006, 0.004, 0.008, True, p=0.001)
    assert d.significant and d.finding() and not d.finding(0.02)
    assert d.verdict("b").startswith("b is 1% faster at P90 TPS")
    assert d.verdict("b", 0.02) == (
        "P90 TPS: b +0.6% (95% CI +0.4% to +0.8%): a real difference of +0.6%, smaller "
        "than the +-2% margin"
    )
    assert d.finding(0.008)  # a bound on the margin is not inside it
    assert not d.finding(0.0081)


def test_compare_margin_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_results(tmp_path / "a", synthetic_batches(3000, 1))
    b = write_results(tmp_path / "b", synthetic_batches(3000, 2, tpot_scale=1 / 1.26))
    # one run against itself, unpaired: P90 TPS +0.0%, 95% CI -2.2% to +2.0%
    assert main(["compare", str(a), str(a), "--margin", "2%", "--format", "md"]) == 0
    assert "+0.0%, 95% CI -2.2% to +2.0%: the interval includes 0" in capsys.readouterr().out
    assert main(["compare", str(a), str(a), "--margin", "5%", "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert "+0.0% (95% CI -2.2% to +2.0%): equivalent within the +-5% margin" in out
    assert "inconclusive" not in out
    assert main(["compare", str(a), str(b), "--margin", "0.02", "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert '"margin": 0.02' in out and '"finding": true' in out
    with pytest.raises(SystemExit) as exit_:
        main(["compare", str(a), str(b), "--margin", "150%"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "a margin is from 0% up to below 100%" in err and "Traceback" not in err
