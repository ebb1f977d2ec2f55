"""Gemini CLI's sessions as the recorder sees them: its history edits and its subagents.
Sans-I/O: fed conversation items, digests and integer times.

History edits. Gemini CLI sends back a model turn other than as the API gave it:

* every model turn of the running prompt (since the user's last words) gets a
  ``thoughtSignature`` on its first ``functionCall`` part (a stand-in,
  ``skip_thought_signature_validator``, where the API sent none), and the turns of
  earlier prompts go without it again;
* a call's ``id`` is the API's prefixed with the function's name, or one the CLI made up,
  on the call and on its ``functionResponse``;
* a session resumed (``--resume``) sends each earlier call's ``functionResponse`` twice,
  the same part (same ``id``) again in the same content.

``session_items`` is the conversation as session inference compares it
(``replay.record.sessions``): a ``functionCall`` part as a ``tool_use`` block identified by
its name and arguments (``engines.apis.gemini.call_id``, as the reply read from the
answer is), a ``functionResponse`` part once and without its ``id``, no
``thoughtSignature`` anywhere. The prompt's block hashes still come from the request as sent: the server's
cache sees those bytes.

Subagents. A Gemini CLI subagent (``invoke_agent``, or a tool named after the agent) runs
its own conversation, with its own system prompt and the ``complete_task`` tool that no
main agent has, and no header names it. A request that offers ``complete_task``, whose
conversation continues no earlier Gemini request's, is a subagent's first turn: it
belongs to the session of the latest turn (of any agent, subagents spawn subagents)
that ended before it arrived with a reply that called a function and that nothing has
continued yet (the call is still running), one that called ``invoke_agent`` first; it is
a new agent stream of that session, ``NAME-N`` after the function called. Its later turns continue its first turn's
conversation and stay in its stream. Without such a turn it starts a session of its own,
as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent_replay.engines.apis.gemini import call_id
from agent_replay.replay.record.sessions import Turn

API = "gemini"
INVOKE = "invoke_agent"
"""Gemini CLI's tool that runs a subagent (a custom agent may have a tool of its name)."""
COMPLETE_TASK = "complete_task"
"""The tool every Gemini CLI subagent is given to end its run, and no main agent."""


def _part(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    ident = call_id(block)
    if ident is not None:
        return {"type": "tool_use", "id": ident, "name": block["functionCall"].get("name")}
    fr = block.get("functionResponse")
    if isinstance(fr, dict):
        return {"functionResponse": {k: v for k, v in fr.items() if k != "id"}}
    if "thoughtSignature" in block:
        return {k: v for k, v in block.items() if k != "thoughtSignature"}
    return block


def session_items(api: str, items: Sequence[Any]) -> Sequence[Any]:
    """The conversation as session inference compares it (see the module text); other
    APIs' items as they are."""
    if api != API:
        return items
    out = []
    for it in items:
        content = it.get("content") if isinstance(it, dict) else None
        if isinstance(content, list):
            it = {**it, "content": [_part(b) for b in _once(content)]}
        out.append(it)
    return out


def _once(blocks: list[Any]) -> list[Any]:
    """The parts of one content, a ``functionResponse`` part sent again (the same ``id``)
    left out."""
    seen: list[Any] = []
    out = []
    for b in blocks:
        if isinstance(b, dict) and "functionResponse" in b:
            if b in seen:
                continue
            seen.append(b)
        out.append(b)
    return out


def offers_complete_task(tools: Any) -> bool:
    """Gemini ``tools`` hold a ``complete_task`` function (a subagent's request)."""
    for t in tools if isinstance(tools, list) else ():
        for fn in (t.get("functionDeclarations") or ()) if isinstance(t, dict) else ():
            if isinstance(fn, dict) and fn.get("name") == COMPLETE_TASK:
                return True
    return False


@dataclass(frozen=True, slots=True)
class Route:
    session_id: str
    agent: str


class GeminiSubagents:
    """Finds the session and stream of Gemini CLI subagents' requests (see the module
    text). ``memory`` bounds the turns and conversations kept."""

    def __init__(self, memory: int = 10_000) -> None:
        self._roots: dict[bytes, Route] = {}
        """A subagent's first conversation (its chain digest) -> its session and stream."""
        self._keys: dict[bytes, None] = {}
        """Conversations of the Gemini requests seen (chain digests), oldest first."""
        self._turns: deque[Turn] = deque(maxlen=memory)
        self._continued: dict[tuple[str, int], None] = {}
        self._count = 0
        self._memory = memory

    def route(self, arrival_ns: int, chains: Sequence[bytes], tools: Any) -> Route | None:
        """The session and stream of a Gemini request whose conversation has these chain
        digests (``sessions.chain_digests``) and that offers ``tools``; None: session
        inference decides, as for any request."""
        root = next((r for r in map(self._roots.get, reversed(chains[1:])) if r), None)
        if root is not None:
            return root
        if not offers_complete_task(tools) or any(c in self._keys for c in chains[1:]):
            return None
        return self._spawned(arrival_ns, chains[-1])

    def _spawned(self, arrival_ns: int, key: bytes) -> Route | None:
        """A subagent's first turn (conversation ``key``): the stream it opens in the
        session of the call it answers, if one is running."""
        waiting = [t for t in self._turns if self._waiting(t, arrival_ns)]
        if not waiting:
            return None
        spawn = max(waiting, key=lambda t: (INVOKE in _called(t), t.end_ns or 0, t.request_index))
        self._count += 1
        name = (_called(spawn) or ["agent"])[-1]
        route = Route(spawn.session_id, f"{name}-{self._count}")
        self._roots[key] = route
        return route

    def _waiting(self, t: Turn, arrival_ns: int) -> bool:
        """``t`` ended before ``arrival_ns`` with a reply that called a function, and no
        request continued it yet."""
        if t.end_ns is None or t.end_ns > arrival_ns or t.failed:
            return False
        if (t.session_id, t.request_index) in self._continued:
            return False
        return bool(t.reply and t.reply.tool_ids)

    def seen(self, chains: Sequence[bytes], turn: Turn, parent_index: int, linked: bool) -> None:
        """A Gemini request was assigned: its conversation, its turn and, when it continues
        one (``linked``), its parent in the session."""
        self._keys[chains[-1]] = None
        self._turns.append(turn)
        if linked and parent_index >= 0:
            self._continued[(turn.session_id, parent_index)] = None
        _bound(self._keys, self._memory)
        _bound(self._continued, self._memory)
        _bound(self._roots, self._memory)


def hands_back(tool_ids: Sequence[str]) -> bool:
    """Whether a reply's tool calls hand work back to the client, which answers them in its
    next request: any call but Gemini CLI's ``complete_task``, with which a subagent ends
    (a Gemini call id is the function's name, ``:``, a digest; other APIs' ids never
    name ``complete_task``)."""
    return any(i.rsplit(":", 1)[0] != COMPLETE_TASK for i in tool_ids)


def _called(t: Turn) -> list[str]:
    """The functions a turn's reply called (``call_id`` is the name, ``:``, a digest)."""
    return [i.rsplit(":", 1)[0] for i in t.reply.tool_ids] if t.reply else []


def _bound(d: dict[Any, Any], n: int) -> None:
    """Forget the oldest entries of ``d`` beyond ``n``."""
    while len(d) > n:
        del d[next(iter(d))]
