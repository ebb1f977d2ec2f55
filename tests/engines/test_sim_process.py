"""The simulated engine in a child process, driven by a real HTTP client."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pyarrow.parquet as pq
import pytest

from agent_replay.engines.sim import SimProcess


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess("fast") as s:
        yield s


def _events(raw: bytes) -> list[bytes]:
    assert raw.endswith(b"\n\n")
    return [e[len(b"data: ") :] for e in raw.split(b"\n\n") if e]


async def test_streaming_token_ids_with_return_token_ids_and_continuous_usage(
    sim: SimProcess,
) -> None:
    prompt = list(range(1000, 1040))
    body = {
        "prompt": prompt,
        "max_tokens": 12,
        "stream": True,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    async with (
        aiohttp.ClientSession() as c,
        c.post(sim.url + "/v1/completions", json=body, headers={"X-Request-Id": "t-1"}) as r,
    ):
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        raw = await r.read()
    events = _events(raw)
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    *token_chunks, final = chunks
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 12
    assert final["usage"]["prompt_tokens"] == 40
    ids: list[int] = []
    for i, ch in enumerate(token_chunks):
        assert ch["id"] == "cmpl-t-1"
        choice = ch["choices"][0]
        assert choice["prompt_token_ids"] == (prompt if i == 0 else None)
        ids += choice["token_ids"]
        assert ch["usage"]["completion_tokens"] == len(ids)
        assert ch["usage"]["total_tokens"] == 40 + len(ids)
    assert len(ids) == 12
    assert token_chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_health_and_models(sim: SimProcess) -> None:
    with urllib.request.urlopen(sim.url + "/health") as r:
        assert r.status == 200
    with urllib.request.urlopen(sim.url + "/v1/models") as r:
        data = json.loads(r.read())
    assert data["data"][0]["id"] == "sim-fast"
    assert data["data"][0]["max_model_len"] == 32768


def test_stop_returns_zero() -> None:
    s = SimProcess("fast").start()
    assert s.url.startswith("http://127.0.0.1:")
    assert s.stop() == 0


@pytest.mark.slow
async def test_workers_share_one_port_and_write_one_ground_truth_each(tmp_path: Path) -> None:
    gt = tmp_path / "gt.parquet"
    with SimProcess("fast", workers=2, ground_truth=gt) as s:
        body = {"prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as c:
            for _ in range(12):
                async with c.post(s.url + "/v1/completions", json=body) as r:
                    assert r.status == 200
                    assert (await r.json())["usage"]["completion_tokens"] == 3
    files = sorted(tmp_path.glob("gt.w*.parquet"))
    assert [f.name for f in files] == ["gt.w0.parquet", "gt.w1.parquet"]
    assert sum(pq.read_metadata(f).num_rows for f in files) == 12


def test_cli_names_a_bad_profile_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    from agent_replay.replay.cli import main

    assert main(["engines", "sim", "--profile", "no-such-profile", "--port", "0"]) == 2
    assert "no-such-profile" in capsys.readouterr().err
