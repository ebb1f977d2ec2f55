"""Model folders for --load-format dummy: the realistic preset's config and its size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_replay.engines.vllm.tiny_model import (
    MOONLIGHT_CONFIG,
    deepseek_parameters,
    describe,
    make_tiny_model,
)


def test_parameters_by_hand() -> None:
    """hidden 4, vocab 10, 2 layers (the first dense, intermediate 8), 2 heads of
    nope 2 + rope 1 (v 2), no query low rank, kv_lora 3, 4 routed experts of 2 + 1 shared,
    2 per token, 1 MTP layer:
    attention = q 4*2*3 + kv_a 4*(3+1) + kv_a norm 3 + kv_b 3*2*(2+2) + o 2*2*4 = 24+16+3+24+16
    = 83; norms 8; dense 3*4*8 = 96; expert 3*4*2 = 24; router 4*4 + 4 = 20; moe = 4*24 + 24
    + 20 = 140; embeddings 2*4*10 + 4 = 84.
    main = 2*(83+8) + 96 + 140 + 84 = 502; mtp = 83+8+140 + 2*16 + 12 + 40 = 315;
    active = 2*(83+8) + 96 + (2*24 + 24 + 20) + 84 = 454."""
    cfg = {
        "hidden_size": 4,
        "vocab_size": 10,
        "num_attention_heads": 2,
        "qk_nope_head_dim": 2,
        "qk_rope_head_dim": 1,
        "v_head_dim": 2,
        "kv_lora_rank": 3,
        "q_lora_rank": None,
        "intermediate_size": 8,
        "moe_intermediate_size": 2,
        "n_shared_experts": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "first_k_dense_replace": 1,
        "num_nextn_predict_layers": 1,
    }
    assert deepseek_parameters(cfg) == {"main": 502, "mtp": 315, "active": 454, "total": 817}


def test_moonlight_shape_has_the_published_size() -> None:
    """With Moonlight's own vocabulary (163,840) the count is its published 16B total and
    3B active; the preset's (32,000 ids) stays over 10B in 24 or more layers."""
    full = deepseek_parameters(dict(MOONLIGHT_CONFIG, vocab_size=163840))
    assert 15.9e9 < full["main"] < 16.1e9 and 2.8e9 < full["active"] < 3.0e9
    ours = deepseek_parameters(dict(MOONLIGHT_CONFIG, vocab_size=32000))
    assert ours["main"] > 10e9 and MOONLIGHT_CONFIG["num_hidden_layers"] >= 24


@pytest.mark.slow
def test_moonlight_folder(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    path = make_tiny_model(tmp_path / "m", arch="moonlight", vocab=1024)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["max_position_embeddings"] == 131072
    assert cfg["vocab_size"] == 1024 and cfg["q_lora_rank"] is None
    assert describe(path / "config.json") == "dummy weights, shape of Moonlight-16B-A3B"


def test_run_json_says_what_a_served_model_folder_is(tmp_path: Path) -> None:
    from agent_replay.replay.runrecord import describe_served

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(dict(MOONLIGHT_CONFIG, vocab_size=32000, agent_replay_shape="Moonlight-16B-A3B"))
    )
    assert describe_served(str(folder)) == "dummy weights, shape of Moonlight-16B-A3B"
    (folder / "config.json").write_text(json.dumps(MOONLIGHT_CONFIG))  # not one of ours
    assert describe_served(str(folder)) is None
    assert describe_served("deepseek-ai/DeepSeek-V3") is None and describe_served(None) is None
