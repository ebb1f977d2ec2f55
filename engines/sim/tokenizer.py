"""The simulated engine's tokenizer: simple, deterministic and documented.

Rule: a token is one run of 1 to 4 non-whitespace characters, optionally preceded by one
whitespace character; any other whitespace character is a token by itself. So
``" abcd" * n`` is exactly ``n`` tokens, and so is the text the engine generates.

Ids: 0-15 are special (2 = end of sequence, 3 = ``<|im_start|>``, 4 = ``<|im_end|>``,
5 = newline in a chat template, 6-10 = roles). A piece of 1-4 lowercase ASCII letters
(with or without its leading space) has the id 16 + its rank among such strings (a..z,
aa..zz, ...) when that fits in the vocabulary; any other piece maps to
16 + crc32(piece) mod (vocab_size - 16). Generated token ``i`` is written as " " + the
letters of rank ``i - 16``, so the engine's own output tokenizes back to the same ids.

Chat template (ChatML-shaped, deterministic overhead): each message becomes
``<|im_start|> ROLE \\n CONTENT <|im_end|> \\n`` (5 tokens + its content) and the
generation prompt ``<|im_start|> assistant \\n`` adds 3 tokens. So a chat prompt of one
user message with content of n tokens is n + 8 prompt tokens. A request's ``tools`` come
first, as one system message whose content is ``render_tools(tools)`` (``# Tools`` and one
line of canonical JSON per tool, as Jinja's ``tojson`` writes it), then the system prompt,
then the conversation: the order in which the recorder hashes a request.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

FIRST_WORD_ID = 16
EOS_ID = 2
IM_START = 3
IM_END = 4
NEWLINE = 5
ROLE_IDS = {"system": 6, "user": 7, "assistant": 8, "tool": 9, "developer": 10}
OTHER_ROLE = 11
MESSAGE_OVERHEAD = 5
GENERATION_PROMPT = (IM_START, ROLE_IDS["assistant"], NEWLINE)

_TOKEN_RE = re.compile(r"\s?\S{1,4}|\s")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
# number of letter strings shorter than length L: 0, 26, 26+676, ...
_OFFSETS = (0, 0, 26, 26 + 26**2, 26 + 26**2 + 26**3)


def letters_for_rank(rank: int) -> str:
    """The rank-th string in a..z, aa..zz, aaa..zzz, aaaa..zzzz (rank < 475254)."""
    for length in (1, 2, 3, 4):
        span = 26**length
        if rank < span:
            chars = []
            for _ in range(length):
                rank, r = divmod(rank, 26)
                chars.append(_LETTERS[r])
            return "".join(reversed(chars))
        rank -= span
    raise ValueError("rank out of range")


def _rank_of_letters(s: str) -> int:
    r = 0
    for ch in s:
        r = r * 26 + (ord(ch) - 97)
    return _OFFSETS[len(s)] + r


class SimTokenizer:
    """Text to token ids and back, with a memo of pieces already seen."""

    def __init__(self, vocab_size: int = 32000) -> None:
        if vocab_size <= FIRST_WORD_ID + 26:
            raise ValueError("vocab_size too small")
        self.vocab_size = vocab_size
        self._memo: dict[str, int] = {}
        self._texts: list[str] | None = None

    def piece_id(self, piece: str) -> int:
        tid = self._memo.get(piece)
        if tid is not None:
            return tid
        word = piece[1:] if piece[:1].isspace() and len(piece) > 1 else piece
        if word.isascii() and word.isalpha() and word.islower():
            rank = _rank_of_letters(word)
            if rank < self.vocab_size - FIRST_WORD_ID:
                tid = FIRST_WORD_ID + rank
        if tid is None:
            tid = FIRST_WORD_ID + zlib.crc32(piece.encode()) % (self.vocab_size - FIRST_WORD_ID)
        if len(self._memo) < 1_000_000:
            self._memo[piece] = tid
        return tid

    def encode(self, text: str) -> list[int]:
        pid = self.piece_id
        return [pid(p) for p in _TOKEN_RE.findall(text)]

    def count(self, text: str) -> int:
        return len(_TOKEN_RE.findall(text))

    def pieces(self, text: str) -> list[str]:
        return _TOKEN_RE.findall(text)

    def token_text(self, tid: int) -> str:
        """The text the engine writes for generated token ``tid`` (empty for specials)."""
        if tid < FIRST_WORD_ID:
            return ""
        return " " + letters_for_rank(tid - FIRST_WORD_ID)

    def texts(self) -> list[str]:
        """``token_text`` for every id, computed once."""
        if self._texts is None:
            self._texts = [self.token_text(i) for i in range(self.vocab_size)]
        return self._texts

    def decode(self, ids: Iterable[int]) -> str:
        t = self.texts()
        return "".join(t[i] for i in ids)

    # chat templates -------------------------------------------------------------------

    def chat_ids(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Any] | None = None,
    ) -> list[int]:
        """Prompt ids of OpenAI-style chat messages (and the tools offered) under the
        documented template."""
        ids: list[int] = []
        if tools:
            ids += (IM_START, ROLE_IDS["system"], NEWLINE)
            ids.extend(self.encode(render_tools(tools)))
            ids += (IM_END, NEWLINE)
        for m in messages:
            role = m.get("role")
            ids.append(IM_START)
            ids.append(ROLE_IDS.get(role, OTHER_ROLE) if isinstance(role, str) else OTHER_ROLE)
            ids.append(NEWLINE)
            ids.extend(self.encode(message_text(m)))
            ids.append(IM_END)
            ids.append(NEWLINE)
        if add_generation_prompt:
            ids.extend(GENERATION_PROMPT)
        return ids


def render_tools(tools: Sequence[Any]) -> str:
    """The text of the tools message: ``# Tools`` and each tool as JSON with sorted keys
    and Python's separators (what Jinja's ``tojson`` filter writes), one per line."""
    return "# Tools\n" + "\n".join(json.dumps(t, sort_keys=True, ensure_ascii=False) for t in tools)


def synthesize_text(n_tokens: int) -> str:
    """A text of exactly ``n_tokens`` tokens under this tokenizer."""
    return " abcd" * n_tokens


def message_text(m: dict[str, Any]) -> str:
    """The text of one chat message: its content parts, tool calls and tool results."""
    parts: list[str] = []
    _collect_text(m.get("content"), parts)
    tool_calls = m.get("tool_calls")
    if tool_calls:
        parts.append(str(tool_calls))
    return "".join(parts)


def _collect_text(content: Any, parts: list[str]) -> None:
    if content is None:
        return
    if isinstance(content, str):
        parts.append(content)
        return
    if isinstance(content, list):
        for c in content:
            _collect_text(c, parts)
        return
    if isinstance(content, dict):
        kind = content.get("type")
        if isinstance(content.get("text"), str):
            parts.append(content["text"])
        elif kind == "tool_use":
            parts.append(str(content.get("input")))
        elif kind == "tool_result":
            _collect_text(content.get("content"), parts)
        return
    parts.append(str(content))
