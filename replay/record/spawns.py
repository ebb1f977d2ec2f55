"""Subagents that name neither their session nor their parent: a new conversation whose
task is the argument of a tool call that a request of a session just made. Sans-I/O: fed
replies' tool-call arguments (as functions that tell them when asked) and integer times.

qwen-code sends no session header; its ``agent`` tool starts a subagent whose first
request opens a new conversation (the subagent's own system prompt) and ends with the
``prompt`` the tool call handed it, word for word. Such a request (one that no earlier
conversation continues and no header places) belongs to the session of the request whose
reply made that call: among the last ``LOOKBACK`` requests to finish, the most recent one
that finished before it arrived and whose tool-call arguments hold the request's last
user text (at least ``MIN_TASK`` characters) as a JSON string. It is a stream of that
session (``spawned-N``), which its later turns continue (``replay.record.agents`` places
the spawn and the join).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from agent_replay.engines.replies import event_object
from agent_replay.engines.sse import SSEEvent

LOOKBACK = 256
"""How many of the last requests to finish are looked at."""

MIN_TASK = 8
"""The shortest task text matched (shorter ones say too little)."""

_ARGUMENT_KEYS = ("arguments", "partial_json")
"""Keys of a response's tool-call argument text: chat completions and Responses
``arguments`` (whole or in pieces), Anthropic's ``input_json_delta.partial_json``."""


def _walk(obj: Any, out: list[str]) -> None:
    """Tool-call argument text anywhere in a response object, in order."""
    if isinstance(obj, list):
        for item in obj:
            _walk(item, out)
        return
    if not isinstance(obj, dict):
        return
    if obj.get("type") == "response.function_call_arguments.delta":
        obj = {**obj, "arguments": obj.get("delta")}
    for key, value in obj.items():
        out.extend(_own_arguments(key, value))
        if isinstance(value, dict | list) and key not in _ARGUMENT_KEYS:
            _walk(value, out)


def _own_arguments(key: str, value: Any) -> list[str]:
    if key in _ARGUMENT_KEYS and isinstance(value, str):
        return [value]
    if key in ("args", "input") and isinstance(value, dict):  # Gemini, Anthropic JSON
        return [orjson.dumps(value).decode()]
    return []


def argument_text(events: Iterable[SSEEvent], body: Any = None) -> str:
    """The tool-call arguments of a response, as one text: a stream's ``events``, else
    its JSON ``body``."""
    out: list[str] = []
    for ev in events:
        _walk(event_object(ev), out)
    if body is not None:
        _walk(body, out)
    return "".join(out)


def task_text(items: Sequence[Any]) -> str | None:
    """The last text of a conversation's first user message (the task a spawning call
    handed over), None when shorter than ``MIN_TASK``."""
    first = next((it for it in items if isinstance(it, dict) and it.get("role") == "user"), None)
    text = _last_text(first.get("content")) if first is not None else ""
    return text if len(text) >= MIN_TASK else None


def _last_text(content: Any) -> str:
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, dict)]
        content = next((t for t in reversed(texts) if isinstance(t, str)), "")
    return content.strip() if isinstance(content, str) else ""


@dataclass(slots=True, eq=False)
class _Done:
    session_id: str
    end_ns: int
    fn: Callable[[], str] | None
    text: str = ""

    def arguments(self) -> str:
        fn = self.fn
        if fn is not None:
            self.text = fn()
            self.fn = None
        return self.text


@dataclass(slots=True)
class Spawns:
    """The sessions' last finished requests, by the tool-call arguments of their replies."""

    _done: deque[_Done] = field(default_factory=lambda: deque(maxlen=LOOKBACK))
    _streams: dict[str, int] = field(default_factory=dict)
    """Session -> how many spawned streams it has."""

    def finished(self, session_id: str, end_ns: int, arguments: Callable[[], str]) -> Any:
        """A request finished; ``arguments()`` tells its reply's tool-call arguments (asked
        once, when a later request is matched). Returns a handle for ``resolve``."""
        done = _Done(session_id, end_ns, arguments)
        self._done.append(done)
        return done

    @staticmethod
    def resolve(handle: Any) -> None:
        """Read the arguments now (before what they come from is let go)."""
        if isinstance(handle, _Done):
            handle.arguments()

    def spawner(self, items: Sequence[Any], arrival_ns: int) -> str | None:
        """The session whose request handed this conversation its task (see the module
        text), or None."""
        task = task_text(items)
        if task is None:
            return None
        forms = {orjson.dumps(task).decode()[1:-1], task}
        for done in reversed(self._done):
            if done.end_ns <= arrival_ns:
                text = done.arguments()
                if any(form in text for form in forms):
                    return done.session_id
        return None

    def name(self, session_id: str) -> str:
        """A new stream name of the session: ``spawned-1``, ``spawned-2``..."""
        n = self._streams.get(session_id, 0) + 1
        self._streams[session_id] = n
        return f"spawned-{n}"
