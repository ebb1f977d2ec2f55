"""A generic OpenAI-compatible server (no token ids, no continuous usage, vLLM's extra fields
refused) replayed with ``--no-vllm-extras``: every request stays ok with error_kind
"inexact", the same with both HTTP clients, and the report shows TTFT/E2E/chunk gap and
throughput but no per-token metrics, with the warning."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
from aiohttp import web

from agent_replay.analysis.render import to_text
from agent_replay.analysis.report import build_report
from agent_replay.analysis.results import read_run_record
from agent_replay.engines.dialects import API_PATHS, build_request, encode_body
from agent_replay.replay.client import Prepared, Sender, make_session
from agent_replay.replay.config import RunConfig
from agent_replay.replay.fastclient import FastSender
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.run import arun
from agent_replay.replay.summary import render_summary
from tests.replay.helpers import MS, chain_rows, write_rows

VLLM_FIELDS = ("ignore_eos", "min_tokens", "return_token_ids")


@dataclass
class GenericServer:
    """Streams plain OpenAI chunks of ``tokens_per_chunk`` words each (one token per word), a
    final usage chunk when asked for ``include_usage`` (and ``usage`` is on), ``[DONE]``;
    Anthropic messages as text deltas without usage and a final ``message_delta`` with
    ``output_tokens``. Refuses the vLLM-only fields with 400, as strict servers do."""

    tokens_per_chunk: int = 2
    usage: bool = True
    shortfall: int = 0  # answers this many tokens short of max_tokens (an early end)
    seen: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        for path in API_PATHS.values():
            app.router.add_post(path, self.complete)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "generic"}]})

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(body)
        opts = body.get("stream_options") or {}
        bad = [f for f in VLLM_FIELDS if f in body]
        if opts.get("continuous_usage_stats"):
            bad.append("stream_options.continuous_usage_stats")
        if bad:
            return web.json_response({"error": {"message": f"unknown fields {bad}"}}, status=400)
        if request.path == "/v1/completions":
            n_in = len(body["prompt"])
        else:
            n_in = 3 + sum(len(str(m["content"]).split()) for m in body["messages"])
        n_out = (body.get("max_completion_tokens") or body["max_tokens"]) - self.shortfall
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        messages = request.path == "/v1/messages"
        if messages:
            await resp.write(
                b"event: message_start\ndata: "
                + orjson.dumps(
                    {
                        "type": "message_start",
                        "message": {"usage": {"input_tokens": n_in, "output_tokens": 1}},
                    }
                )
                + b"\n\n"
            )
        done = 0
        while done < n_out:
            k = min(self.tokens_per_chunk, n_out - done)
            done += k
            text = " w" * k
            if messages:
                ev = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": text}}
                await resp.write(b"event: content_block_delta\ndata: " + orjson.dumps(ev) + b"\n\n")
            else:
                choice: dict[str, Any] = {"index": 0, "finish_reason": None}
                if request.path == "/v1/completions":
                    choice["text"] = text
                else:
                    choice["delta"] = {"content": text}
                await resp.write(
                    b"data: " + orjson.dumps({"id": "g", "choices": [choice]}) + b"\n\n"
                )
            await asyncio.sleep(0.001)
        if messages:
            await resp.write(
                b"event: message_delta\ndata: "
                + orjson.dumps(
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": "max_tokens"},
                        "usage": {"output_tokens": done},
                    }
                )
                + b"\n\n"
            )
            await resp.write(b'event: message_stop\ndata: {"type": "message_stop"}\n\n')
            return resp
        if self.usage and opts.get("include_usage"):
            usage = {"prompt_tokens": n_in, "completion_tokens": done, "total_tokens": n_in + done}
            await resp.write(
                b"data: " + orjson.dumps({"id": "g", "choices": [], "usage": usage}) + b"\n\n"
            )
        await resp.write(b"data: [DONE]\n\n")
        return resp


async def serve(srv: GenericServer) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(srv.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def generic() -> AsyncIterator[tuple[GenericServer, str]]:
    srv = GenericServer()
    runner, url = await serve(srv)
    yield srv, url
    await runner.cleanup()


def _prep(api: str, n_in: int, n_out: int, vllm_extras: bool = False) -> Prepared:
    prompt: Any = np.arange(1000, 1000 + n_in) if api == "completions" else "a b c"
    body = build_request(
        api, model="generic", prompt=prompt, max_tokens=n_out, vllm_extras=vllm_extras
    )
    return Prepared(API_PATHS[api], encode_body(body), {"Content-Type": "application/json"}, api)


def _rec(api: str, n_in: int, n_out: int) -> RequestRecord:
    return RequestRecord(
        session_id="s",
        request_index=0,
        parent_index=-1,
        clone=0,
        worker=0,
        request_id="r",
        api=api,
        expected_input_tokens=n_in,
        expected_output_tokens=n_out,
        implied_cached_tokens=None,
    )


async def _send(client: str, url: str, p: Prepared, r: RequestRecord) -> RequestRecord:
    if client == "fast":
        fs = FastSender(url, 10.0)
        try:
            await fs.send(p, r)
        finally:
            await fs.close()
    else:
        session = make_session(10.0)
        try:
            await Sender(session, url).send(p, r)
        finally:
            await session.close()
    return r


def _outcome(r: RequestRecord) -> tuple[Any, ...]:
    return (
        r.status,
        r.error_kind,
        r.error,
        list(r.chunk_tokens),
        r.prompt_tokens,
        r.completion_tokens,
        r.http_status,
    )


@pytest.mark.parametrize("api", ["completions", "chat", "messages"])
async def test_both_clients_keep_inexact_requests_ok(
    generic: tuple[GenericServer, str], api: str
) -> None:
    _, url = generic
    n_in = 40 if api == "completions" else 6
    got = {}
    for client in ("fast", "aiohttp"):
        r = await _send(client, url, _prep(api, n_in, 9), _rec(api, n_in, 9))
        assert r.status == "ok" and r.error_kind == "inexact", r.error
        assert r.error is not None and r.error.startswith("tokens per chunk not exact")
        assert "\n" not in r.error and "trace has" not in r.error
        # one count per content event (5 events of 2, 2, 2, 2, 1 words), usage says 9
        assert list(r.chunk_tokens) == [1] * 5 and len(r.chunk_ns) == 5
        assert r.completion_tokens == 9 and r.prompt_tokens == n_in
        assert r.sent_ns < r.first_token_ns == r.chunk_ns[0] <= r.chunk_ns[-1] <= r.end_ns
        got[client] = _outcome(r)
    assert got["fast"] == got["aiohttp"]


async def test_inexact_counts_still_checked_against_the_trace(
    generic: tuple[GenericServer, str],
) -> None:
    srv, url = generic
    for client in ("fast", "aiohttp"):
        r = await _send(client, url, _prep("completions", 40, 9), _rec("completions", 41, 10))
        assert (r.status, r.error_kind) == ("ok", "inexact")
        assert "usage says 9 output tokens, trace has 10" in (r.error or "")
        assert "40 prompt tokens, trace has 41" in (r.error or "")
    srv.usage = False
    got = {}
    for client in ("fast", "aiohttp"):
        r = await _send(client, url, _prep("completions", 40, 9), _rec("completions", 40, 9))
        assert (r.status, r.error_kind, r.completion_tokens) == ("ok", "inexact", None)
        assert "no usage: output length not checked" in (r.error or "")
        got[client] = _outcome(r)
    assert got["fast"] == got["aiohttp"]


async def test_vllm_extras_are_refused_by_the_generic_server(
    generic: tuple[GenericServer, str],
) -> None:
    _, url = generic
    r = await _send(
        "fast", url, _prep("completions", 40, 9, vllm_extras=True), _rec("completions", 40, 9)
    )
    assert (r.status, r.error_kind, r.http_status) == ("error", "http", 400)


@pytest.mark.parametrize("client", ["fast", "aiohttp"])
async def test_replay_with_no_vllm_extras_reports_times_not_per_token(
    generic: tuple[GenericServer, str], tmp_path: Path, client: str
) -> None:
    srv, url = generic
    rows = chain_rows(3, 2, gap_ns=20 * MS, think_ns=10 * MS, input_tokens=60, output_tokens=7)
    trace = write_rows(tmp_path / "t.parquet", rows)
    out = tmp_path / "out"
    s = await arun(
        RunConfig(
            trace=str(trace),
            target=url,
            output=str(out),
            salt=3,
            speedup=10,
            scrape_interval_s=0,
            vllm_extras=False,
            http_client=client,
            progress=False,
        ),
        progress=None,
    )
    assert (s.ok, s.failed, s.total) == (6, 0, 6)
    assert s.output_tokens == sum(r["output_tokens"] for r in rows)  # from the usage
    assert all(not any(f in b for f in VLLM_FIELDS) for b in srv.seen)
    t = pq.read_table(out / "requests").to_pylist()
    assert len(t) == 6
    for row in t:
        assert (row["status"], row["error_kind"]) == ("ok", "inexact"), row["error"]
        n = row["expected_output_tokens"]
        assert row["completion_tokens"] == n
        assert row["chunk_tokens"] == [1] * -(-n // 2)  # one per event, not the true 2
    r = build_report(out)
    st = r.stats
    assert st.requests["ok"] == 6 and st.requests["failed"] == 0
    assert st.inexact == {"requests": 6, "without_usage": 0}
    assert st.latency["ttft"].count == 6 and st.latency["e2e"].count == 6
    assert st.latency["chunk_gap"].count == sum(
        -(-row["expected_output_tokens"] // 2) - 1 for row in t
    )
    assert st.latency["tpot"].count == 0 and st.latency["itl"].count == 0 and st.tps.count == 0
    assert st.tokens_per_chunk == {}
    assert st.tokens["output"] == sum(row["expected_output_tokens"] for row in t)  # from usage
    assert st.fidelity["output_mismatches"] == 0
    assert st.extra["throughput"]["output_tokens_per_s"] > 0
    assert r.headline["p90_tps"] is None
    assert any("6 of 6 successful requests had inexact token counts" in w for w in r.warnings)
    text = to_text(r, width=120)
    assert "inexact token counts" in text and "6 requests had inexact token counts" in text
    buf = io.StringIO()
    render_summary(s, buf)  # the end-of-run summary's headline says why there is no TPS
    assert "6 ok, 0 failed" in buf.getvalue()
    assert "6 requests had inexact token counts" in buf.getvalue()
    assert "mismatches vs trace: 0; 6 with inexact tokens per chunk" in buf.getvalue()
    assert (s.inexact, s.mismatches) == (6, 0)
    summary = read_run_record(out).summary
    assert summary is not None and (summary.inexact, summary.mismatches) == (6, 0)
    # an inexact stream whose usage disagrees with the trace counts as a mismatch too
    srv.shortfall = 1
    out2 = tmp_path / "out2"
    s2 = await arun(
        RunConfig(
            trace=str(trace),
            target=url,
            output=str(out2),
            salt=3,
            speedup=10,
            scrape_interval_s=0,
            vllm_extras=False,
            http_client=client,
            progress=False,
        ),
        progress=None,
    )
    assert (s2.ok, s2.inexact, s2.mismatches) == (6, 6, 6)


def test_part_files_feed_inexact_rows_to_the_live_stats(tmp_path: Path) -> None:
    from agent_replay.analysis.live import LiveStats, PartsFeed
    from agent_replay.replay.results import ResultWriter

    w = ResultWriter(tmp_path, t0_ns=1_000)
    for i, kind in enumerate(("inexact", None)):
        r = _rec("completions", 40, 9)
        r.request_index = i
        r.sent_ns, r.end_ns = 2_000, 9_000
        r.first_token_ns = 3_000
        r.chunk_ns.extend([3_000, 5_000, 8_000])
        r.chunk_tokens.extend([1, 1, 1] if kind else [3, 3, 3])
        r.completion_tokens, r.error_kind = 9, kind
        w.add(r)
    w.close()
    feed = PartsFeed(tmp_path)
    assert feed.poll() == 1 and feed.poll() == 0  # each part is read once
    st = LiveStats.decode(feed.stats.encode())
    assert (st.ok, st.inexact, st.output_tokens) == (2, 1, 18)  # the inexact row: its usage
    assert st.hists["ttft"].count == 2 and st.hists["chunk_gap"].count == 4
    assert st.hists["tpot"].count == 1 and st.hists["itl"].count == 6
    assert st.tokens_per_chunk == {3: 3}
    kinds = pq.read_table(tmp_path / "requests").column("error_kind").to_pylist()
    assert sorted(kinds, key=str) == [None, "inexact"]
