"""What one OTLP span or attribute set says, per convention: the GenAI semantic
conventions, OpenInference, Claude Code's own spans (``claude_code.llm_request`` of its
enhanced telemetry) and HTTP client spans (the moment a request left the client). A
``Convention`` names the spans it reads and reads a request span's counts; ``classify``
picks the first that claims a span."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from agent_replay.errors import TraceError
from agent_replay.traces.importers._common import parse_iso_ns
from agent_replay.traces.otlp import nanos

LLM_OPERATIONS = ("chat", "text_completion", "generate_content")
FIRST_TOKEN_EVENT = "First Token Stream Event"
ATTEMPT_EVENT = "gen_ai.request.attempt"
"""Claude Code's span event at each attempt of a request, just before it is sent."""
CLIENT_KINDS = (3, "SPAN_KIND_CLIENT")
SIDE_SOURCES = {"generate_session_title"}
"""Claude Code's ``query_source`` of side requests (its session title): they run beside the
conversation, as the recorder's side requests do."""


@dataclass(slots=True)
class Span:
    """What a request, agent or tool span contributes (the rest of it is dropped on read)."""

    sid: str
    trace: str
    kind: str  # "llm", "agent", "tool", "http"
    name: str
    start: int
    end: int
    session: str | None = None
    model: str | None = None
    n_in: int | None = None
    n_out: int | None = None
    cached: int | None = None
    ttft_ns: int | None = None
    """From ``start``."""
    prompt: list[Any] | None = None
    agent: str | None = None  # the agent's name (agent spans)
    sent: int | None = None
    """When the request left the client, where the span says (Claude Code's attempt)."""
    stream: tuple[str, str | None] | None = None
    """Claude Code's ``agent_id`` and ``parent_agent_id`` (None: not said)."""
    cache_parts: tuple[int, int] | None = None
    """Claude Code's cache read and write counts, its input count taken as read."""
    side: bool = False
    """A side request: no turn of the agent's conversation waits for it."""


Counts = tuple[int | None, int | None, int | None, int | None]
"""Input, output, cache read, cache write tokens."""


class Convention(Protocol):
    source: str

    def read(self, s: Span, a: dict[str, Any], sp: dict[str, Any]) -> Counts:
        """Fill ``s`` (model, prompt, first token) and return its counts."""
        ...


class GenAI:
    source = "gen_ai"

    def read(self, s: Span, a: dict[str, Any], sp: dict[str, Any]) -> Counts:
        s.model = str_attr(a, "gen_ai.response.model") or str_attr(a, "gen_ai.request.model")
        s.prompt = gen_ai_messages(a)
        ttfc = a.get("gen_ai.response.time_to_first_chunk")
        if isinstance(ttfc, (int, float)) and not isinstance(ttfc, bool) and ttfc >= 0:
            s.ttft_ns = round(ttfc * 1e9)
        return (
            int_attr(a, "gen_ai.usage.input_tokens"),
            int_attr(a, "gen_ai.usage.output_tokens"),
            int_attr(a, "gen_ai.usage.cache_read.input_tokens"),
            int_attr(a, "gen_ai.usage.cache_creation.input_tokens"),
        )


class OpenInference:
    source = "openinference"

    def read(self, s: Span, a: dict[str, Any], sp: dict[str, Any]) -> Counts:
        s.model = str_attr(a, "llm.model_name")
        s.prompt = openinference_messages(a)
        t = event_time(sp, FIRST_TOKEN_EVENT, first=True)
        if t is not None and t >= s.start:
            s.ttft_ns = t - s.start
        return (
            int_attr(a, "llm.token_count.prompt"),
            int_attr(a, "llm.token_count.completion"),
            int_attr(a, "llm.token_count.prompt_details.cache_read"),
            int_attr(a, "llm.token_count.prompt_details.cache_write"),
        )


class ClaudeCodeSpans:
    """``claude_code.llm_request`` (``CLAUDE_CODE_ENHANCED_TELEMETRY_BETA=1``): Anthropic's
    counts as its ``api_request`` event gives them, the last attempt's event as the send
    time, ``ttft_ms`` from the span's start, and the agent that sent it (``agent_id``,
    ``parent_agent_id``; none: the main agent)."""

    source = "claude-code spans"

    def read(self, s: Span, a: dict[str, Any], sp: dict[str, Any]) -> Counts:
        s.model = str_attr(a, "model") or str_attr(a, "gen_ai.request.model")
        s.session = str_attr(a, "session.id") or s.session
        t = event_time(sp, ATTEMPT_EVENT, first=False)
        s.sent = t if t is not None and s.start <= t <= s.end else None
        s.ttft_ns = _ms_ns(num_attr(a, "ttft_ms"))
        agent = str_attr(a, "agent_id")
        s.stream = (agent, str_attr(a, "parent_agent_id")) if agent else None
        s.side = (str_attr(a, "query_source") or str_attr(a, "query_source_safe")) in SIDE_SOURCES
        read, write = (
            int_attr(a, "cache_read_tokens") or 0,
            int_attr(a, "cache_creation_tokens") or 0,
        )
        s.cache_parts = (read, write)
        return int_attr(a, "input_tokens"), int_attr(a, "output_tokens"), read, None


def _ms_ns(ms: float | None) -> int | None:
    return round(ms * 1e6) if ms is not None and ms >= 0 else None


