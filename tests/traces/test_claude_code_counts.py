"""Claude Code logs: an output count logged without a stop reason is the stream's start,
whatever its figure. The fixture is synthetic (the real logs are GPL-2.0), in their shape:
one record per content block, ``message.usage`` as the CLI logged it.

Before: a message logged as 5 output tokens with no stop reason (14 words and a tool call)
kept 5; only 1-4 were treated as incomplete. After: its content's estimate (67 tokens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_replay.traces.importers import import_paths
from agent_replay.traces.importers.claude_code import estimate_output

WORDS = "I will read the configuration file first and then fix the failing test now."
CALL = {"file_path": "/repo/setup.cfg"}


def _rec(uuid: str, parent: str | None, t: int, kind: str, message: dict[str, Any]) -> str:
    return json.dumps(
        {
            "type": kind,
            "uuid": uuid,
            "parentUuid": parent,
            "sessionId": "s1",
            "timestamp": f"2025-08-01T10:00:{t:02d}.000Z",
            "isSidechain": False,
            "message": message,
        }
    )


def _assistant(
    mid: str, content: list[dict[str, Any]], out: int, stop: str | None
) -> dict[str, Any]:
    return {
        "id": mid,
        "role": "assistant",
        "model": "claude-3-5-haiku",
        "content": content,
        "stop_reason": stop,
        "usage": {
            "input_tokens": 100,
            "output_tokens": out,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        },
    }


def _log(tmp_path: Path, out: int, stop: str | None) -> Path:
    lines = [
        _rec("u1", None, 0, "user", {"role": "user", "content": "fix the test"}),
        _rec(
            "a1",
            "u1",
            2,
            "assistant",
            _assistant("m1", [{"type": "text", "text": WORDS}], out, stop),
        ),
        _rec(
            "a2",
            "a1",
            3,
            "assistant",
            _assistant(
                "m1", [{"type": "tool_use", "id": "t1", "name": "Read", "input": CALL}], out, stop
            ),
        ),
        _rec(
            "u2",
            "a2",
            4,
            "user",
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "[metadata]"}],
            },
        ),
        _rec(
            "a3",
            "u2",
            6,
            "assistant",
            _assistant("m2", [{"type": "text", "text": "Done."}], 3, "end_turn"),
        ),
    ]
    f = tmp_path / "trace.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return f


@pytest.mark.parametrize("logged", [2, 5, 40])
def test_no_stop_reason_is_incomplete_whatever_the_count(tmp_path: Path, logged: int) -> None:
    t = import_paths([_log(tmp_path, logged, None)], "claude-code").table.to_pydict()
    guess = estimate_output([WORDS, json.dumps(CALL, separators=(",", ":"))], 1)
    assert len(WORDS.split()) == 14 and guess == 67  # ceil((75 + 31 characters) / 4) + 40
    assert t["output_tokens"] == [guess, 3] and t["output_estimated"] == [True, False]


def test_a_count_with_a_stop_reason_is_kept(tmp_path: Path) -> None:
    t = import_paths([_log(tmp_path, 5, "tool_use")], "claude-code").table.to_pydict()
    assert t["output_tokens"] == [5, 3] and t["output_estimated"] == [False, False]


def test_a_count_above_the_content_estimate_is_kept(tmp_path: Path) -> None:
    """No stop reason but a figure larger than the content says (a final count logged
    without its stop reason): the log's figure stands, not marked estimated."""
    t = import_paths([_log(tmp_path, 500, None)], "claude-code").table.to_pydict()
    assert t["output_tokens"] == [500, 3] and t["output_estimated"] == [False, False]
