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
3. A request whose conversation equals that of an earlier request that failed (finished
   with no reply) before it arrived is its retry: same session, same parent (a sibling).
   An identical conversation sent while the first is still running, or after it succeeded,
   is not a retry (parallel or repeated runs of one task).
4. A request with an explicit session (header, ``metadata.user_id``, ``user``) belongs to
   it; the parent is found as in 1 within that session, else it is the session's request
   that finished last before this one arrived.
5. Anything else starts a new session.

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
    """"prefix", "retry", "explicit", "explicit+prefix", "explicit+retry" or "new"."""


@dataclass(slots=True)
class _Session:
    next_index: int = 0
    turns: list[Turn] = field(default_factory=list)


def item_digest(item: Any) -> bytes:
    return hashlib.blake2b(orjson.dumps(item, option=orjson.OPT_SORT_KEYS),
                           digest_size=16).digest()


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


class SessionTracker:
    """Assigns sessions and parents. ``memory`` bounds how many past requests are kept as
    possible parents (the oldest are forgotten first)."""

    def __init__(self, *, memory: int = 100_000, new_prefix: str = "auto-") -> None:
        self._by_key: dict[bytes, list[Turn]] = {}
        self._by_bare: dict[bytes, list[Turn]] = {}
        """Turns by ``Turn.bare_key``."""
        self._sessions: dict[str, _Session] = {}
        self._order: deque[Turn] = deque()
        self._memory = memory
        self._new_prefix = new_prefix
        self._new_count = 0

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    def assign(self, arrival_ns: int, items: Sequence[Any], explicit: str | None = None,
               agent: str | None = None, chains: list[bytes] | None = None
               ) -> tuple[Assignment, Turn]:
        """``agent``: the agent stream named by the request (Claude Code subagents); parents
        by conversation are looked for among that stream's requests only (subagents often
        open with identical conversations). ``chains``: ``chain_digests(items)`` when the
        caller computed it already (off the event loop, for a big request)."""
        bare_chains: list[bytes] | None = None
        system = _leading_system(items)
        if chains is None:
            digests = [item_digest(it) for it in items]
            chains = _chain(digests)
            if system and system < len(items):
                bare_chains = _chain(digests[system:])
        retried = self._find_retry(chains[-1], arrival_ns, explicit, agent) if items else None
        if retried is None and bare_chains is not None:
            retried = self._find_retry(bare_chains[-1], arrival_ns, explicit, agent, bare=True)
        if retried is not None:
            parent = retried.parent
            how = "retry"
        else:
            parent = self._find_parent(items, chains, arrival_ns, explicit, agent)
            if parent is None and bare_chains is not None:
                parent = self._find_parent(items[system:], bare_chains, arrival_ns, explicit,
                                           agent, bare=True)
            how = "prefix" if parent is not None else "new"
        owner = retried or parent
        if owner is not None:
            sid = owner.session_id
            if explicit is not None:
                how = "explicit+" + how
        elif explicit is not None:
            sid = explicit
            how = "explicit"
            sess = self._sessions.get(sid)
            if sess is not None:
                done = [t for t in sess.turns if t.end_ns is not None and t.end_ns <= arrival_ns]
                if done:
                    parent = max(done, key=lambda t: (t.end_ns, t.request_index))
        else:
            self._new_count += 1
            sid = f"{self._new_prefix}{self._new_count:05d}"
            while sid in self._sessions:
                self._new_count += 1
                sid = f"{self._new_prefix}{self._new_count:05d}"
        sess = self._sessions.setdefault(sid, _Session())
        turn = Turn(sid, sess.next_index, arrival_ns, chains[-1], parent,
                    bare_chains[-1] if bare_chains is not None else None, agent)
        sess.next_index += 1
        sess.turns.append(turn)
        self._remember(turn)
        think = None
        if parent is not None and parent.end_ns is not None:
            think = max(0, arrival_ns - parent.end_ns)
        pidx = parent.request_index if parent is not None else -1
        return Assignment(sid, turn.request_index, pidx, think, how), turn

    def complete(self, turn: Turn, end_ns: int,
                 reply: Reply | Callable[[], Reply | None] | None,
                 failed: bool | None = None) -> None:
        """The request's last byte arrived; ``reply`` is what the model said (None when
        unknown), or a function that tells it when asked. ``failed`` (default: no reply)
        marks a request whose identical successor is its retry."""
        turn.end_ns = end_ns
        turn.failed = reply is None if failed is None else failed
        if callable(reply) and not isinstance(reply, tuple):
            turn.reply_fn = reply
        else:
            turn._reply = reply
            turn.reply_fn = None

    def _find_retry(self, key: bytes, arrival_ns: int, explicit: str | None,
                    agent: str | None, bare: bool = False) -> Turn | None:
        """The most recent earlier request with this very conversation that failed before
        ``arrival_ns`` (rule 3)."""
        for t in reversed((self._by_bare if bare else self._by_key).get(key, ())):
            if (explicit is not None and t.session_id != explicit) or t.agent != agent:
                continue
            if t.failed and t.end_ns is not None and t.end_ns <= arrival_ns:
                return t
        return None

    def _find_parent(self, items: Sequence[Any], chains: list[bytes], arrival_ns: int,
                     explicit: str | None, agent: str | None, bare: bool = False
                     ) -> Turn | None:
        fallback: Turn | None = None
        n = len(items)
        index = self._by_bare if bare else self._by_key
        for k in range(n - 1, 0, -1):
            cands = [t for t in index.get(chains[k], ())
                     if t.arrival_ns <= arrival_ns and t.agent == agent
                     and (explicit is None or t.session_id == explicit)]
            if not cands:
                continue
            if not is_reply_item(items[k]):
                # Rule 2: the reply was not sent back; a parent must have finished.
                done = [t for t in cands if t.end_ns is not None and t.end_ns <= arrival_ns]
                if fallback is None and done:
                    fallback = done[-1]
                if fallback is not None:
                    return fallback
                continue
            j = k
            while j < n and is_reply_item(items[j]):
                j += 1
            sent = reply_from_items(items[k:j])
            matched = [t for t in cands if t.reply is not None and t.reply.matches(sent)]
            if matched:
                return matched[-1]
            if fallback is None:
                unknown = [t for t in cands if t.reply is None]
                fallback = (unknown or cands)[-1]
        return fallback

    def _remember(self, turn: Turn) -> None:
        self._by_key.setdefault(turn.key, []).append(turn)
        if turn.bare_key is not None:
            self._by_bare.setdefault(turn.bare_key, []).append(turn)
        self._order.append(turn)
        while len(self._order) > self._memory:
            old = self._order.popleft()
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
