"""engines sim-fit and the virtual-clock prediction: hand-computed timings, recovery of a
known profile from runs the engine itself timed, the CLI's errors."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent_replay.engines.sim.fit import (
    _active,
    _spec_counts,
    chunk_context,
    fit_runs,
    read_run,
    write_profile,
)
from agent_replay.engines.sim.predict import predict_run, simulate_rows
from agent_replay.engines.sim.profile import SimProfile
from agent_replay.errors import InputError
from agent_replay.results_schema import REQUEST_SCHEMA, SERVER_METRICS_SCHEMA

MS = 1_000_000


def _row(
    session: str,
    index: int,
    *,
    sent: int,
    prompt: int,
    cached: int,
    out: int,
    parent: int | None = None,
    parent_end: int = 0,
) -> dict[str, Any]:
    """A request row as a replay writes it; its times are placeholders the simulation
    replaces, except sent_ns (roots) and the think gap (sent - parent's end_ns)."""
    return {
        "session_id": session,
        "request_index": index,
        "parent_index": -1 if parent is None else parent,
        "clone": 0,
        "worker": 0,
        "request_id": f"{session}-{index}",
        "api": "completions",
        "warmup": False,
        "intended_ns": sent,
        "sent_ns": sent,
        "connect_ns": None,
        "headers_ns": sent,
        "first_token_ns": sent + 1,
        "end_ns": sent + 2,
        "chunk_ns": [sent + 1],
        "chunk_tokens": [1],
        "parent_end_ns": parent_end or None,
        "think_ns": None,
        "expected_input_tokens": prompt,
        "expected_output_tokens": out,
        "prompt_tokens": prompt,
        "completion_tokens": out,
        "cached_tokens": None,
        "implied_cached_tokens": cached,
        "status": "ok",
        "error_kind": None,
        "http_status": 200,
        "error": None,
        "agent_id": "main",
        "depends_on": [] if parent is None else [parent],
    }


def _folder(
    tmp: Path,
    name: str,
    rows: list[dict[str, Any]],
    spec: list[tuple[int, str, str, float]] | None = None,
) -> Path:
    d = tmp / name
    (d / "requests").mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=REQUEST_SCHEMA), d / "requests" / "part-000-00000.parquet"
    )
    (d / "run.json").write_text(
        json.dumps({"run_id": name, "gpus": 1, "status": "ok", "target": {"model": "m"}})
    )
    if spec:
        pq.write_table(
            pa.Table.from_pylist(
                [{"t_ns": t, "name": n, "labels": lab, "value": v} for t, n, lab, v in spec],
                schema=SERVER_METRICS_SCHEMA,
            ),
            d / "server_metrics.parquet",
        )
    return d


def test_prediction_of_one_session_by_hand() -> None:
    # front end 1 ms; a step 2 ms; 1000 new tokens at 1e6 tok/s = 1 ms of prefill
    p = SimProfile(
        frontend_base_ns=1 * MS,
        decode_base_ns=2 * MS,
        decode_per_seq_ns=0,
        decode_per_ctx_token_ns=0.0,
        prefill_tokens_per_s=1e6,
        prefix_cache_blocks=0,
    )
    parent = _row("s", 0, sent=0, prompt=1500, cached=500, out=3)
    parent["end_ns"] = 10 * MS
    child = _row("s", 1, sent=15 * MS, prompt=1600, cached=1500, out=2, parent=0)
    got = simulate_rows(p, [parent, child])
    # parent: ready at 1 ms; step 1 ms..4 ms (2 ms + 1 ms prefill) -> first token; 6; 8
    assert got[0]["chunk_ns"] == [4 * MS, 6 * MS, 8 * MS]
    assert got[0]["first_token_ns"] == 4 * MS and got[0]["end_ns"] == 8 * MS
    # child: the measured think gap (15 - 10 ms) after the predicted end: sent at 13 ms,
    # ready at 14 ms; 100 new tokens = 0.1 ms: first token 16.1 ms, then 18.1 ms
    assert got[1]["sent_ns"] == 13 * MS and got[1]["intended_ns"] == 13 * MS
    assert got[1]["chunk_ns"] == [16_100_000, 18_100_000]
    assert got[1]["parent_end_ns"] == 8 * MS


