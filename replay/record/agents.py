"""Agent streams inside a recorded session: which stream a request belongs to
(``agent_id``) and which earlier requests it waited for (``depends_on``). Sans-I/O: fed
indices and integer times, no clocks.

Dependencies come from what the agent did, not from the order of arrival: a request that
carries an earlier request's reply (its conversation parent, ``replay.record.sessions``)
depends on that request; one that carries none (a title, a summary, a token count, a new
conversation) depends on the session's request that finished last before it arrived. So
requests an agent sends side by side stay side by side in the replay.

Streams (``agent_id``) are sequences, as the trace schema requires. Claude Code names a
subagent (a Task tool's run) in the ``x-claude-code-agent-id`` header; requests without it
are the main agent's (``MAIN``). An agent's requests are split into lanes so that each lane
stays a sequence: a request continues the lane of its conversation parent when the parent
is that lane's last turn; a request whose parent already has a successor in its lane (a
parallel branch), or a request without a conversation parent while the agent's lanes are
all busy, opens a new lane ``AGENT/N``.

Side requests (a title, a summary of the prompt: ``side``, a request that carries no
earlier reply and offers no tools) each go in a lane of their own, and nothing waits for
them: the client sends them beside its turns and goes on without their answers (one whose
conversation a later request continues was a turn after all). A side request depends on
its agent's turn that ended last before it arrived (the one whose reply the user saw).
Any other request without a conversation parent takes a finished lane of its agent's
turns, the one that ended last, and depends on its last turn.

* a subagent's first turn depends on the session's turn of another agent that finished
  last before it arrived among those whose reply called a tool (the call that spawned
  it), side requests last; that turn's lane is the subagent's spawner (subagents spawn
  subagents too);
* a turn of a spawner lane that arrives after a subagent's every turn has finished, the
  last with a reply that handed no tool call back to the client (one that did is followed
  by the subagent's next turn; Gemini CLI's ``complete_task`` ends the subagent), joins
  it: it also depends on the subagent's last turn (once per subagent). A subagent still
  running then stays a background branch. A lane that branched off the spawning turn
  itself (its first turn continues that turn while another request already did) is a
  spawner too: Claude Code's main turn with the subagent's launch may come second.

Handoffs (the OpenAI Agents SDK): an agent hands the conversation to another by calling a
tool ``transfer_to_NAME``; the next request carries that call and another system prompt
(instructions). Such a request, and every turn that continues it, is agent ``NAME``'s: a
stream spawned by the turn that called the tool; handing back to an agent whose system
prompt the session had before returns to that agent's stream, which then joins the one it
handed to (``handoff_target``, ``Handoffs``).

``think_ns`` of a turn with dependencies is the gap from the latest dependency's last byte.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from agent_replay.engines.replies import is_reply_item

MAIN = "main"
"""``agent_id`` of the main agent's stream (as in ``traces.tree``)."""

AGENT_HEADER = "x-claude-code-agent-id"


@dataclass(slots=True)
class _Stream:
    agent: str
    turns: list[int] = field(default_factory=list)
    joined: bool = False
    spawner: str | None = None
    spawn: int | None = None
    """The request that spawned this subagent."""
    branch_of: int | None = None
    """The request this lane's first turn continues, when another already had (a
    parallel branch)."""
    side: bool = False
    """Its last turn was a side request."""


@dataclass(slots=True)
class _SessionAgents:
    streams: dict[str, _Stream] = field(default_factory=dict)
    lane_of: dict[int, str] = field(default_factory=dict)
    arrival: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)
    side: set[int] = field(default_factory=set)
    """Side requests (nothing depends on them)."""
    calls: dict[int, bool | Callable[[], bool]] = field(default_factory=dict)
    """Whether a request's reply called a tool, or how to tell (asked once)."""

    def called(self, i: int) -> bool:
        c = self.calls.get(i, False)
        if callable(c):
            c = self.calls[i] = bool(c())
        return c


@dataclass(frozen=True, slots=True)
class Placement:
    agent_id: str
    depends_on: list[int]
    think_ns: int | None
    """Arrival minus the latest dependency's end (floored at 0); None when it has none or
    one has not finished."""


