"""The weka (AgentX) importer and exporter. Expected figures are recomputed here from the
raw JSON by plain walking, never through the importer's own helpers."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from agent_replay.replay.cli import main
from agent_replay.traces.importers import import_paths
from agent_replay.traces.io import read_trace

BS = 64


# The top-level calls that AIPerf 0.13.0's weka loader splits off as flattened agents
# (``weka_agent_chains.detect_agent_chains`` run on these files in its venv): trace file ->
# agent -> outer indices. Every other real trace has none.
FLATTENED = {
    "trace_0014.json": {"fa:000": range(102, 114)},
    "trace_0398.json": {"fa:000": range(24, 36)},
}


def raw_calls(
    trace: dict[str, Any], flat: dict[str, range] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(top-level calls, subagent entries) of a WEKA-convention trace, with every call's
    absolute start as ``abs_t`` and its stream as ``agent`` (``flat``: the flattened
    agents' outer indices)."""
    top, subs = [], []
    agent_of = {o: a for a, os in (flat or {}).items() for o in os}
    for o, r in enumerate(trace["requests"]):
        if r.get("type") == "subagent":
            subs.append(r)
        else:
            top.append(dict(r, abs_t=r["t"], agent=agent_of.get(o, "main")))
    return top, subs


def inner_calls(sub: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(r, abs_t=sub["t"] + r["t"], agent=sub["agent_id"]) for r in sub["requests"]]


def by_agent(table: Any) -> dict[str, list[dict[str, Any]]]:
    rows = table.to_pylist()
    out: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (r["arrival_ns"], r["request_index"])):
        out.setdefault(r["agent_id"], []).append(r)
    return out


def ancestors(rows: list[dict[str, Any]], idx: int) -> set[int]:
    deps = {r["request_index"]: r["depends_on"] for r in rows}
    seen: set[int] = set()
    stack = list(deps[idx])
    while stack:
        d = stack.pop()
        if d not in seen:
            seen.add(d)
            stack += deps[d]
    return seen