def test_front_end_serves_one_request_at_a_time() -> None:
    p = SimProfile(
        frontend_base_ns=3 * MS,
        decode_base_ns=1 * MS,
        decode_per_seq_ns=0,
        decode_per_ctx_token_ns=0.0,
        prefill_tokens_per_s=1e12,
        prefix_cache_blocks=0,
    )
    rows = [
        _row("a", 0, sent=0, prompt=10, cached=0, out=1),
        _row("b", 0, sent=0, prompt=10, cached=0, out=1),
    ]
    got = simulate_rows(p, rows)
    # a: ready 3 ms, one 1 ms step -> 4 ms; b waits for the front end: ready 6 ms -> 7 ms
    assert sorted(r["first_token_ns"] for r in got) == [4 * MS, 7 * MS]


def test_chunk_context_by_hand() -> None:
    # 100 cached, 250 new, budget 100: chunks end at 200, 300, 350 -> 850
    assert chunk_context(np.array([100]), np.array([250]), 100)[0] == 850
    # one chunk: its context is the whole prompt
    assert chunk_context(np.array([1000]), np.array([50]), 8192)[0] == 1050


def test_active_counts_intervals_holding_the_window() -> None:
    starts = np.array([0, 5, 10])
    ends = np.array([20, 8, 30])
    # [6, 7]: held by 0-20 and 5-8; [9, 12]: by 0-20 only (5-8 ended, 10-30 started late)
    got = _active(np.sort(starts), np.sort(ends), np.array([6, 9]), np.array([7, 12]))
    assert list(got) == [2, 1]


def test_spec_acceptance_from_counter_deltas(tmp_path: Path) -> None:
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    spec = [(t, "vllm:spec_decode_num_drafts_total", "{}", v) for t, v in ((0, 100.0), (1, 300.0))]
    spec += [
        (t, name, json.dumps({"position": str(i)}), v)
        for t, vals in ((0, (50.0, 10.0)), (1, (210.0, 90.0)))
        for i, v in enumerate(vals)
    ]
    d = _folder(tmp_path, "r", [_row("s", 0, sent=0, prompt=10, cached=0, out=1)], spec)
    # 200 drafts; 160 accepted at position 0, 80 at position 1
    assert _spec_counts(d / "server_metrics.parquet") == (200.0, [160.0, 80.0])


def _synthetic_runs(tmp: Path, truth: SimProfile, runs: int = 3) -> list[Path]:
    """Runs of sessions at several concurrencies, timed by the engine with ``truth``."""
    folders = []
    for k in range(runs):
        rnd = random.Random(k)
        rows: list[dict[str, Any]] = []
        for lanes in (1, 4, 8):
            for lane in range(lanes):
                session = f"c{lanes}-{lane}"
                t = k * 10**12 + lanes * 10**11 + rnd.randrange(200 * MS)
                prompt = rnd.randrange(2000, 6000)
                for i in range(12):
                    new = rnd.randrange(50, 3000)
                    prompt += new
                    row = _row(
                        session,
                        i,
                        sent=t,
                        prompt=prompt,
                        cached=prompt - new,
                        out=rnd.randrange(40, 200),
                        parent=i - 1 if i else None,
                    )
                    rows.append(row)
                    # the think gap the simulation keeps: this sent - the parent's end_ns
                    t = row["end_ns"] + rnd.randrange(20 * MS, 300 * MS)
        timed = simulate_rows(truth, rows)
        folders.append(_folder(tmp, f"run{k}", timed))
    return folders