class AgentTracker:
    """Places each request of each session in its agent stream (see the module text)."""

    def __init__(self) -> None:
        self._sessions: dict[str, _SessionAgents] = {}

    def place(
        self,
        session_id: str,
        request_index: int,
        agent_id: str | None,
        arrival_ns: int,
        parent_index: int,
        linked: bool = True,
        side: bool = False,
    ) -> Placement:
        """``parent_index``: the request's parent in the session (-1: none); ``linked``:
        the parent was found by conversation (the request carries its reply or extends
        its prompt), not only as the session's last finished request; ``side``: a side
        request (see the module text; only one without a linked parent is)."""
        s = self._sessions.setdefault(session_id, _SessionAgents())
        agent = agent_id or MAIN
        done = lambda i: i in s.end and s.end[i] <= arrival_ns  # noqa: E731
        lanes = [name for name, st in s.streams.items() if st.agent == agent]
        has_link = linked and parent_index >= 0
        side = side and not has_link and (agent == MAIN or bool(lanes))
        deps: list[int] = []
        lane: str | None = None
        if has_link and s.lane_of.get(parent_index) in lanes:
            home = s.lane_of[parent_index]
            deps.append(parent_index)
            s.side.discard(parent_index)  # continued: a turn after all
            if s.streams[home].turns[-1] == parent_index:
                lane = home
        elif side:  # a lane of its own
            seen = [
                i
                for i in s.end
                if done(i) and i not in s.side and s.streams[s.lane_of[i]].agent == agent
            ]
            if seen:
                deps.append(max(seen, key=lambda i: (s.end[i], i)))
        else:
            if has_link:
                deps.append(parent_index)
            free = [n for n in lanes if not s.streams[n].side and done(s.streams[n].turns[-1])]
            if free:
                lane = max(free, key=lambda n: (s.end[s.streams[n].turns[-1]], n == agent))
                deps.append(s.streams[lane].turns[-1])
            elif not lanes and agent != MAIN:  # a subagent's first turn: its spawn
                spawned = [i for i in s.end if done(i) and s.streams[s.lane_of[i]].agent != agent]
                if spawned:
                    spawn = max(spawned, key=lambda i: (i not in s.side, s.called(i), s.end[i], i))
                    deps.append(spawn)
                    lane = agent
                    s.streams[lane] = _Stream(agent, spawner=s.lane_of[spawn], spawn=spawn)
            elif not lanes:
                lane = agent
        if lane is None:
            lane = agent if agent not in s.streams else f"{agent}/{len(lanes) + 1}"
            while lane in s.streams:
                lane += "+"
        stream = s.streams.get(lane)
        if stream is None:
            stream = s.streams[lane] = _Stream(agent)
            if has_link and s.lane_of.get(parent_index) in lanes:
                stream.branch_of = parent_index
        for sub in s.streams.values():
            if sub.joined or not sub.turns:
                continue
            if sub.spawner != lane and (sub.spawn is None or sub.spawn != stream.branch_of):
                continue
            if all(done(i) for i in sub.turns) and not s.called(sub.turns[-1]):
                deps.append(sub.turns[-1])
                sub.joined = True
        stream.turns.append(request_index)
        stream.side = side
        if side:
            s.side.add(request_index)
        s.lane_of[request_index] = lane
        s.arrival[request_index] = arrival_ns
        deps = sorted(set(deps))
        think = None
        if deps and all(d in s.end for d in deps):
            think = max(0, arrival_ns - max(s.end[d] for d in deps))
        return Placement(lane, deps, think)

    def complete(
        self,
        session_id: str,
        request_index: int,
        end_ns: int,
        called: bool | Callable[[], bool] | None = None,
    ) -> None:
        """``called``: whether the reply called a tool (or a function that tells it when
        asked; None: unknown)."""
        s = self._sessions.get(session_id)
        if s is not None:
            s.end[request_index] = end_ns
            if called is not None:
                s.calls[request_index] = called


HANDOFF_PREFIX = "transfer_to_"
"""The OpenAI Agents SDK's default name of a handoff tool: ``transfer_to_`` and the target
agent's name in snake case."""


def _tool_names(item: Any) -> list[str]:
    """Names of the tools a model-produced item calls (chat ``tool_calls``, a Responses
    ``function_call``, Anthropic ``tool_use`` blocks)."""
    if item.get("type") == "function_call":
        return [str(item.get("name") or "")]
    names = [
        str((tc.get("function") or {}).get("name") or "")
        for tc in item.get("tool_calls") or ()
        if isinstance(tc, dict)
    ]
    content = item.get("content")
    if isinstance(content, list):
        names += [
            str(b.get("name") or "")
            for b in content
            if isinstance(b, dict) and b.get("type") == "tool_use"
        ]
    return names


def handoff_target(items: Sequence[Any]) -> str | None:
    """The agent the conversation's last reply hands off to (its ``transfer_to_NAME`` tool
    call: ``NAME``), or None."""
    i = len(items) - 1
    while i >= 0 and not is_reply_item(items[i]):
        i -= 1
    while i >= 0 and is_reply_item(items[i]):
        for name in _tool_names(items[i]):
            if name.startswith(HANDOFF_PREFIX) and len(name) > len(HANDOFF_PREFIX):
                return name[len(HANDOFF_PREFIX) :]
        i -= 1
    return None


def system_key(system: Any, items: Sequence[Any]) -> bytes:
    """A digest of the system prompt: the API's own field (``system``, ``instructions``)
    and the conversation's leading system/developer items."""
    lead = []
    for it in items:
        if not (isinstance(it, dict) and it.get("role") in ("system", "developer")):
            break
        lead.append(it)
    return hashlib.blake2b(
        orjson.dumps([system, lead], option=orjson.OPT_SORT_KEYS), digest_size=16
    ).digest()


class Handoffs:
    """The stream of each request of a session in terms of handoffs: ``stream`` is called
    for requests no header names an agent of, in arrival order."""

    def __init__(self) -> None:
        self._names: dict[str, dict[bytes, str]] = {}
        """Session -> system prompt digest -> the stream that had it."""
        self._stream: dict[tuple[str, int], str] = {}

    def name(self, session_id: str, request_index: int, stream: str) -> None:
        """The request starts stream ``stream`` (a subagent found otherwise): the turns
        that continue it are that stream's."""
        self._stream[(session_id, request_index)] = stream

    def stream(
        self,
        session_id: str,
        request_index: int,
        parent_index: int,
        linked: bool,
        system: Any,
        items: Sequence[Any],
    ) -> str:
        names = self._names.get(session_id)
        if names is None:
            names = self._names[session_id] = {system_key(system, items): MAIN}
        own = MAIN
        if linked and parent_index >= 0:
            own = self._stream.get((session_id, parent_index), MAIN)
            target = handoff_target(items)
            if target is not None:
                key = system_key(system, items)
                name = names.get(key)
                if name is None:
                    name = target
                    while name in names.values():
                        name += "+"
                    names[key] = name
                own = name
        if own != MAIN:
            self._stream[(session_id, request_index)] = own
        return own
