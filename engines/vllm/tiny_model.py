"""Tiny model folders made offline, for tests and smoke runs with ``--load-format dummy``.

A folder holds a byte-level BPE tokenizer trained here, in code, on generated pseudo-words
(exactly ``vocab`` ids, ChatML chat template, ``<|im_end|>`` as end of sequence) and a
model ``config.json``: a small ``LlamaForCausalLM`` (``arch="llama"``), the tiny DeepSeek-V3
shape (MLA + MoE + one MTP layer) whose MLA dimensions the H200 MLA kernels accept
(``arch="deepseek"``), or a model of realistic size (``arch="moonlight"``, the shape of a
public DeepSeek-V3-family MoE: see ``SHAPES``). No weights: vLLM fills them with
``--load-format dummy``. Nothing is downloaded; the same seed gives the same files.

Needs the ``tokenizers`` package (the ``tokenizer`` extra).
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent_replay.errors import InputError, OutputExistsError

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set c = message['content'] %}"
    "{% else %}{% set c = message['content'] | map(attribute='text') | join('') %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + c + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MAX_POSITIONS = {"llama": 8192, "deepseek": 32768, "moonlight": 131072}

#: The DeepSeek-V3 shape served on the H200 (hidden 2048, 4 layers with the first dense,
#: 64 routed + 1 shared experts, 8 per token, MLA 1536/512/128/64/128, 1 MTP layer).
DEEPSEEK_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 2048,
    "intermediate_size": 4096,
    "moe_intermediate_size": 512,
    "num_hidden_layers": 4,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 64,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "num_nextn_predict_layers": 1,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


#: Moonlight-16B-A3B's shape (moonshotai/Moonlight-16B-A3B, a DeepseekV3ForCausalLM): 27
#: layers with the first dense, hidden 2048, 16 heads, MLA without a query low-rank
#: (kv_lora 512, qk_nope 128, qk_rope 64, v 128), 64 routed experts of 1408 + 2 shared, 6 per
#: token, sigmoid scoring with noaux_tc, routed scaling 2.446, rope theta 50000. Chosen
#: because it is the one public model that is DeepSeek-V3's architecture (not V2's softmax
#: router, as DeepSeek-V2-Lite) at a size one H100 holds with room for 131,072-token
#: contexts. Changed here: one MTP layer added (as DeepSeek-V3 has; Moonlight ships none), the
#: vocabulary is the offline tokenizer's (32,000 ids, not 163,840: dummy weights sample
#: every id, and ids the tokenizer lacks would stream as nothing), and the positions reach
#: 131,072 (Moonlight's config says 8,192).
MOONLIGHT_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 2048,
    "intermediate_size": 11264,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.446,
    "num_nextn_predict_layers": 1,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 50000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "deepseek": ("a tiny DeepSeek-V3 shape (4 layers)", DEEPSEEK_CONFIG),
    "moonlight": ("Moonlight-16B-A3B", MOONLIGHT_CONFIG),
}
"""``arch`` -> (the public model whose shape it copies, its config without vocabulary)."""


def deepseek_parameters(config: dict[str, Any]) -> dict[str, int]:
    """Parameter counts of a DeepSeek-V3-shaped ``config``: ``main`` (the served model),
    ``mtp`` (its MTP layers, each a decoder layer plus its projection, norms and an output
    head), ``active`` (per token: attention, dense and shared MLPs, the routed experts a
    token uses, embeddings) and ``total`` (main + mtp). Norm and router weights count."""
    h, v = config["hidden_size"], config["vocab_size"]
    heads = config["num_attention_heads"]
    nope, rope, vdim = (
        config["qk_nope_head_dim"],
        config["qk_rope_head_dim"],
        config["v_head_dim"],
    )
    kv_lora, q_lora = config["kv_lora_rank"], config["q_lora_rank"]
    q = (
        (h * q_lora + q_lora + q_lora * heads * (nope + rope))
        if q_lora
        else h * heads * (nope + rope)
    )
    attn = q + h * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + vdim) + heads * vdim * h
    norms = 2 * h
    dense = 3 * h * config["intermediate_size"]
    expert = 3 * h * config["moe_intermediate_size"]
    shared = expert * config["n_shared_experts"]
    router = config["n_routed_experts"] * h + config["n_routed_experts"]
    moe = expert * config["n_routed_experts"] + shared + router
    layers, first_dense = config["num_hidden_layers"], config["first_k_dense_replace"]
    embed = 2 * h * v + h  # embeddings, output head, final norm
    main = layers * (attn + norms) + first_dense * dense + (layers - first_dense) * moe + embed
    mtp_layer = attn + norms + moe + 2 * h * h + 3 * h + h * v
    mtp = config["num_nextn_predict_layers"] * mtp_layer
    active = (
        layers * (attn + norms)
        + first_dense * dense
        + (layers - first_dense) * (expert * config["num_experts_per_tok"] + shared + router)
        + embed
    )
    return {"main": main, "mtp": mtp, "active": active, "total": main + mtp}


def describe(config_path: str | Path) -> str:
    """What a model folder written here is, for run.json: ``dummy weights, shape of X``."""
    config = json.loads(Path(config_path).read_text())
    shape = config.get("agent_replay_shape")
    return f"dummy weights, shape of {shape}" if shape else "dummy weights"


def describe_served(model: str | None) -> str | None:
    """``describe`` of the served model when its name is a folder of this machine written by
    ``make_tiny_model`` (it holds no weights, so its server loads dummy ones); None else."""
    if not model:
        return None
    config = Path(model) / "config.json"
    try:
        if "agent_replay_shape" not in json.loads(config.read_text()):
            return None
    except (OSError, ValueError):
        return None
    return describe(config)


def llama_config(vocab: int, hidden: int = 256, layers: int = 4) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": hidden * 4,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // 64,
        "num_key_value_heads": max(1, hidden // 128),
        "head_dim": 64,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": vocab,
    }


def _corpus(vocab: int, rng: random.Random) -> Iterator[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    lexicon = [
        "".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
        for _ in range(max(vocab * 3, 20000))
    ]
    lexicon += [
        "the",
        "a",
        "of",
        "and",
        "to",
        "in",
        "is",
        "you",
        "that",
        "it",
        "Hello",
        "world",
        *"0123456789",
        ".",
        ",",
        "?",
        "!",
        ":",
        ";",
        "(",
        ")",
        "\n",
    ]
    weights = [1.0 / (i + 1) ** 0.6 for i in range(len(lexicon))]
    words = rng.choices(lexicon, weights=weights, k=max(400_000, vocab * 8)) + lexicon
    rng.shuffle(words)
    for i in range(0, len(words), 12):
        yield " ".join(words[i : i + 12])


def train_tokenizer(vocab: int, seed: int = 0) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` with exactly ``vocab`` ids."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise InputError(
            "tiny-model needs the 'tokenizers' package: pip install 'agent-replay[tokenizer]'"
        ) from None
    if vocab < 512:
        raise InputError(f"--vocab {vocab}: need at least 512 (256 bytes + merges)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(vocab, random.Random(seed)), trainer=trainer)
    if tok.get_vocab_size() < vocab:  # pad to the exact size
        tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(vocab - tok.get_vocab_size())])
    if tok.get_vocab_size() != vocab:
        raise InputError(f"--vocab {vocab}: the tokenizer came out with {tok.get_vocab_size()} ids")
    return tok


def make_tiny_model(
    out: str | Path,
    *,
    arch: str = "llama",
    vocab: int | None = None,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Write a tiny model folder to ``out`` and return its path."""
    if arch not in MAX_POSITIONS:
        raise InputError(f"--arch {arch}: expected {', '.join(MAX_POSITIONS)}")
    path = Path(out)
    if path.exists():
        if not force:
            raise OutputExistsError(str(path))
        if not path.is_dir():
            raise InputError(f"{path}: exists and is not a folder")
    vocab = vocab or 32000
    tok = train_tokenizer(vocab, seed)
    ids = {
        name: tok.token_to_id(tokstr)
        for name, tokstr in (
            ("bos_token_id", "<s>"),
            ("eos_token_id", "<|im_end|>"),
            ("pad_token_id", "<pad>"),
        )
    }
    config = _model_config(arch, vocab)
    config.update(ids, max_position_embeddings=MAX_POSITIONS[arch])
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "special": True,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
        for t in SPECIAL_TOKENS
    }
    files = {
        "config.json": config,
        "generation_config.json": dict(ids),
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "<|im_end|>",
            "pad_token": "<pad>",
            "add_bos_token": False,
            "model_max_length": MAX_POSITIONS[arch],
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "added_tokens_decoder": added,
        },
        "special_tokens_map.json": {
            "bos_token": "<s>",
            "eos_token": "<|im_end|>",
            "pad_token": "<pad>",
        },
    }
    _write_folder(path, tok, files)
    return path


def _model_config(arch: str, vocab: int) -> dict[str, Any]:
    """The model's config.json of architecture ``arch`` (the ids and length aside)."""
    if arch == "llama":
        return llama_config(vocab)
    shape, base = SHAPES[arch]
    return dict(base, vocab_size=vocab, agent_replay_shape=shape)


def _write_folder(path: Path, tok: Any, files: dict[str, Any]) -> None:
    """The tokenizer and the JSON files, written beside ``path`` and moved over it."""
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tok.save(str(tmp / "tokenizer.json"))
    for name, data in files.items():
        (tmp / name).write_text(json.dumps(data, indent=2) + "\n")
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
