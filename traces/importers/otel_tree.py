"""The agent tree of OpenTelemetry requests: streams (an agent each) within a session,
side-by-side lanes within a stream, subagents spawned and joined, and Claude Code's
subagents read from the order of its events. Pure functions over requests and marks."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent_replay.traces.builder import Request


def _done_by(q: Request, t: int) -> bool:
    """Request ``q`` has ended by time ``t``."""
    return q.arrival_abs_ns + (q.end_ns or 0) <= t


def _lane_for(lane: list[Request], r: Request) -> tuple[int, Request | None]:
    """The lane ``r`` continues and the request it follows there: of the free lanes (a side
    request's is never continued), the one whose prompt it extends (the longest not longer
    than its own), else the first free; none free: a new lane, side by side (no
    predecessor)."""
    free = [
        i for i, q in enumerate(lane) if _done_by(q, r.arrival_abs_ns) and not q.extra.get("side")
    ]
    if not free:
        lane.append(r)
        return len(lane) - 1, None
    grown = [i for i in free if lane[i].input_tokens <= r.input_tokens]
    n = max(grown, key=lambda i: (lane[i].input_tokens, -i)) if grown else free[0]
    prev = lane[n]
    lane[n] = r
    return n, prev


@dataclass
class _Tree:
    agent_ids: dict[object, str]
    outer_of: dict[object, object]
    end_of: dict[object, int]
    last: dict[tuple[str, object], Request] = field(default_factory=dict)
    lanes: dict[tuple[str, object], list[Request]] = field(default_factory=dict)
    """The last request of each lane of each stream."""
    joined: set[object] = field(default_factory=set)
    """Keys some later request depends on."""
    pending: dict[tuple[str, object], list[object]] = field(default_factory=dict)
    """Subagents the stream has yet to join."""
    history: dict[tuple[str, object], list[Request]] = field(default_factory=dict)
    """Every request of each stream."""

    def place(self, r: Request, stream: object) -> None:
        key = (r.session, stream)
        first = key not in self.lanes
        lane = self.lanes.setdefault(key, [])
        n, prev = _lane_for(lane, r)
        deps: list[Request] = [prev] if prev is not None else []
        # the other lanes' ends this request has seen come back
        deps += [
            q
            for i, q in enumerate(lane)
            if i != n
            and q.key not in self.joined
            and not q.extra.get("side")
            and _done_by(q, r.arrival_abs_ns)
        ]
        parent = prev
        if stream is not None and first:
            parent = self._spawn(r, stream, deps) or parent
        deps += self._joins(r, key)
        self._link(r, stream, n, parent, deps)
        self.last[key] = r
        self.history.setdefault(key, []).append(r)

    def _link(
        self, r: Request, stream: object, n: int, parent: Request | None, deps: list[Request]
    ) -> None:
        """Set ``r``'s agent id (lane ``n`` of its stream), parent, dependencies and think
        time (since the latest dependency's end)."""
        r.agent_id = ("main" if stream is None else self.agent_ids[stream]) + (
            f"/{n + 1}" if n else ""
        )
        r.parent_key = parent.key if parent is not None else None
        r.depends_on_keys = [d.key for d in deps]
        self.joined.update(d.key for d in deps)
        ends = [d.arrival_abs_ns + (d.end_ns or 0) for d in deps]
        r.think_ns = max(0, r.arrival_abs_ns - max(ends)) if ends else None

    def _spawn(self, r: Request, stream: object, deps: list[Request]) -> Request | None:
        """A subagent's first request: spawned by its enclosing stream's request that
        ended last before it (returned, and added to ``deps``; one still running cannot
        have made the call, nor can a side request such as the session title), and owed a
        join by that stream."""
        outer = (r.session, self.outer_of.get(stream))
        ended = [
            q
            for q in self.history.get(outer, ())
            if _done_by(q, r.arrival_abs_ns) and not q.extra.get("side")
        ]
        spawner = max(ended, key=lambda q: q.arrival_abs_ns + (q.end_ns or 0)) if ended else None
        if spawner is not None:
            deps.append(spawner)
        self.pending.setdefault(outer, []).append(stream)
        return spawner

    def _joins(self, r: Request, key: tuple[str, object]) -> list[Request]:
        """The last requests of the subagents of stream ``key`` that ended before ``r``."""
        out: list[Request] = []
        waiting = self.pending.get(key, [])
        for sub in list(waiting):
            sub_last = self.last.get((r.session, sub))
            if (
                sub_last is not None
                and self.end_of.get(sub, sub_last.arrival_abs_ns) <= r.arrival_abs_ns
            ):
                out.append(sub_last)
                waiting.remove(sub)
        return out


def assemble(
    items: list[tuple[Request, object]],
    agent_ids: dict[object, str],
    outer_of: dict[object, object],
    end_of: dict[object, int],
) -> list[Request]:
    """Parents, dependencies, agent ids and think times of requests in arrival order, each
    in a stream (None: the main agent) of its session. Within a stream each request follows
    the one before; a request that arrives while every earlier one of its stream still
    runs goes side by side, in a lane of its own (agent id ``NAME/2``, ``/3``..., as the
    recorder names them); a later request continues the free lane whose last prompt it
    extends (the longest not longer than its own; else the first free) and waits for every
    other lane's last request that has ended, except side requests (``extra["side"]``:
    Claude Code's session title), which nothing waits for. A subagent's first request is spawned by its
    enclosing stream's request that ended last before it, and the enclosing stream's first
    request after the subagent ended (``end_of``) waits for the subagent's last one."""
    tree = _Tree(agent_ids, outer_of, end_of)
    for r, stream in items:
        tree.place(r, stream)
    return [r for r, _ in items]


def uncached_sessions(events: list[Request]) -> set[str]:
    """Sessions whose Claude Code ``input_tokens`` count the uncached part of the prompt
    alone (Anthropic's API), as opposed to the whole prompt (vLLM, and servers like it,
    report the whole prompt on the Messages API too). In arrival order, a request whose
    cache read is larger than its own ``input_tokens``, or than every earlier request's of
    its session (subagents interleave: any earlier prompt may hold the prefix), read more
    from the cache than a whole-prompt count allows: the counts are uncached. Where no
    request reads the cache the two readings agree."""
    out: set[str] = set()
    most: dict[str, int] = {}
    for r in events:
        parts = r.extra.get("cache_parts")
        if not isinstance(parts, tuple):
            continue
        read = int(parts[0])
        if read > r.input_tokens or read > most.get(r.session, read):
            out.add(r.session)
        most[r.session] = max(most.get(r.session, 0), r.input_tokens)
    return out


@dataclass(slots=True)
class Mark:
    """A Claude Code event that shapes its agent tree, in its session's order."""

    session: str
    order: tuple[int, int]
    ts: int
    kind: str  # "request", "spawn", "done"
    ref: object  # the request's index in the collector's events, or the Agent call's tool_use_id
    agent: str | None  # requests: the subagent's name (None: the main agent)


@dataclass
class _SessionMarks:
    """One session's walk through its marks (``claude_streams``)."""

    session: str
    agent_ids: dict[object, str]
    outer_of: dict[object, object]
    end_of: dict[object, int]
    stack: list[str] = field(default_factory=list)
    quiet: set[str] = field(default_factory=set)
    """Subagents opened that have sent no request yet."""
    deferred: list[str] = field(default_factory=list)
    mine: dict[int, object] = field(default_factory=dict)
    flat: bool = False

    def spawn(self, ref: str) -> None:
        # logged before the api_request of the turn that made the call: it opens after
        # that request
        self.deferred.append(ref)

    def done(self, ref: str, ts: int) -> None:
        if ref in self.deferred:
            self.deferred.remove(ref)
        if ref in self.stack:
            self.stack.remove(ref)
            self.quiet.discard(ref)
            self.end_of[(self.session, ref)] = ts

    def request(self, ref: str, agent: str | None) -> None:
        if agent is not None and self.stack:
            top = self.stack[-1]
            self.quiet.discard(top)
            self.mine[int(ref)] = (self.session, top)
            self.agent_ids[(self.session, top)] = f"{agent}-{top[-8:]}"
        for opened in self.deferred:
            self.flat = self.flat or bool(self.quiet)
            self.stack.append(opened)
            self.quiet.add(opened)
            self.outer_of[(self.session, opened)] = (
                (self.session, self.stack[-2]) if len(self.stack) > 1 else None
            )
        self.deferred = []


def claude_streams(
    marks: list[Mark],
    agent_ids: dict[object, str],
    outer_of: dict[object, object],
    end_of: dict[object, int],
) -> tuple[dict[int, object], int]:
    """Claude Code's subagents: an accepted ``Agent`` (``Task``) call opens one (after the
    ``api_request`` of the turn that made it, which Claude Code logs after the call's
    ``tool_decision``), its ``tool_result`` closes it, and a request whose ``agent.name`` /
    ``query_source`` names a subagent belongs to the innermost one open. Subagents run one
    inside another; two calls opened before either sends a request run side by side, and
    the events do not say whose request is whose: that session stays one stream. Returns
    the stream of each event request (by index) and the number of such flat sessions."""
    by_session: dict[str, list[Mark]] = {}
    for m in marks:
        by_session.setdefault(m.session, []).append(m)
    out: dict[int, object] = {}
    n_flat = 0
    for session, ms in by_session.items():
        walk = _SessionMarks(session, agent_ids, outer_of, end_of)
        ordered = all(x.order[0] >= 0 for x in ms)
        for m in sorted(ms, key=lambda m: m.order if ordered else (m.ts, m.order[0])):
            if m.kind == "spawn":
                walk.spawn(str(m.ref))
            elif m.kind == "done":
                walk.done(str(m.ref), m.ts)
            else:
                walk.request(str(m.ref), m.agent)
        if walk.flat:
            n_flat += 1
        else:
            out.update(walk.mine)
    return out, n_flat
