"""Writes a Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) that counts
tokens exactly as the simulated engine does, for clients that build prompts with a HF
tokenizer (AIPerf): no hub access needed.

The sim's rule (engines/sim/tokenizer.py): a token is 1-4 non-whitespace characters,
optionally preceded by one whitespace character; any other whitespace character is a
token by itself. Here: a ``Split`` pre-tokenizer on that same regex, a ``WordLevel`` model
``WordPiece`` model (no continuation prefix) whose vocabulary holds every piece of the
given corpus files, of AIPerf's coding-content templates when ``aiperf`` is importable, and
every single character with and without a leading space, and a ``Fuse`` decoder (pieces
concatenate back to the text). A token sequence cut from the corpus decodes to text the sim
counts as the same number of tokens; a seam between two sampled spans can merge pieces, and
a piece outside the vocabulary counts as several tokens here (it still decodes exactly).

    python scripts/make_sim_tokenizer.py OUT_DIR CORPUS.txt [CORPUS.txt ...]

Runs with any Python that has ``tokenizers`` (the AIPerf venv has it).
"""

from __future__ import annotations

import json
import re
import string
import sys
from pathlib import Path

PIECE = r"\s?\S{1,4}|\s"
SPECIAL = ["<s>", "</s>", "<u>", "<pad>"]


def pieces(paths: list[Path]) -> list[str]:
    seen: dict[str, None] = {}
    for c in string.printable:
        seen[c] = None
        seen[" " + c] = None
    for a in string.ascii_lowercase:
        for b in string.ascii_lowercase:
            seen[a + b] = None
            seen[" " + a + b] = None
    for ws in (" ", "\n", "\t", "\r"):
        seen[ws] = None
    rx = re.compile(PIECE)
    texts = [aiperf_coding_text()]
    for p in paths:
        lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
        texts.append(" ".join(ln for ln in lines if ln))
    for text in texts:
        for m in rx.finditer(text):
            seen[m.group()] = None
    return list(seen)


def aiperf_coding_text(scale: int = 20, seed: int = 0) -> str:
    """Text from AIPerf's coding-content templates (the pools its weka loader samples
    prompts from), or "" when aiperf is not importable."""
    try:
        from aiperf.common import random_generator as rng
        from aiperf.dataset.generator import coding_content as cc
    except ImportError:
        return ""
    rng.init(seed)
    g = object.__new__(cc.CodingContentGenerator)
    for name in ("template", "corpus", "length", "prefix"):
        setattr(g, f"_{name}_rng", rng.derive(f"make_sim_tokenizer.{name}"))
    texts = [
        getattr(g, name)()
        for name, count in cc._TOOL_POOL_BLOCK_COUNTS.items()
        for _ in range(count * scale)
    ]
    texts += [g._gen_user_prompt() for _ in range(200 * scale)]
    return "\n\n".join(texts)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    vocab = {t: i for i, t in enumerate(SPECIAL)}
    for piece in pieces([Path(a) for a in argv[1:]]):
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(
        models.WordPiece(
            vocab=vocab, unk_token="<u>", continuing_subword_prefix="", max_input_chars_per_word=16
        )
    )
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<u>",
        "pad_token": "<pad>",
        "model_max_length": 1_048_576,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<u>", "pad_token": "<pad>"},
            indent=2,
        )
        + "\n"
    )
    print(f"make_sim_tokenizer: {len(vocab):,} pieces -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
