"""Agent streams inside a recorded session: which agent sent a request (``agent_id``) and
which earlier requests it waited for (``depends_on``). Sans-I/O: fed indices and integer
times, no clocks.

Claude Code names a subagent (a Task tool's run) in the ``x-claude-code-agent-id`` header;
requests without it are the main agent's (``MAIN``). The rules are the trace tree's
(``traces.tree.derive_depends_on``), applied as requests arrive:

* a turn depends on the previous turn of its stream (each stream is a sequence, as the
  trace schema requires: a retry waits for the failed request, a branch for its sibling);
* a subagent's first turn depends on the session's turn (of another stream) that finished
  last before it arrived: the one whose reply spawned it; that turn's stream is the
  subagent's spawner (subagents spawn subagents too);
* a turn of a spawner that arrives after a subagent's every turn has finished joins it:
  it also depends on the subagent's last turn (once per subagent). A subagent still
  running then stays a background branch.

``think_ns`` of a turn with dependencies is the gap from the latest dependency's last byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAIN = "main"
"""``agent_id`` of the main agent's stream (as in ``traces.tree``)."""

AGENT_HEADER = "x-claude-code-agent-id"


@dataclass(slots=True)
class _Stream:
    turns: list[int] = field(default_factory=list)
    joined: bool = False
    spawner: str | None = None


@dataclass(slots=True)
class _SessionAgents:
    streams: dict[str, _Stream] = field(default_factory=dict)
    agent_of: dict[int, str] = field(default_factory=dict)
    arrival: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)


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

    def place(self, session_id: str, request_index: int, agent_id: str | None,
              arrival_ns: int, parent_index: int) -> Placement:
        s = self._sessions.setdefault(session_id, _SessionAgents())
        agent = agent_id or MAIN
        stream = s.streams.get(agent)
        deps: list[int] = []
        if stream is not None and stream.turns:
            deps.append(stream.turns[-1])
        spawner: str | None = None
        if stream is None and agent != MAIN:
            done = [i for i, e in s.end.items() if e <= arrival_ns and s.agent_of[i] != agent]
            if done:
                spawn = max(done, key=lambda i: (s.end[i], i))
                deps.append(spawn)
                spawner = s.agent_of[spawn]
            elif parent_index >= 0:
                deps.append(parent_index)
        elif stream is None and parent_index >= 0:
            deps.append(parent_index)
        for sub in s.streams.values():
            if sub.spawner != agent or sub.joined or not sub.turns:
                continue
            if all(i in s.end and s.end[i] <= arrival_ns for i in sub.turns):
                deps.append(sub.turns[-1])
                sub.joined = True
        if stream is None:
            stream = s.streams[agent] = _Stream(spawner=spawner)
        stream.turns.append(request_index)
        s.agent_of[request_index] = agent
        s.arrival[request_index] = arrival_ns
        deps = sorted(set(deps))
        think = None
        if deps and all(d in s.end for d in deps):
            think = max(0, arrival_ns - max(s.end[d] for d in deps))
        return Placement(agent, deps, think)

    def complete(self, session_id: str, request_index: int, end_ns: int) -> None:
        s = self._sessions.get(session_id)
        if s is not None:
            s.end[request_index] = end_ns
