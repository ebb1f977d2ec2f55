"""Which session a request belongs to, and which earlier request it waited for.
Sans-I/O: fed conversation items and integer times, no clocks.

Rules, in order:

1. A request whose conversation is an earlier request's conversation, followed by that
   request's reply (the model-produced items: assistant message, tool calls) and anything
   after it (tool results, the user's next message), continues that request's session, and
   that request is its parent. Among several such earlier requests the one with the longest
   conversation wins; among equals, one whose reply matches the items sent back (same
   tool-call ids, else same text), then the most recent. Branches (two requests extending
   the same request) are siblings with one parent.
2. A request whose conversation begins with an earlier request's whole conversation but
   does not send its reply back (a client that drops a malformed reply and appends a user
   message) is that request's child too, when that request had finished before it arrived
   (the most recent such; a longer match of rule 1 wins).
   b. Failing those, a request whose last reply (the last model-produced items it
   carries) is an earlier request's reply, in a conversation that begins with the same
   item, continues that request's session when that request had finished before it
   arrived (the most recent such): a client that rewrites its history between turns
   (aider drops the reminder it appended to the user's message, and sends that message
   back bare) still sends the reply back.
3. A request whose conversation equals that of an earlier request that failed (finished
   with no reply) before it arrived is its retry: same session, same parent (a sibling).
   An identical conversation sent while the first is still running, or after it succeeded,
   is not a retry (parallel or repeated runs of one task).
4. A request with an explicit session (header, ``metadata.user_id``, ``user``) belongs to
   it; the parent is found as in 1 within that session, else it is the session's request
   that finished last before this one arrived.
5. A request that would start a session (none of the above), for which the caller's
   ``spawned`` names the session whose request handed it its task (a subagent that names
   no session: ``replay.record.spawns``), belongs to that session; its parent is the
   session's request that finished last before it arrived.
6. Anything else starts a new session.

Rules 1-3 look first at whole conversations, then, when none matches, at conversations
without their leading system messages: a request whose system message was replaced (an
OpenAI Agents SDK handoff on Chat Completions hands the conversation to another agent with
that agent's instructions) continues the request whose reply it carries. (Not for a body
parsed in the big-body helper, which sends only the whole-conversation digests.)

``think_ns`` = arrival - the parent's last byte (clamped at 0), None without a parent.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from agent_replay.replay.record.replies import Reply, is_reply_item, reply_from_items


@dataclass(slots=True, eq=False)
class Turn:
    """One request as the tracker remembers it."""

    session_id: str
    request_index: int
    arrival_ns: int
    key: bytes
    parent: Turn | None = None
    bare_key: bytes | None = None
    """The conversation's digest without its leading system messages (None: it has none)."""
    agent: str | None = None
    """The agent stream that sent it (``replay.record.agents``); None: the main agent."""
    end_ns: int | None = None
    failed: bool = False
    """Finished without a reply (an error)."""
    _reply: Reply | None = None
    reply_fn: Callable[[], Reply | None] | None = None
    """Computes the reply when first needed (parsing a stream costs time; most replies
    are never asked for before the row is written)."""
    head: bytes = b""
    """The digest of the conversation's first item (b"": an empty conversation)."""
    forgotten: bool = False
    """Past the tracker's memory: no longer a possible parent."""

    @property
    def reply(self) -> Reply | None:
        fn = self.reply_fn
        if fn is not None:
            self._reply = fn()
            self.reply_fn = None
        return self._reply

    def resolve_reply(self) -> None:
        _ = self.reply


@dataclass(frozen=True, slots=True)
class Assignment:
    session_id: str
    request_index: int
    parent_index: int
    think_ns: int | None
    how: str
    """"prefix", "reply" (rule 2b), "retry", "explicit", "explicit+prefix",
    "explicit+reply", "explicit+retry", "spawn" (rule 5) or "new"."""


@dataclass(slots=True)
class _Session:
    next_index: int = 0
    turns: list[Turn] = field(default_factory=list)


