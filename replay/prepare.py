"""Turning a planned request into bytes on the wire: prompt materialization + dialect.

Completions get token-id prompts (``engines.prompts.TokenPrompts``). Chat, messages and
responses get block-aligned text (``engines.prompts.AlignedText``, calibrated once per run
against the target's ``POST /tokenize`` by ``calibrate_text``): built from the hash ids
with no request-time call, exactly ``input_tokens`` through the chat template. When the
tokenizer does not allow that, text is fitted per request with ``/tokenize`` (slower: it
costs round trips on the way to the send). A row with ``content`` replays its recorded body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import orjson

from agent_replay.engines.dialects import DIALECTS, encode_body
from agent_replay.engines.prompts import (
    DEFAULT_LOW_ID,
    DEFAULT_VOCAB_SIZE,
    AlignedText,
    TextPrompts,
    TokenPrompts,
    fit_text,
)
from agent_replay.errors import InputError, TargetError
from agent_replay.replay.client import Prepared
from agent_replay.replay.plan import Plan, PlannedRequest, stable_hash
from agent_replay.replay.textcal import (
    CalibrationError,
    ProbeFn,
    TokenizeFn,
    calibrate,
    calibrate_offline,
    load_tokenizer,
)

NO_TOKENIZE_HINT = (
    "chat/messages/responses replay sizes its text prompts with the target's "
    "POST /tokenize; without it, pass --tokenizer NAME_OR_PATH (the target's "
    "tokenizer; pip install 'agent-replay[tokenizer]') or replay with "
    "--api completions (token-id prompts)"
)


class Preparer:
    def __init__(
        self,
        *,
        model: str,
        block_size: int,
        salt: int,
        vocab_size: int = DEFAULT_VOCAB_SIZE,
        low_token_id: int = DEFAULT_LOW_ID,
        vllm_extras: bool = True,
        tokenize: TokenizeFn | None = None,
        headers: Mapping[str, str] | None = None,
        tokenizer: str | None = None,
        probe: ProbeFn | None = None,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.vllm_extras = vllm_extras
        self.tokens = TokenPrompts(block_size, salt=salt, vocab_size=vocab_size, low=low_token_id)
        self.text = TextPrompts(salt=salt)
        self.tokenize = tokenize
        self.headers = dict(headers or {})
        self.headers.setdefault("Content-Type", "application/json")
        self._calibrated = False
        self.text_misses = 0
        self.aligned: AlignedText | None = None
        """Set by ``calibrate_text``; None: text is fitted per request."""
        self.salt = salt
        self.tokenizer = tokenizer
        """``--tokenizer``: calibrate offline when the target has no /tokenize."""
        self.probe = probe

    async def prepare(self, q: PlannedRequest, request_id: str, session_key: str) -> Prepared:
        api = q.api
        d = DIALECTS.get(api)
        if d is None:
            raise InputError(
                f"api {api!r} cannot be replayed (known: {', '.join(DIALECTS)}); "
                "use --api to override"
            )
        base: dict[str, Any] | None = None
        if q.content:
            try:
                loaded = orjson.loads(q.content)
            except orjson.JSONDecodeError as exc:
                raise InputError(
                    f"session {q.session_id!r} request {q.request_index}: "
                    f"content is not JSON ({exc})"
                ) from exc
            base = loaded if isinstance(loaded, dict) else None
        model = self.model
        prompt: Any
        if base is not None and d.carries_prompt(base):
            prompt = d.recorded_prompt(base)
        elif d.token_ids:
            await self._make_blocks(q)
            prompt = self.tokens.prompt(q.hash_ids, q.input_tokens, q.blocks_clone)
        else:
            prompt = None
            if self.aligned is not None:
                key = stable_hash("tail", q.session_id, q.clone, q.request_index) >> 2
                prompt = self.aligned.prompt(q.hash_ids, q.input_tokens, q.blocks_clone, key)
            if prompt is None:
                prompt = await self._fit_text(q)
        body = d.build(
            model=model,
            prompt=prompt,
            max_tokens=max(q.output_tokens, 1),
            vllm_extras=self.vllm_extras,
            base=base,
        )
        headers = dict(self.headers)
        headers["X-Session-ID"] = session_key
        headers["X-Request-Id"] = request_id
        return Prepared(d.url_path(model), encode_body(body), headers, api)

    BLOCKS_PER_SLICE = 128
    """Prompt blocks made (and joined) per event-loop iteration while a prompt is prepared:
    thousands of new blocks made and joined at once held the loop for several
    milliseconds, and a request due then left late."""

    async def _make_blocks(self, q: PlannedRequest) -> None:
        """Grow the prompt's uncached part as cached prefixes, one slice per loop
        iteration, so that ``prompt`` then only adds the last slice."""
        tokens, step = self.tokens, self.BLOCKS_PER_SLICE
        todo = tokens.uncached(q.hash_ids, q.input_tokens, q.blocks_clone)
        if len(todo) <= step:
            return
        need = -(-q.input_tokens // tokens.block_size)
        for end in range(need - len(todo) + step, need, step):
            tokens.prompt(q.hash_ids, end * tokens.block_size, q.blocks_clone)
            await asyncio.sleep(0)

    async def calibrate_text(self, plan: Plan) -> None:
        """Calibrate block-aligned text before the run when the plan has text prompts to
        build (see the module text). A target without /tokenize is an error with a hint."""
        if not _builds_text(plan):
            return
        if self.tokenize is not None and await self._calibrate_online():
            return
        if self.tokenizer is None or self.probe is None:
            raise InputError(NO_TOKENIZE_HINT)
        try:
            self.aligned = await calibrate_offline(
                load_tokenizer(self.tokenizer), self.probe, self.block_size, self.salt
            )
        except CalibrationError as exc:
            raise InputError(f"--tokenizer {self.tokenizer}: {exc}") from None
        self.tokenize = None  # no per-request fitting against a target without /tokenize

    async def _calibrate_online(self) -> bool:
        """Calibrate against the target's /tokenize; False when it has none and a local
        tokenizer can stand in (without one, the error says how to give it)."""
        assert self.tokenize is not None
        try:
            self.aligned = await calibrate(self.tokenize, self.model, self.block_size, self.salt)
        except CalibrationError:
            self.aligned = None  # per-request fitting
        except TargetError as exc:
            if self.tokenizer is None or self.probe is None:
                raise TargetError(f"{exc}; {NO_TOKENIZE_HINT}") from None
            return False
        return True

    async def _count(self, text: str) -> int:
        assert self.tokenize is not None
        data = await self.tokenize(
            {"model": self.model, "messages": [{"role": "user", "content": text}]}
        )
        return int(data["count"])

    async def _fit_text(self, q: PlannedRequest) -> str:
        if self.tokenize is None:
            raise InputError(
                "chat/messages replay without recorded content needs the target's "
                "POST /tokenize (not available) to size prompts"
            )
        if not self._calibrated:
            sample = self.text.tail(0, 512)
            n = await self._count(sample) - await self._count("")
            self.text.words_per_block = max(1, int(0.97 * self.block_size * 512 / max(n, 1)))
            self._calibrated = True
        full = q.input_tokens // self.block_size
        prefix = self.text.prefix(q.hash_ids[:full], q.blocks_clone)
        key = stable_hash("tail", q.session_id, q.clone, q.request_index) >> 2
        text, got = await fit_text(
            prefix, lambda n: self.text.tail(key, n), q.input_tokens, self._count
        )
        if got != q.input_tokens:
            self.text_misses += 1
        return text


def _builds_text(plan: Plan) -> bool:
    """Whether the plan has a text prompt to build (no recorded content to send)."""
    return any(text_prompt(q.api) and not q.content for s in plan.sessions for q in s.requests)


def text_prompt(api: str) -> bool:
    """Requests of ``api`` are sent with text prompts (not token ids)."""
    d = DIALECTS.get(api)
    return d is None or not d.token_ids