@pytest.mark.shared_data
def test_every_real_weka_trace_recomputed_from_raw(shared_data: Path) -> None:
    files = sorted((shared_data / "weka").glob("trace_*.json"))
    assert len(files) == 14
    with_subagents = with_parallel = 0
    for f in files:
        raw = json.loads(f.read_text())
        flat = FLATTENED.get(f.name, {})
        everything, subs = raw_calls(raw, flat)
        top = [c for c in everything if c["agent"] == "main"]
        inner = [c for s in subs for c in inner_calls(s)]
        res = import_paths([f])
        assert res.format == "weka" and "convention: WEKA" in res.notes[0]
        t = res.table
        rows = t.to_pylist()
        agents = by_agent(t)
        # request counts, top level and inner; token totals
        assert len(agents["main"]) == len(top), f.name
        assert t.num_rows - len(agents["main"]) == len(inner) + len(everything) - len(top), f.name
        assert sum(r["input_tokens"] for r in rows) == sum(c["in"] for c in everything + inner)
        assert sum(r["output_tokens"] for r in rows) == sum(c["out"] for c in everything + inner)
        # hash ids: the recorded full blocks kept in order, the partial last block added
        streams = [("main", top)] + [(a, [c for c in everything if c["agent"] == a]) for a in flat]
        for agent, calls in streams + [(s["agent_id"], inner_calls(s)) for s in subs]:
            got = agents[agent]
            calls = sorted(calls, key=lambda c: c["abs_t"])
            assert [
                g["hash_ids"][: len(c["hash_ids"])] for g, c in zip(got, calls, strict=True)
            ] == [c["hash_ids"] for c in calls]
            assert all(
                len(g["hash_ids"]) == -(-c["in"] // BS) for g, c in zip(got, calls, strict=True)
            )
            # arrivals on the session clock: inner t counts from the subagent's spawn
            assert [g["arrival_ns"] for g in got] == [round(c["abs_t"] * 1e9) for c in calls]
            assert [g["end_ns"] for g in got] == [
                None if "api_time" not in c else round(c["api_time"] * 1e9) for c in calls
            ]
        # number of subagents and flattened agents
        assert len(agents) - 1 == len(subs) + len(flat)
        with_subagents += bool(subs)
        # spawn: off the last main call at or before the subagent's t; join: the first
        # later main call at or after t + duration; pairs that overlap stay unordered
        main_rows = agents["main"]
        for s in subs:
            first, last = agents[s["agent_id"]][0], agents[s["agent_id"]][-1]
            spawn = [m for m in top if m["t"] <= s["t"]]
            spawner = [r for r in main_rows if r["arrival_ns"] == round(spawn[-1]["t"] * 1e9)]
            assert first["depends_on"] == [spawner[0]["request_index"]]
            end = s["t"] + s["duration_ms"] / 1000
            join = [
                m
                for m in main_rows
                if m["arrival_ns"] >= round(end * 1e9) and m["arrival_ns"] > last["arrival_ns"]
            ]
            joined_by = [m for m in main_rows if last["request_index"] in m["depends_on"]]
            assert joined_by == join[:1]
        # a flattened agent: spawned off the last main call before its first call, joined
        # by the first later main call at or after its last call's end
        for a in flat:
            calls = [c for c in everything if c["agent"] == a]
            first, last = agents[a][0], agents[a][-1]
            before = [r for r in main_rows if r["arrival_ns"] < first["arrival_ns"]]
            assert first["depends_on"] == [before[-1]["request_index"]], (f.name, a)
            end = max(c["t"] + c["api_time"] for c in calls)
            join = [
                m
                for m in main_rows
                if m["arrival_ns"] >= round(end * 1e9) and m["arrival_ns"] > last["arrival_ns"]
            ]
            assert [m for m in main_rows if last["request_index"] in m["depends_on"]] == join[:1]
        assert res.meta.extra["weka"][0]["flattened"] == {a: len(os) for a, os in flat.items()}
        # AIPerf's interval waits between a stream and its flattened agents: all implied here
        assert not [n for n in res.notes if "interval barriers" in n], f.name
        overlaps = {
            (a["agent_id"], b["agent_id"])
            for i, a in enumerate(subs)
            for b in subs[i + 1 :]
            if a["t"] < b["t"] + b["duration_ms"] / 1000
            and b["t"] < a["t"] + a["duration_ms"] / 1000
        }
        with_parallel += bool(overlaps)
        for a, b in overlaps:
            fa, la = agents[a][0]["request_index"], agents[a][-1]["request_index"]
            fb, lb = agents[b][0]["request_index"], agents[b][-1]["request_index"]
            assert la not in ancestors(rows, fb) and lb not in ancestors(rows, fa), (f.name, a, b)
        assert {tuple(p) for p in res.meta.extra["weka"][0]["overlaps"]} == overlaps
    assert (with_subagents, with_parallel) == (6, 4)


def weka_fixture() -> dict[str, Any]:
    """A small WEKA-convention trace: main 0 spawns two parallel Explore subagents (hash ids
    share their system prompt block 50), main 1 at t=20 joins x (ends 16); y (ends 25)
    joins at main 2 (t=30)."""

    def call(
        t: float, n_in: int, ids: list[int], out: int = 10, api: float = 1.0, think: float = 0.0
    ) -> dict[str, Any]:
        return {
            "t": t,
            "type": "n",
            "model": "m",
            "in": n_in,
            "out": out,
            "hash_ids": ids,
            "input_types": ["text"],
            "output_types": ["text"],
            "stop": "end_turn",
            "api_time": api,
            "think_time": think,
        }

    return {
        "id": "fx",
        "models": ["m"],
        "block_size": 64,
        "hash_id_scope": "local",
        "requests": [
            call(0.0, 150, [1, 2]),
            {
                "t": 2.0,
                "type": "subagent",
                "agent_id": "x",
                "duration_ms": 14000,
                "requests": [call(0.0, 130, [50, 51]), call(5.0, 200, [50, 51, 52], api=2.0)],
            },
            {
                "t": 3.0,
                "type": "subagent",
                "agent_id": "y",
                "duration_ms": 22000,
                "requests": [call(0.0, 129, [50, 60]), call(10.0, 190, [50, 60, 61], api=3.0)],
            },
            call(20.0, 260, [1, 2, 3, 4], think=4.0),
            call(30.0, 330, [1, 2, 3, 4, 5], think=5.0),
        ],
    }


def to_semianalysis(w: dict[str, Any]) -> dict[str, Any]:
    """The SemiAnalysis twin: inner t absolute, hash ids from 0, no type fields, think time
    since whichever call of the session ended last."""
    sa = copy.deepcopy(w)
    flat = []
    for r in sa["requests"]:
        if r.get("type") == "subagent":
            for q in r["requests"]:
                q["t"] += r["t"]
                flat.append(q)
        else:
            flat.append(r)
    ends: list[float] = []
    for q in sorted(flat, key=lambda q: q["t"]):
        for k in ("input_types", "output_types", "stop"):
            q.pop(k)
        q["hash_ids"] = [h - 1 for h in q["hash_ids"]]
        prior = [e for e in ends if e <= q["t"]]
        q["think_time"] = max(0.0, q["t"] - max(prior)) if prior else None
        if q["think_time"] is None:
            del q["think_time"]
        ends.append(q["t"] + q["api_time"])
    return sa


def test_semianalysis_twin_gives_the_same_tree(tmp_path: Path) -> None:
    w = weka_fixture()
    (tmp_path / "w.json").write_text(json.dumps(w))
    (tmp_path / "sa.json").write_text(json.dumps(to_semianalysis(w)))
    a = import_paths([tmp_path / "w.json"])
    b = import_paths([tmp_path / "sa.json"])
    assert "convention: WEKA" in a.notes[0] and "convention: SemiAnalysis" in b.notes[0]
    ra, rb = a.table.to_pylist(), b.table.to_pylist()
    for x, y in zip(ra, rb, strict=True):
        assert [h + 1 if h >= 0 else h for h in y.pop("hash_ids")] == x.pop("hash_ids")
        assert x == y
    tree = {(r["request_index"], r["agent_id"]): r["depends_on"] for r in ra}
    assert tree == {
        (0, "main"): [],
        (1, "x"): [0],
        (2, "y"): [0],
        (3, "x"): [1],
        (4, "y"): [2],
        (5, "main"): [0, 3],
        (6, "main"): [4, 5],
    }
    # think time from the latest dependency's end: main 1 at 20, x ended at 7 + 2 = 9
    assert ra[5]["think_ns"] == 11_000_000_000
    assert "1 pairs overlap" in a.notes[1]


def test_convert_to_weka_round_trips_the_tree(tmp_path: Path, shared_data: Path) -> None:
    src = shared_data / "weka" / "trace_0277.json"  # parallel pair and a background branch
    out = tmp_path / "t.parquet"
    assert main(["traces", "import", str(src), "-o", str(out)]) == 0
    back = tmp_path / "back.json"
    assert main(["traces", "convert", str(out), "-o", str(back), "--to", "weka"]) == 0
    again = import_paths([back]).table
    orig = read_trace(out)[0]
    for name in (
        "agent_id",
        "depends_on",
        "parent_index",
        "input_tokens",
        "output_tokens",
        "end_ns",
        "hash_ids",
    ):
        assert again.column(name).to_pylist() == orig.column(name).to_pylist(), name
    exported = json.loads(back.read_text())
    raw = json.loads(src.read_text())
    assert [r.get("hash_ids") for r in exported["requests"] if r["type"] != "subagent"] == [
        r["hash_ids"] for r in raw["requests"] if r["type"] != "subagent"
    ]


def bad(tmp_path: Path, capsys: pytest.CaptureFixture[str], trace: dict[str, Any]) -> str:
    src = tmp_path / "bad.json"
    src.write_text(json.dumps(trace))
    out = tmp_path / "out.parquet"
    assert main(["traces", "import", str(src), "-o", str(out)]) == 2
    assert not out.exists() and not list(tmp_path.glob(".*tmp"))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    return err[0]


def test_bad_subagent_structures_name_file_trace_and_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dangling = weka_fixture()
    dangling["requests"][1]["requests"] = []
    assert "bad.json: trace fx, request requests[1].requests: a subagent with no requests" in bad(
        tmp_path, capsys, dangling
    )
    cyclic = weka_fixture()
    cyclic["requests"][1]["requests"].append(copy.deepcopy(cyclic["requests"][2]))
    cyclic["requests"][1]["requests"][-1]["agent_id"] = "x"
    cyclic["requests"][1]["requests"][-1]["t"] = 6.0
    assert "trace fx, request requests[1].requests[2]: subagent 'x' appears again" in bad(
        tmp_path, capsys, cyclic
    )
    undecided = to_semianalysis(weka_fixture())
    undecided["requests"][0]["stop"] = "end_turn"  # a WEKA field in a SemiAnalysis trace
    assert "trace fx, request requests: cannot decide the convention" in bad(
        tmp_path, capsys, undecided
    )
    backwards = weka_fixture()
    backwards["requests"][4]["t"] = 1.0
    assert "trace fx, request requests[4]: starts before the previous entry" in bad(
        tmp_path, capsys, backwards
    )


def test_convert_any_trace_to_weka_and_back(tmp_path: Path) -> None:
    # a synthetic v1 trace (chains, hash ids from 0): the export says its convention and
    # renumbers ids from 1, and the re-import keeps the tree and the prefix sharing
    from agent_replay.traces.samples import make_samples
    from agent_replay.traces.stats import matched_blocks

    src = Path(make_samples.__file__).resolve().parent / "agent-small.parquet"
    back = tmp_path / "s.jsonl"
    assert main(["traces", "convert", str(src), "-o", str(back), "--to", "weka"]) == 0
    first = json.loads(back.read_text().splitlines()[0])
    assert first["convention"] == "WEKA" and min(first["requests"][0]["hash_ids"]) >= 1
    orig = read_trace(src)[0]
    again = import_paths([back]).table
    assert again.num_rows == orig.num_rows
    assert sum(again.column("output_tokens").to_pylist()) == sum(
        orig.column("output_tokens").to_pylist()
    )
    assert matched_blocks(again).sum() > 0


def test_think_time_after_a_call_without_api_time_is_the_start_to_start_gap(tmp_path: Path) -> None:
    """The pattern of a third of the corpus: a call with no ``api_time`` (its stream was cut
    off) is followed by one whose recorded ``think_time`` (1,201 s) counts from the end of
    the last call that had an ``api_time``, the cut-off call's span included. AIPerf's
    loader takes the start-to-start gap (16 s) after a call without ``api_time``, and so
    does the import."""

    def call(t: float, api: float | None, think: float | None) -> dict[str, Any]:
        c: dict[str, Any] = {
            "t": t,
            "type": "s",
            "model": "m",
            "in": 128,
            "out": 5,
            "hash_ids": [1, 2],
            "input_types": ["text"],
            "output_types": ["text"],
            "stop": "end_turn",
        }
        if api is not None:
            c["api_time"] = api
        if think is not None:
            c["think_time"] = think
        return c

    trace = {
        "id": "cut",
        "models": ["m"],
        "block_size": 64,
        "hash_id_scope": "local",
        "requests": [
            call(0.0, 2.0, None),
            call(10.0, None, 8.0),
            call(26.0, 1.5, 1201.0),
            call(30.0, 1.0, 2.5),
        ],
    }
    (tmp_path / "cut.json").write_text(json.dumps(trace))
    rows = sorted(
        import_paths([tmp_path / "cut.json"], "weka").table.to_pylist(),
        key=lambda r: r["request_index"],
    )
    # row 1: its dependency (row 0) has api_time: end-to-start 10 - (0 + 2) = 8 s
    # row 2: its dependency (row 1) has none: start to start, 26 - 10 = 16 s
    # row 3: end-to-start again, 30 - (26 + 1.5) = 2.5 s
    assert [r["think_ns"] for r in rows] == [None, 8 * 10**9, 16 * 10**9, 2_500_000_000]


def test_inner_calls_aiperf_reads_as_absolute_are_counted(tmp_path: Path) -> None:
    """A WEKA trace whose subagent (spawned at 10 s) has inner calls at relative 0, 5 and
    12 s: all three are relative here (arrivals 10, 15, 22 s); AIPerf's per-call rule reads
    the one at 12 s (not before 10 s) as absolute, and the import says so (1 call)."""

    def call(t: float) -> dict[str, Any]:
        return {
            "t": t,
            "type": "s",
            "model": "m",
            "in": 128,
            "out": 5,
            "api_time": 1.0,
            "hash_ids": [1, 2],
            "input_types": ["text"],
            "output_types": ["text"],
            "stop": "end_turn",
        }

    trace = {
        "id": "rel",
        "models": ["m"],
        "block_size": 64,
        "hash_id_scope": "local",
        "requests": [
            call(0.0),
            {
                "type": "subagent",
                "t": 10.0,
                "agent_id": "a1",
                "duration_ms": 14000,
                "requests": [call(0.0), call(5.0), call(12.0)],
            },
            call(30.0),
        ],
    }
    (tmp_path / "rel.json").write_text(json.dumps(trace))
    res = import_paths([tmp_path / "rel.json"], "weka")
    rows = [r for r in res.table.to_pylist() if r["agent_id"] == "a1"]
    assert sorted(r["arrival_ns"] for r in rows) == [10 * 10**9, 15 * 10**9, 22 * 10**9]
    assert any(
        n.startswith("1 inner subagent calls have a relative t at or after") for n in res.notes
    )
    trace["requests"][1]["requests"][2]["t"] = 9.0  # before the spawn: relative for both
    (tmp_path / "rel.json").write_text(json.dumps(trace))
    assert not any(
        "inner subagent calls" in n for n in import_paths([tmp_path / "rel.json"], "weka").notes
    )


def test_a_first_call_longer_than_the_sniffed_head_is_still_weka(tmp_path: Path) -> None:
    """A trace opening with a 716,145-token prompt (11,189 hash ids, about 70 KB of JSON):
    its first ``api_time`` lies past the 64 KiB the sniffers read; the rest of the file is
    searched a chunk at a time, so the trace imports without ``--format``."""
    from agent_replay.traces.importers import detect
    from agent_replay.traces.importers._common import file_contains, head_bytes

    first = {
        "t": 0.0,
        "type": "s",
        "model": "m",
        "in": 716_145,
        "out": 166,
        "hash_ids": list(range(1, 716_145 // BS + 1)),
        "api_time": 30.0,
        "input_types": ["text"],
        "output_types": ["text"],
        "stop": "end_turn",
    }
    trace = {
        "id": "long",
        "models": ["m"],
        "block_size": BS,
        "hash_id_scope": "local",
        "requests": [first, dict(first, t=40.0, api_time=2.0)],
    }
    f = tmp_path / "long.json"
    f.write_text(json.dumps(trace))
    assert b'"api_time"' not in head_bytes(f)  # the case: beyond the head
    assert detect(f) == "weka"
    assert import_paths([f]).table.num_rows == 2
    # the search finds a needle split across two chunks, and stops at its limit
    data = f.read_bytes()
    at = data.index(b'"api_time"')
    assert file_contains(f, b'"api_time"', chunk=at + 3)
    assert not file_contains(f, b'"api_time"', limit=at)
    # a JSON object with requests and hash ids but no api_time anywhere is not weka
    trace["requests"] = [{k: v for k, v in r.items() if k != "api_time"} for r in trace["requests"]]
    f.write_text(json.dumps(trace))
    assert b'"api_time"' not in f.read_bytes()
    with pytest.raises(Exception, match="unrecognized format"):
        detect(f)


@pytest.mark.shared_data
def test_every_corpus_trace_is_detected_as_weka(shared_data: Path) -> None:
    from agent_replay.traces.importers import detect

    files = [f for d in ("weka", "weka-corpus") for f in sorted((shared_data / d).glob("*.json"))]
    if len(files) < 200:
        pytest.skip(f"{shared_data}/weka-corpus holds {len(files)} traces with weka/")
    assert {f.name: detect(f) for f in files} == {f.name: "weka" for f in files}