def item_digest(item: Any) -> bytes:
    return hashlib.blake2b(orjson.dumps(item, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()


def chain_digests(items: Sequence[Any]) -> list[bytes]:
    """c[k] identifies items[:k]; c[0] is the empty conversation."""
    return _chain([item_digest(it) for it in items])


def _chain(digests: Sequence[bytes]) -> list[bytes]:
    out = [b""]
    for d in digests:
        out.append(hashlib.blake2b(out[-1] + d, digest_size=16).digest())
    return out


def _leading_system(items: Sequence[Any]) -> int:
    n = 0
    for it in items:
        if not (isinstance(it, dict) and it.get("role") in ("system", "developer")):
            break
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class _Query:
    """Which earlier requests may match a request: those of its agent stream (and of its
    explicit session, when it names one)."""

    arrival_ns: int
    explicit: str | None
    agent: str | None

    def admits(self, t: Turn) -> bool:
        return t.agent == self.agent and (self.explicit is None or t.session_id == self.explicit)

    def candidates(self, turns: Sequence[Turn]) -> list[Turn]:
        """Those of ``turns`` that arrived before this request and that it may match."""
        return [t for t in turns if t.arrival_ns <= self.arrival_ns and self.admits(t)]

    def after(self, t: Turn) -> bool:
        """``t`` finished before the arrival."""
        return t.end_ns is not None and t.end_ns <= self.arrival_ns


def _chains_of(
    items: Sequence[Any], chains: list[bytes] | None, system: int
) -> tuple[list[bytes], list[bytes] | None]:
    """The chain digests of the conversation (``chains`` when given) and of the
    conversation without its ``system`` leading system messages (None when it has none, or
    nothing else, or ``chains`` was given)."""
    if chains is not None:
        return chains, None
    digests = [item_digest(it) for it in items]
    bare = _chain(digests[system:]) if system and system < len(items) else None
    return _chain(digests), bare


def _last_reply(items: Sequence[Any]) -> Reply | None:
    """The last reply the conversation carries (None: none with text or tool calls, or
    nothing before it)."""
    end = len(items)
    while end > 0 and not is_reply_item(items[end - 1]):
        end -= 1
    start = end
    while start > 0 and is_reply_item(items[start - 1]):
        start -= 1
    if start == 0:
        return None
    sent = reply_from_items(items[start:end])
    return sent if sent.text or sent.tool_ids else None


def _last_done(cands: Sequence[Turn], arrival_ns: int) -> Turn | None:
    done = [t for t in cands if t.end_ns is not None and t.end_ns <= arrival_ns]
    return done[-1] if done else None


def _reply_end(items: Sequence[Any], k: int) -> int:
    j = k
    while j < len(items) and is_reply_item(items[j]):
        j += 1
    return j


def _by_reply(cands: Sequence[Turn], sent: Reply) -> tuple[Turn | None, Turn]:
    """The most recent candidate whose reply matches ``sent`` (None: none), and the one
    to fall back on (the most recent whose reply is unknown, else the most recent)."""
    matched = [t for t in cands if t.reply is not None and t.reply.matches(sent)]
    unknown = [t for t in cands if t.reply is None]
    return (matched[-1] if matched else None), (unknown or cands)[-1]


CARRIED_LOOKBACK = 256
"""How many of the last requests to finish rule 1b looks at."""


class SessionTracker:
    """Assigns sessions and parents. ``memory`` bounds how many past requests are kept as
    possible parents (the oldest are forgotten first)."""

    def __init__(self, *, memory: int = 100_000, new_prefix: str = "auto-") -> None:
        self._by_key: dict[bytes, list[Turn]] = {}
        self._by_bare: dict[bytes, list[Turn]] = {}
        """Turns by ``Turn.bare_key``."""
        self._sessions: dict[str, _Session] = {}
        self._order: deque[Turn] = deque()
        self._finished: deque[Turn] = deque(maxlen=CARRIED_LOOKBACK)
        """The last requests to finish, oldest first (rule 1b)."""
        self._memory = memory
        self._new_prefix = new_prefix
        self._new_count = 0

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    def assign(
        self,
        arrival_ns: int,
        items: Sequence[Any],
        explicit: str | None = None,
        agent: str | None = None,
        chains: list[bytes] | None = None,
        spawned: Callable[[], str | None] | None = None,
    ) -> tuple[Assignment, Turn]:
        """``agent``: the agent stream named by the request (Claude Code subagents); parents
        by conversation are looked for among that stream's requests only (subagents often
        open with identical conversations). ``chains``: ``chain_digests(items)`` when the
        caller computed it already (off the event loop, for a big request). ``spawned``:
        asked for a request that would start a session (no parent, no explicit session),
        the session whose request spawned it, if any (rule 5)."""
        system = _leading_system(items)
        chains, bare_chains = _chains_of(items, chains, system)
        query = _Query(arrival_ns, explicit, agent)
        retried, parent, how = self._match(items, chains, bare_chains, system, query)
        sid, parent, how = self._session_of(retried or parent, parent, how, query, spawned)
        sess = self._sessions.setdefault(sid, _Session())
        turn = Turn(
            sid,
            sess.next_index,
            arrival_ns,
            chains[-1],
            parent,
            bare_chains[-1] if bare_chains is not None else None,
            agent,
            head=chains[1] if len(chains) > 1 else b"",
        )
        sess.next_index += 1
        sess.turns.append(turn)
        self._remember(turn)
        think = None
        if parent is not None and parent.end_ns is not None:
            think = max(0, arrival_ns - parent.end_ns)
        pidx = parent.request_index if parent is not None else -1
        return Assignment(sid, turn.request_index, pidx, think, how), turn

    def _match(
        self,
        items: Sequence[Any],
        chains: list[bytes],
        bare_chains: list[bytes] | None,
        system: int,
        query: _Query,
    ) -> tuple[Turn | None, Turn | None, str]:
        """Rules 1-3 on whole conversations, then without their leading system messages,
        then the carried reply: (the request retried, the parent, how)."""
        retried = self._find_retry(chains[-1], query) if items else None
        if retried is None and bare_chains is not None:
            retried = self._find_retry(bare_chains[-1], query, bare=True)
        if retried is not None:
            return retried, retried.parent, "retry"
        parent = self._find_parent(items, chains, query)
        if parent is None and bare_chains is not None:
            parent = self._find_parent(items[system:], bare_chains, query, bare=True)
        if parent is not None:
            return None, parent, "prefix"
        parent = self._find_carrier(items, chains, query)
        return None, parent, "reply" if parent is not None else "new"

    def _session_of(
        self,
        owner: Turn | None,
        parent: Turn | None,
        how: str,
        query: _Query,
        spawned: Callable[[], str | None] | None = None,
    ) -> tuple[str, Turn | None, str]:
        """The session (rules 4-6 where no earlier request was matched), the parent and
        how."""
        if owner is not None:
            return (
                owner.session_id,
                parent,
                ("explicit+" + how if query.explicit is not None else how),
            )
        if query.explicit is not None:
            return query.explicit, self._last_finished(query.explicit, query.arrival_ns), "explicit"
        sid = spawned() if spawned is not None else None
        if sid is not None and sid in self._sessions:
            return sid, self._last_finished(sid, query.arrival_ns), "spawn"
        return self._new_session_id(), parent, how

    def _last_finished(self, sid: str, arrival_ns: int) -> Turn | None:
        """The session's request that finished last before ``arrival_ns`` (rule 4)."""
        sess = self._sessions.get(sid)
        done = (
            [t for t in sess.turns if t.end_ns is not None and t.end_ns <= arrival_ns]
            if sess is not None
            else []
        )
        return max(done, key=lambda t: (t.end_ns, t.request_index)) if done else None

    def _new_session_id(self) -> str:
        self._new_count += 1
        sid = f"{self._new_prefix}{self._new_count:05d}"
        while sid in self._sessions:
            self._new_count += 1
            sid = f"{self._new_prefix}{self._new_count:05d}"
        return sid

    def complete(
        self,
        turn: Turn,
        end_ns: int,
        reply: Reply | Callable[[], Reply | None] | None,
        failed: bool | None = None,
    ) -> None:
        """The request's last byte arrived; ``reply`` is what the model said (None when
        unknown), or a function that tells it when asked. ``failed`` (default: no reply)
        marks a request whose identical successor is its retry."""
        turn.end_ns = end_ns
        turn.failed = reply is None if failed is None else failed
        self._finished.append(turn)
        if callable(reply) and not isinstance(reply, tuple):
            turn.reply_fn = reply
        else:
            turn._reply = reply
            turn.reply_fn = None

    def _find_retry(self, key: bytes, query: _Query, bare: bool = False) -> Turn | None:
        """The most recent earlier request with this very conversation that failed before
        the arrival (rule 3)."""
        for t in reversed((self._by_bare if bare else self._by_key).get(key, ())):
            if query.admits(t) and t.failed and query.after(t):
                return t
        return None

    def _find_parent(
        self, items: Sequence[Any], chains: list[bytes], query: _Query, bare: bool = False
    ) -> Turn | None:
        fallback: Turn | None = None
        index = self._by_bare if bare else self._by_key
        for k in range(len(items) - 1, 0, -1):
            cands = query.candidates(index.get(chains[k], ()))
            if not cands:
                continue
            if not is_reply_item(items[k]):
                # Rule 2: the reply was not sent back; a parent must have finished.
                fallback = fallback or _last_done(cands, query.arrival_ns)
                if fallback is not None:
                    return fallback
                continue
            matched, unknown = _by_reply(cands, reply_from_items(items[k : _reply_end(items, k)]))
            if matched is not None:
                return matched
            fallback = fallback or unknown
        return fallback

    def _find_carrier(
        self, items: Sequence[Any], chains: list[bytes], query: _Query
    ) -> Turn | None:
        """Rule 2b: the request whose reply is the last one the conversation carries,
        among the last ``CARRIED_LOOKBACK`` requests to finish, when it finished before the
        arrival and its conversation began with the same item (the most recent such)."""
        sent = _last_reply(items)
        if sent is None:
            return None
        for t in reversed(self._finished):
            if (
                t.head == chains[1]
                and not (t.failed or t.forgotten)
                and query.admits(t)
                and query.after(t)
            ):
                reply = t.reply
                if reply is not None and reply.matches(sent):
                    return t
        return None

    def _remember(self, turn: Turn) -> None:
        self._by_key.setdefault(turn.key, []).append(turn)
        if turn.bare_key is not None:
            self._by_bare.setdefault(turn.bare_key, []).append(turn)
        self._order.append(turn)
        while len(self._order) > self._memory:
            old = self._order.popleft()
            old.forgotten = True
            for index, key in ((self._by_key, old.key), (self._by_bare, old.bare_key)):
                if key is None:
                    continue
                lst = index.get(key)
                if lst is not None:
                    try:
                        lst.remove(old)
                    except ValueError:
                        pass
                    if not lst:
                        del index[key]
            sess = self._sessions.get(old.session_id)
            if sess is not None and old in sess.turns:
                sess.turns.remove(old)