def test_fit_recovers_the_profile_that_timed_the_runs(tmp_path: Path) -> None:
    truth = SimProfile(
        decode_base_ns=5 * MS,
        decode_per_seq_ns=200_000,
        decode_per_ctx_token_ns=20.0,
        prefill_tokens_per_s=50_000.0,
        prefill_base_ns=1 * MS,
        prefill_per_ctx_token_ns=0.0,
        frontend_base_ns=8 * MS,
        frontend_per_prompt_token_ns=500.0,
        prefix_cache_blocks=0,
    )
    folders = _synthetic_runs(tmp_path, truth)
    fit = fit_runs([str(f) for f in folders], name="t")
    got = fit.profile
    assert got.decode_base_ns == pytest.approx(truth.decode_base_ns, rel=0.03)
    assert got.decode_per_seq_ns == pytest.approx(truth.decode_per_seq_ns, rel=0.1)
    assert got.decode_per_ctx_token_ns == pytest.approx(truth.decode_per_ctx_token_ns, rel=0.1)
    assert got.prefill_tokens_per_s == pytest.approx(truth.prefill_tokens_per_s, rel=0.05)
    assert got.frontend_base_ns == pytest.approx(truth.frontend_base_ns, rel=0.1)
    assert got.frontend_per_prompt_token_ns == pytest.approx(500.0, rel=0.1)
    assert got.prefill_base_ns == pytest.approx(truth.prefill_base_ns, rel=0.1)
    terms = got.extra["fit"]["terms"]
    for name in ("decode_base_ns", "frontend_base_ns"):
        t = terms[name]
        assert t["low"] <= t["value"] <= t["high"]
    assert [r["folder"] for r in got.extra["fit"]["fitted_on"]["runs"]] == [str(f) for f in folders]
    # and the fitted profile predicts a run it timed within 3% on TTFT and TPOT
    src = folders[0]
    out = predict_run(got, src, tmp_path / "pred")
    a, b = read_run(src), read_run(out)
    ttft_a, ttft_b = np.median(a.first - a.sent), np.median(b.first - b.sent)
    assert ttft_b == pytest.approx(ttft_a, rel=0.03)
    meta = json.loads((out / "run.json").read_text())
    assert meta["prediction"]["clock"] == "virtual" and meta["prediction"]["source_run"] == str(src)


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a results folder"):
        read_run(tmp_path)
    with pytest.raises(InputError, match="no results folders"):
        fit_runs([])
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_replay",
            "engines",
            "sim-fit",
            str(tmp_path),
            "-o",
            str(tmp_path / "p.json"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0
    assert "not a results folder" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "p.json").exists()


def test_write_profile_refuses_to_overwrite(tmp_path: Path) -> None:
    truth = SimProfile(
        decode_base_ns=5 * MS,
        decode_per_seq_ns=200_000,
        prefix_cache_blocks=0,
        frontend_base_ns=8 * MS,
    )
    fit = fit_runs([str(f) for f in _synthetic_runs(tmp_path, truth, runs=2)])
    out = tmp_path / "p.json"
    out.write_text("keep")
    with pytest.raises(InputError, match="exists"):
        write_profile(fit, out)
    assert out.read_text() == "keep"
    write_profile(fit, out, force=True)
    assert SimProfile.load(out).decode_base_ns == fit.profile.decode_base_ns


def test_cache_split_and_cached_starts_by_hand() -> None:
    from agent_replay.engines.sim.predict import cache_split, prefix_hits, unrecorded_starts

    # TTFT per prompt token of first requests: 1.0, 1.2 (read from cache) and 20, 25 us
    # (computed): the widest gap is 1.2 -> 20 (16.7x >= 4), its geometric middle 4.9 us
    assert cache_split([20_000.0, 1_000.0, 25_000.0, 1_200.0]) == pytest.approx(
        (1_200 * 20_000) ** 0.5
    )
    assert cache_split([1_000.0, 1_200.0, 3_000.0]) is None  # one regime: 2.5x at most
    assert cache_split([5_000.0]) is None
    rows = [
        # a: sent first, 64,000 tokens in 64 ms (1 us per token), no recorded hit
        {**_row("a", 0, sent=0, prompt=64_000, cached=0, out=2), "cached_tokens": None},
        # b: 50,000 tokens in 1 s (20 us per token)
        {**_row("b", 0, sent=1, prompt=50_000, cached=0, out=2), "cached_tokens": None},
        # a's second turn: the previous prompt in whole blocks of 16
        {**_row("a", 1, sent=2, prompt=64_100, cached=0, out=2), "cached_tokens": None},
    ]
    rows[0]["first_token_ns"] = 64_000_000
    rows[1]["first_token_ns"] = 1 + 1_000_000_000
    for r in rows:
        r["implied_cached_tokens"] = None
    assert unrecorded_starts(rows) == [1_000.0, 20_000.0]
    assert prefix_hits(rows) == [0, 0, 64_000]  # no split: first requests are cold
    # with the split at 4.5 us: a's first request was read from the cache, whole blocks of
    # 16 up to the prompt's last token (63,999 -> 63,984); b's was computed
    assert prefix_hits(rows, 4_500.0) == [63_984, 0, 64_000]


