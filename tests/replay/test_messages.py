"""Worker -> parent messages are values that cross a process boundary intact."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from agent_replay.replay.feed import ProgressFeed
from agent_replay.replay.messages import ActorPoll, Progress


def _progress(shard: int, **kw: object) -> Progress:
    base = dict(
        shard=shard,
        elapsed_ns=2_000_000_000,
        total=10,
        sent=4,
        done=3,
        skipped=0,
        in_flight=1,
        sessions=2,
        ok=3,
        errors=0,
        chunks=30,
        output_tokens=90,
        cpu=0.25,
        loop_lags=(1_000, 2_000),
    )
    base.update(kw)
    return Progress(**base)  # type: ignore[arg-type]


def test_messages_pickle_and_are_frozen():
    p = _progress(1)
    poll = ActorPoll(progress=p, parts=[("part-001-0.parquet", b"x")], snapshot=b"s", done=False)
    assert pickle.loads(pickle.dumps(poll)) == poll
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.done = 4  # type: ignore[misc]


def test_a_missing_field_fails_where_the_message_is_built():
    with pytest.raises(TypeError):
        Progress(shard=0, elapsed_ns=0)  # type: ignore[call-arg]


def test_the_progress_line_sums_the_workers_latest_messages():
    lines: list[str] = []
    prog = ProgressFeed(lines.append, every_s=0.0)
    prog.update(_progress(0, done=3, elapsed_ns=1_000_000_000))
    prog.update(_progress(1, done=5, errors=1, elapsed_ns=2_500_000_000))
    prog.update(_progress(0, done=4, elapsed_ns=3_000_000_000))  # replaces shard 0's message
    assert lines[-1].startswith("[    3.0s] 9/20 done, 1 failed, 2 in flight, 4 sessions, ")
    assert lines[-1].endswith(" 180 tokens")
