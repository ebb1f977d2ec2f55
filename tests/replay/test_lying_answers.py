"""Answers whose content lies, checked at the end of the stream and in the token count:
a ``usage`` that disagrees with the stream is flagged and not believed; a whole answer
without a token where the trace asks for tokens is a failure of kind ``empty``."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from agent_replay.analysis.metrics import served_output_tokens
from agent_replay.engines.sim.faults import parse_faults
from agent_replay.errors import InputError
from agent_replay.replay.client import EventStream, usage_disagrees
from agent_replay.replay.outcome import RequestRecord
from tests.replay.rawserver import events


def _rec(n_out: int) -> RequestRecord:
    return RequestRecord(
        session_id="s",
        request_index=0,
        parent_index=-1,
        clone=0,
        worker=0,
        request_id="r",
        api="completions",
        expected_input_tokens=40,
        expected_output_tokens=n_out,
        implied_cached_tokens=None,
    )


def _play(evs: list[bytes], n_out: int = 5) -> RequestRecord:
    rec = _rec(n_out)
    rec.http_status = 200
    s = EventStream(rec, "completions")
    for i, ev in enumerate(evs):
        s.feed(ev, 10 + i)
    s.finish(100)
    return rec


def _final_usage(evs: list[bytes], completion: int) -> list[bytes]:
    """``evs`` with the final usage event saying ``completion`` output tokens."""
    usage = {"prompt_tokens": 40, "completion_tokens": completion, "total_tokens": 40 + completion}
    return [
        *evs[:-2],
        b"data: " + orjson.dumps({"id": "x", "choices": [], "usage": usage}) + b"\n\n",
        evs[-1],
    ]


def test_a_usage_that_disagrees_with_the_stream_is_flagged_not_believed() -> None:
    honest = _play(events(5))
    assert honest.status == "ok" and honest.error_kind is None
    assert not usage_disagrees(honest)
    liar = _play(_final_usage(events(5), 50))
    assert liar.status == "ok" and liar.error_kind == "mismatch"
    assert liar.error == "usage says 50 output tokens, chunks carried 5"
    assert usage_disagrees(liar)
    assert sum(liar.chunk_tokens) == 5 and liar.completion_tokens == 50


def test_a_whole_answer_without_tokens_is_empty() -> None:
    head_only = [events(5)[-2], events(5)[-1]]  # usage and [DONE], no content event
    r = _play(_final_usage(head_only, 0))
    assert r.status == "error" and r.error_kind == "empty"
    assert r.error == "HTTP 200 with no output token; the trace asks for 5"
    lying = _play(_final_usage(head_only, 7))  # a usage of 7 does not make tokens appear
    assert lying.error_kind == "empty"
    asked_none = _play(_final_usage(head_only, 0), n_out=0)  # the trace asks for no token
    assert asked_none.status == "ok"
    cut = _play([events(5)[-2]])  # no end marker: a broken stream, not an empty answer
    assert cut.error_kind == "stream"


def test_served_output_tokens_believes_the_stream_where_it_is_exact() -> None:
    nan = np.nan
    completion = np.array([50.0, nan, 9.0, nan, 7.0])
    streamed = np.array([5.0, 6.0, 3.0, 4.0, 7.0])
    exact = np.array([True, True, False, False, True])
    # exact: the stream (5, 6, 7); inexact: the usage (9), or the events without one (4)
    assert served_output_tokens(completion, streamed, exact).tolist() == [5, 6, 9, 4, 7]


def test_the_sim_faults_parse_and_are_checked() -> None:
    f = parse_faults("usage_scale=10;empty=0.25")
    assert f.usage_scale == 10 and f.empty == 0.25 and f.lies
    assert not parse_faults("reset_after=3").lies
    with pytest.raises(InputError, match="empty must be within"):
        parse_faults("empty=2")
    with pytest.raises(InputError, match="usage_scale must be within"):
        parse_faults("usage_scale=-1")