def test_front_end_works_in_batches_by_hand() -> None:
    # 100 ms per request; a at 0 is alone: ready at 100 ms. b (10 ms) and c (20 ms) come
    # while a's batch works: one batch from 100 ms costing 200 ms, both ready at 300 ms.
    # d at 150 ms finds that batch at work: the next batch, 300 to 400 ms
    from agent_replay.engines.sim.core import EngineCore, SimRequest

    core = EngineCore(SimProfile(frontend_base_ns=100 * MS, prefix_cache_blocks=0))
    reqs = [
        SimRequest(request_id=n, prompt_ids=range(10), max_tokens=1, arrival_ns=t * MS)
        for n, t in (("a", 0), ("b", 10), ("c", 20), ("d", 150))
    ]
    for r in reqs:
        core.add(r)
    assert [r.ready_ns // MS for r in reqs] == [100, 300, 300, 400]


def test_front_end_batch_holds_at_most_the_tokenizers_batch(monkeypatch: Any) -> None:
    import agent_replay.engines.sim.core as core_mod

    monkeypatch.setattr(core_mod, "FRONTEND_BATCH", 2)
    core = core_mod.EngineCore(SimProfile(frontend_base_ns=100 * MS, prefix_cache_blocks=0))
    reqs = [
        core_mod.SimRequest(request_id=str(t), prompt_ids=range(10), max_tokens=1, arrival_ns=t)
        for t in (0, 1, 2, 3)
    ]
    for r in reqs:
        core.add(r)
    # a alone to 100 ms; the next two together to 300 ms; the fourth after them, 400 ms
    assert [r.ready_ns // MS for r in reqs] == [100, 300, 300, 400]


def test_chunk_context_below_the_decode_path_threshold_by_hand() -> None:
    # one chunk of 128 new tokens on 10,000 cached, threshold 512: 10,128 * 128 / 512
    assert chunk_context(np.array([10_000]), np.array([128]), 8192, 512)[0] == 2532
    p = SimProfile(prefill_ctx_full_chunk=512)
    assert p.chunk_context(10_128, 128) == 2532
    # at or above the threshold the whole context counts, as without one
    assert chunk_context(np.array([100]), np.array([250]), 100, 50)[0] == 850
    assert p.chunk_context(10_600, 600) == SimProfile().chunk_context(10_600, 600) == 10_600
    # budget 100 above a threshold of 400: the two full chunks count 1/4 each (200, 300),
    # the last chunk of 50 tokens 1/8 of its 350
    assert chunk_context(np.array([100]), np.array([250]), 100, 400)[0] == pytest.approx(
        (200 + 300) / 4 + 350 / 8
    )


def test_front_end_fit_minimises_the_relative_error() -> None:
    # a constant fitted to TTFTs of 100 and 200 ms in relative terms: it minimises
    # ((100 - c) / 100)^2 + ((200 - c) / 200)^2, so c = (1/100 + 1/200) / (1/100^2 + 1/200^2)
    # = 120 ms (not the mean, 150 ms)
    from agent_replay.engines.sim.fit import _fit_terms, relative

    ttft = np.array([100.0, 200.0]) * MS
    x, y = relative(np.ones((2, 1)), ttft, ttft)
    (term,) = _fit_terms([(x, y)], ("c",), ("ns",))
    assert term.value == pytest.approx(120 * MS)


def test_agentx_phases_are_kept_by_hand() -> None:
    # Recorded: stream warm-ups a#0 (0-50 ms) and b#0 (10-100 ms); then, at 101 ms, each
    # lane's warm-up turn a#1, b#1 (ending 150 and 180 ms); at 185 ms the measured phase:
    # a#2 (parent a#1) and b#2 (parent b#1). Predicted with a 1 ms step and a 3 ms front
    # end, the waits are the phases, not each request's own parent.
    from agent_replay.engines.sim.predict import warmup_gates

    def row(s: str, i: int, sent: int, end: int, warm: bool, parent: int | None) -> Any:
        r = _row(s, i, sent=sent * MS, prompt=10, cached=0, out=1, parent=parent)
        r.update(warmup=warm, end_ns=end * MS, clone=1)
        return r

    rows = [
        row("a", 0, 0, 50, True, None),
        row("b", 0, 10, 100, True, None),
        row("a", 1, 101, 150, True, 0),
        row("b", 1, 101, 180, True, 0),
        row("a", 2, 185, 300, False, 1),
        row("b", 2, 185, 300, False, 1),
    ]
    live = list(range(6))
    parents = {0: [], 1: [], 2: [0], 3: [1], 4: [2], 5: [3]}
    # a#1 and b#1 wait for both stream warm-ups; a#2 and b#2 for every warm-up
    assert warmup_gates(rows, live, parents, 1) == {2: [0, 1], 3: [0, 1], 4: live[:4], 5: live[:4]}
    p = SimProfile(
        frontend_base_ns=3 * MS,
        decode_base_ns=1 * MS,
        decode_per_seq_ns=0,
        decode_per_ctx_token_ns=0.0,
        prefill_tokens_per_s=1e12,
        prefix_cache_blocks=0,
    )
    got = simulate_rows(p, rows, None, 1)
    # a#0 ends 4 ms, b#0 (sent 10 ms) 14 ms: the turns go 1 ms after the later (15 ms);
    # one front-end batch each: a#1 ready 18 ms, ends 19; b#1 waits for a#1's batch: 21, 22
    assert [r["end_ns"] // MS for r in got[:4]] == [4, 14, 19, 22]
    assert got[2]["sent_ns"] == got[3]["sent_ns"] == 15 * MS
    # the measured phase: 5 ms after the last warm-up's end, both lanes at once (27 ms)
    assert got[4]["sent_ns"] == got[5]["sent_ns"] == 27 * MS
    # without AgentX's phases each waits for its own parent only: a#1 its recorded 51 ms
    # after a#0's end (4 ms), b#1 1 ms after b#0's (14 ms)
    plain = simulate_rows(p, rows)
    assert plain[2]["sent_ns"] == 55 * MS and plain[3]["sent_ns"] == 15 * MS


def test_front_end_batch_overlap_by_hand() -> None:
    # costs 100 (a, alone), then b 100, c 300, d 200 in the next batch: overlap 0.5 makes it
    # the largest (300) + half of the others (150): 100 + 450 = 550 ms for b, c and d
    from agent_replay.engines.sim.core import EngineCore, SimRequest

    p = SimProfile(frontend_per_prompt_token_ns=1e6, frontend_batch_overlap=0.5)
    core = EngineCore(p.replace(prefix_cache_blocks=0))
    reqs = [
        SimRequest(request_id=n, prompt_ids=range(size), max_tokens=1, arrival_ns=t * MS)
        for n, size, t in (("a", 100, 0), ("b", 100, 1), ("c", 300, 2), ("d", 200, 3))
    ]
    for r in reqs:
        core.add(r)
    assert [r.ready_ns // MS for r in reqs] == [100, 550, 550, 550]
    with pytest.raises(InputError, match="frontend_batch_overlap"):
        SimProfile(frontend_batch_overlap=1.5)


def test_choose_frontend_overlap_scores_by_hand(monkeypatch: Any, tmp_path: Path) -> None:
    # one fit run measured at TTFT P50 100 ms (other figures absent); predicted 100 ms
    # with overlap 0, 200 ms with 0.5 and 50 ms with 1: scores |log(p/m)| 0, log 2, log 2
    import agent_replay.engines.sim.predict as predict_mod
    import agent_replay.replay.simcal as fit_mod

    ttft = {"measured": 100.0, "0.0": 100.0, "0.5": 200.0, "1.0": 50.0}

    def fake_predict(profile: SimProfile, source: Path, out: Path) -> Path:
        return Path(str(profile.frontend_batch_overlap))

    def fake_figures(folder: Path) -> dict[str, float | None]:
        key = "measured" if Path(folder) == tmp_path else str(folder)
        return {k: ttft[key] if k == "ttft_p50_ms" else None for k in fit_mod.SCORED}

    monkeypatch.setattr(predict_mod, "predict_run", fake_predict)
    monkeypatch.setattr(fit_mod, "run_figures", fake_figures)
    best, scores = fit_mod.choose_frontend_overlap([(SimProfile(), [tmp_path])], (0.0, 0.5, 1.0))
    assert best == 0.0
    assert scores == {0.0: 0.0, 0.5: pytest.approx(np.log(2)), 1.0: pytest.approx(np.log(2))}
    # a tie goes to the smaller overlap
    ttft["0.0"] = 400.0
    best, _ = fit_mod.choose_frontend_overlap([(SimProfile(), [tmp_path])], (0.0, 0.5, 1.0))
    assert best == 0.5