GEN_AI, OPENINFERENCE, CLAUDE_CODE = GenAI(), OpenInference(), ClaudeCodeSpans()


def classify(a: dict[str, Any], sp: dict[str, Any]) -> tuple[str | None, Convention | None]:
    """The span's kind ("llm", "agent", "tool", "http", "endpoint" or None: none of
    ours) and, for a
    request, the convention that reads it. Claude Code's own spans first: from 2.1.3xx
    they carry GenAI attributes too, but its ``gen_ai.usage.input_tokens`` adds the cache
    reads to a count that may already hold them (a vLLM-like server's)."""
    if str(sp.get("name", "")).startswith("claude_code."):
        return _claude_kind(a)
    op = a.get("gen_ai.operation.name")
    oi = a.get("openinference.span.kind")
    oi = oi.upper() if isinstance(oi, str) else None
    if op in LLM_OPERATIONS:
        return "llm", GEN_AI
    if oi == "LLM":
        return "llm", OPENINFERENCE
    if op == "invoke_agent" or oi == "AGENT":
        return "agent", None
    if op == "execute_tool" or oi == "TOOL":
        return "tool", None
    return _other_kind(a, sp)


def _claude_kind(a: dict[str, Any]) -> tuple[str | None, Convention | None]:
    """Claude Code's spans: requests and tool calls; its interactions (a user's turn) and
    the rest are none of ours."""
    claude = a.get("span.type")
    if claude == "llm_request":
        return "llm", CLAUDE_CODE
    return ("tool", None) if claude == "tool" else (None, None)


def _other_kind(a: dict[str, Any], sp: dict[str, Any]) -> tuple[str | None, Convention | None]:
    if "api.path" in a and "http.method" in a:
        return "endpoint", None  # Codex's request to its model endpoint
    if sp.get("kind") in CLIENT_KINDS and ("http.request.method" in a or "http.method" in a):
        return "http", None
    return None, None


def agent_name(a: dict[str, Any]) -> str | None:
    agent = a.get("gen_ai.agent.name") or a.get("gen_ai.agent.id") or a.get("agent.name")
    return str(agent) if agent else None


def event_time(sp: dict[str, Any], name: str, *, first: bool) -> int | None:
    """The time of the span's first (or last) event called ``name``."""
    found = None
    for ev in sp.get("events") or ():
        if isinstance(ev, dict) and ev.get("name") == name:
            found = nanos(ev.get("timeUnixNano"))
            if first:
                break
    return found


def int_attr(a: dict[str, Any], key: str) -> int | None:
    v = a.get(key)
    if isinstance(v, bool) or v is None:
        return None
    try:
        n = int(v) if not isinstance(v, float) else (int(v) if v == int(v) else None)
    except (TypeError, ValueError):
        return None
    return n if n is not None and n >= 0 else None


def num_attr(a: dict[str, Any], key: str) -> float | None:
    v = a.get(key)
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def str_attr(a: dict[str, Any], key: str) -> str | None:
    v = a.get(key)
    return v if isinstance(v, str) and v else None


def record_time(rec: dict[str, Any], a: dict[str, Any], where: str) -> int | None:
    """A log record's time: its ``event.timestamp`` attribute, else its own stamps."""
    ts = a.get("event.timestamp")
    if isinstance(ts, str):
        try:
            return parse_iso_ns(ts, where, None, "event.timestamp")
        except TraceError:
            pass  # an unreadable stamp: the record's own time
    return nanos(rec.get("timeUnixNano")) or nanos(rec.get("observedTimeUnixNano"))


def _loads(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return orjson.loads(v)
        except orjson.JSONDecodeError:
            return v
    return v


def gen_ai_messages(a: dict[str, Any]) -> list[Any] | None:
    """Chat messages from ``gen_ai.system_instructions`` and ``gen_ai.input.messages``
    (each a JSON string or a structured value), or None when not captured."""
    msgs = _loads(a.get("gen_ai.input.messages"))
    if not isinstance(msgs, list) or not msgs:
        return None
    out: list[Any] = []
    system = _loads(a.get("gen_ai.system_instructions"))
    if system:
        out.append({"role": "system", "content": _parts_text(system)})
    for m in msgs:
        if isinstance(m, dict):
            out.append(
                {"role": m.get("role"), "content": _parts_text(m.get("parts", m.get("content")))}
            )
    return out


def _parts_text(parts: Any) -> Any:
    """Text parts as their text; others as they are (hashed as their JSON)."""
    if isinstance(parts, str):
        return parts
    if isinstance(parts, list):
        return [
            p.get("content")
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("content"), str)
            else p
            for p in parts
        ]
    return parts


def openinference_messages(a: dict[str, Any]) -> list[Any] | None:
    """``llm.input_messages.<i>.message.*`` gathered into messages, or None."""
    prefix = "llm.input_messages."
    by_index: dict[int, dict[str, Any]] = {}
    for k, v in a.items():
        if not k.startswith(prefix):
            continue
        idx, _, rest = k[len(prefix) :].partition(".")
        if idx.isdigit():
            by_index.setdefault(int(idx), {})[rest.removeprefix("message.")] = v
    if not by_index:
        return None
    out: list[Any] = []
    for i in sorted(by_index):
        m = by_index[i]
        msg: dict[str, Any] = {"role": m.pop("role", None), "content": m.pop("content", None)}
        if m:
            msg["more"] = dict(sorted(m.items()))
        out.append(msg)
    return out
