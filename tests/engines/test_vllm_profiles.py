from __future__ import annotations

import json
import shlex

import pytest

from agent_replay.engines.vllm.profiles import PROFILES, build, parse_sets
from agent_replay.engines.vllm.versions import adapt_argv, flag_present, parse_version
from agent_replay.errors import InputError
from agent_replay.replay.cli import main


def _flags(argv: tuple[str, ...]) -> dict[str, str | None]:
    """--flag value pairs of a vllm serve argv (after 'vllm serve MODEL')."""
    out: dict[str, str | None] = {}
    rest = list(argv[3:])
    while rest:
        flag = rest.pop(0)
        out[flag] = rest.pop(0) if rest and not rest[0].startswith("-") else None
    return out


def test_standard_single_node() -> None:
    d = build("standard", model="m", gpus=8)
    assert len(d.commands) == 1
    c = d.commands[0]
    assert c.argv[:3] == ("vllm", "serve", "m")
    assert _flags(c.argv) == {"--tensor-parallel-size": "8", "--port": "8000"}
    assert ("NCCL_NVLS_ENABLE", "0") in c.env
    assert d.endpoint == "http://localhost:8000"


def test_standard_two_nodes_uses_headless_worker() -> None:
    d = build("standard", model="m", gpus=16, nodes=2, sets=[("head_address", "10.0.0.1")])
    head, worker = d.commands
    assert _flags(head.argv)["--node-rank"] == "0"
    assert _flags(head.argv)["--pipeline-parallel-size"] == "2"
    assert _flags(head.argv)["--tensor-parallel-size"] == "8"
    assert _flags(worker.argv)["--node-rank"] == "1"
    assert "--headless" in worker.argv and "--port" not in worker.argv
    assert _flags(worker.argv)["--master-addr"] == "10.0.0.1"
    assert d.endpoint == "http://10.0.0.1:8000"


def test_dedicated_decode_flags() -> None:
    """InferenceX AgentX's MTP recipe on one instance: batch 2 x concurrency, MTP 3 at the
    golden acceptance 2.49, decode-only full graphs captured at multiples of 1 + 3 tokens up
    to 4 x the batch cap, no torch.compile; no data-parallel-only flag."""
    d = build("dedicated-decode", model="m", gpus=8, sets=[("concurrency", "3")])
    f = _flags(d.commands[0].argv)
    assert f["--performance-mode"] == "interactivity"
    assert f["--max-num-seqs"] == "6"
    assert "--prefill-schedule-interval" not in f
    assert json.loads(f["--speculative-config"] or "") == {
        "method": "mtp",
        "num_speculative_tokens": 3,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 2.49,
    }
    assert json.loads(f["--compilation-config"] or "") == {
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "cudagraph_capture_sizes": [4, 8, 12, 16, 20, 24],
        "mode": 0,
    }
    assert "--kv-transfer-config" not in f
    real = build(
        "dedicated-decode",
        model="m",
        gpus=1,
        sets=[("max_num_seqs", "2"), ("spec_tokens", "2"), ("synthetic_acceptance_length", "none")],
    )
    fr = _flags(real.commands[0].argv)
    assert json.loads(fr["--speculative-config"] or "") == {
        "method": "mtp",
        "num_speculative_tokens": 2,
    }
    assert json.loads(fr["--compilation-config"] or "")["cudagraph_capture_sizes"] == [3, 6]
    plain = build(
        "dedicated-decode", model="m", gpus=1, sets=[("max_num_seqs", "2"), ("spec_method", "none")]
    )
    assert json.loads(_flags(plain.commands[0].argv)["--compilation-config"] or "")[
        "cudagraph_capture_sizes"
    ] == [1, 2]


def test_flags_inert_at_one_data_parallel_rank_are_refused() -> None:
    """--prefill-schedule-interval acts only in vLLM's data-parallel engine core: set on a
    single engine it is refused in one line; under dep (DP over every GPU) it stays."""
    with pytest.raises(
        InputError,
        match=r"--prefill-schedule-interval has no effect at "
        r"data-parallel size 1: .*dep profile",
    ):
        build("dedicated-decode", model="m", gpus=1, sets=[("prefill-schedule-interval", "4")])
    with pytest.raises(InputError, match="data-parallel size 1"):
        build("standard", model="m", gpus=4, sets=[("--prefill-schedule-interval", "2")])
    d = build("dep", model="m", gpus=2, sets=[("concurrency", "4")])
    server, router = d.commands
    f = _flags(server.argv)
    assert f["--data-parallel-size"] == "2" and f["--tensor-parallel-size"] == "1"
    assert f["--prefill-schedule-interval"] == "8"
    assert f["--long-prefill-token-threshold"] == "512"
    assert f["--max-num-seqs"] == "4"  # 2 x 4 over 2 ranks
    assert "--enable-expert-parallel" in server.argv
    assert f["--port"] == "8001" and router.port == 8000 and not router.is_vllm_serve
    assert "consistent_hash" in router.argv
    with pytest.raises(InputError, match="at least 2 GPUs"):
        build("dep", model="m", gpus=1)
    with pytest.raises(InputError, match="profile dep runs on 1 node"):
        build("dep", model="m", gpus=16, nodes=2)
    with pytest.raises(InputError, match="must divide over 4 data-parallel ranks"):
        build("dep", model="m", gpus=4, sets=[("concurrency", "1")])


def test_dedicated_decode_as_pd_decode_side() -> None:
    d = build(
        "dedicated-decode", model="m", gpus=4, sets=[("role", "pd-decode"), ("spec_method", "none")]
    )
    f = _flags(d.commands[0].argv)
    assert json.loads(f["--kv-transfer-config"] or "") == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
    }
    assert "--speculative-config" not in f


def test_wide_ep_two_nodes() -> None:
    d = build("wide-ep", model="m", gpus=16, nodes=2)
    head, worker = d.commands
    fh, fw = _flags(head.argv), _flags(worker.argv)
    for f in (fh, fw):
        assert f["--data-parallel-size"] == "16"
        assert f["--data-parallel-size-local"] == "8"
        assert f["--data-parallel-rpc-port"] == "13345"
        assert "--enable-expert-parallel" in f and "--enable-eplb" in f
        assert f["--all2all-backend"] == "deepep_low_latency"
        assert json.loads(f["--eplb-config"] or "")["window_size"] == 1000
    assert "--headless" in fw and fw["--data-parallel-start-rank"] == "8"
    assert "--headless" not in fh and fh["--port"] == "8000"
    assert dict(head.env)["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert dict(head.env)["NVSHMEM_DISABLE_NVLS"] == "1"


def test_wide_ep_single_node_default_backend() -> None:
    f = _flags(build("wide-ep", model="m", gpus=8).commands[0].argv)
    assert f["--all2all-backend"] == "allgather_reducescatter"
    assert "--data-parallel-address" not in f


def test_pd_disagg_one_node_splits_gpus() -> None:
    d = build("pd-disagg", model="m", gpus=8)
    prefill, decode, router = d.commands
    assert dict(prefill.env)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert dict(decode.env)["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert (
        dict(prefill.env)["VLLM_NIXL_SIDE_CHANNEL_PORT"]
        != dict(decode.env)["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    )
    assert "--performance-mode" in decode.argv and "--performance-mode" not in prefill.argv
    assert not router.is_vllm_serve
    assert router.argv[router.argv.index("--prefill") + 1] == "http://localhost:8100"
    assert router.argv[router.argv.index("--decode") + 1] == "http://localhost:8200"


def test_pd_disagg_needs_two_gpus() -> None:
    with pytest.raises(InputError, match="at least 2"):
        build("pd-disagg", model="m", gpus=1)


def test_set_flags_add_replace_remove_and_scope() -> None:
    d = build(
        "pd-disagg",
        model="m",
        gpus=2,
        sets=parse_sets(
            [
                "max-model-len=4096",
                "decode.max-num-seqs=4",
                "--enforce-eager=true",
                "enable-prefix-caching=false",
            ]
        ),
    )
    prefill, decode, _ = d.commands
    fp, fd = _flags(prefill.argv), _flags(decode.argv)
    assert fp["--max-model-len"] == fd["--max-model-len"] == "4096"
    assert fd["--max-num-seqs"] == "4" and "--max-num-seqs" not in fp
    assert "--enforce-eager" in fp and fp["--enforce-eager"] is None
    assert "--no-enable-prefix-caching" in fp
    d = build("dedicated-decode", model="m", gpus=1, sets=[("performance-mode", "false")])
    assert "--performance-mode" not in d.commands[0].argv


@pytest.mark.parametrize(
    "sets, match",
    [
        ([("max_num_seqs", "many")], "expected int"),
        ([("spec_method", "eagle9")], "spec_method"),
        ([("bad key!", "1")], "not a knob"),
    ],
)
def test_bad_sets(sets: list[tuple[str, str]], match: str) -> None:
    with pytest.raises(InputError, match=match):
        build("dedicated-decode", model="m", gpus=1, sets=sets)


def test_bad_shapes() -> None:
    with pytest.raises(InputError, match="does not divide"):
        build("standard", model="m", gpus=3, nodes=2)
    with pytest.raises(InputError, match="unknown profile"):
        build("turbo", model="m", gpus=1)
    with pytest.raises(InputError, match="key=value"):
        parse_sets(["novalue"])


def test_shell_rendering_round_trips_and_keeps_placeholders() -> None:
    d = build("wide-ep", model="my model", gpus=16, nodes=2)
    line = d.commands[1].shell()
    assert "${HEAD_IP}" in line and "'${HEAD_IP}'" not in line
    words = shlex.split(line)
    env_words = [w for w in words if "=" in w and w.split("=")[0].isupper()]
    assert words[len(env_words) :] == list(d.commands[1].argv)


def test_versions_table() -> None:
    assert parse_version("0.32.0+cpu") == (0, 32, 0)
    assert parse_version("0.26") == (0, 26, 0)
    assert not flag_present("--custom-histogram-buckets", "0.26.0")
    assert flag_present("--custom-histogram-buckets", "0.32.0")
    assert flag_present("--max-num-partial-prefills", "0.26.0")
    assert not flag_present("--max-num-partial-prefills", "0.33.0")
    argv = ["--custom-histogram-buckets", "{}", "--all2all-backend", "pplx", "--enforce-eager"]
    out, notes = adapt_argv(argv, "0.26.0")
    assert out == ["--all2all-backend", "pplx", "--enforce-eager"] and len(notes) == 1
    out, notes = adapt_argv(argv, "0.33.0")
    assert (
        out
        == [
            "--custom-histogram-buckets",
            "{}",
            "--all2all-backend",
            "allgather_reducescatter",
            "--enforce-eager",
        ]
        and len(notes) == 1
    )
    out, _ = adapt_argv(argv, "0.26.0", protected=frozenset({"--custom-histogram-buckets"}))
    assert out[0] == "--custom-histogram-buckets"


def test_build_for_version_drops_unknown_profile_flags() -> None:
    sets = [("custom-histogram-buckets", '{"inter_token_latency":[0.01]}')]
    d = build("standard", model="m", gpus=1, sets=sets, version="0.26.0")
    assert "--custom-histogram-buckets" in d.commands[0].argv  # user-given: kept, parser names it


def test_cli_prints_commands(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "engines",
            "vllm-cmd",
            "wide-ep",
            "--model",
            "m",
            "--gpus",
            "16",
            "--nodes",
            "2",
            "--no-check",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["profile"] == "wide-ep" and len(out["commands"]) == 2
    assert out["commands"][1]["node"] == 1 and out["checked_with"] is None
    assert (
        main(
            [
                "engines",
                "vllm-cmd",
                "standard",
                "--model",
                "m",
                "--gpus",
                "2",
                "--nodes",
                "3",
                "--no-check",
            ]
        )
        == 2
    )
    assert "does not divide" in capsys.readouterr().err


def test_every_profile_is_documented() -> None:
    for p in PROFILES.values():
        assert p.summary and all(k.help for k in p.knobs)


def test_agentx_pinned_acceptance_per_model_and_k() -> None:
    from agent_replay.engines.vllm.profiles import agentx_speculative_config

    got = {
        k: json.loads(agentx_speculative_config("deepseek-ai/DeepSeek-V3.2", k))
        for k in (1, 2, 3, 4)
    }
    assert {k: c["synthetic_acceptance_length"] for k, c in got.items()} == {
        1: 1.79,
        2: 2.27,
        3: 2.49,
        4: 2.54,
    }
    assert got[3] == {
        "method": "mtp",
        "num_speculative_tokens": 3,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 2.49,
    }
    with pytest.raises(InputError, match="K=5"):
        agentx_speculative_config("DeepSeek-R1", 5)
    with pytest.raises(InputError, match="known families: deepseek"):
        agentx_speculative_config("Qwen/Qwen3-8B", 3)


MTP_SPEC = {
    "method": "mtp",
    "num_speculative_tokens": 3,
    "rejection_sample_method": "synthetic",
    "synthetic_acceptance_length": 2.8,
}


def test_mtp_is_standard_plus_speculative_decoding_only() -> None:
    std = build("standard", model="m", gpus=2)
    mtp = build("mtp", model="m", gpus=2, sets=[("synthetic_acceptance_length", "2.8")])
    f_std, f_mtp = _flags(std.commands[0].argv), _flags(mtp.commands[0].argv)
    assert json.loads(f_mtp.pop("--speculative-config") or "") == MTP_SPEC
    assert f_mtp == f_std and mtp.commands[0].env == std.commands[0].env
    assert "--speculative-config" not in _flags(
        build("mtp", model="m", gpus=1, sets=[("spec_method", "none")]).commands[0].argv
    )


def test_diff_against_standard() -> None:
    from agent_replay.engines.vllm.profiles import FlagDiff, diff

    std = build("standard", model="m", gpus=1, sets=[("kv-cache-memory-bytes", "1024")])
    mtp = build("mtp", model="m", gpus=1, sets=[("kv-cache-memory-bytes", "1024")])
    ded = build("dedicated-decode", model="m", gpus=1, sets=[("max_num_seqs", "2")])
    spec = json.dumps(
        {
            "method": "mtp",
            "num_speculative_tokens": 3,
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_length": 2.49,
        },
        separators=(",", ":"),
    )
    graphs = json.dumps(
        {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [4, 8], "mode": 0},
        separators=(",", ":"),
    )
    assert diff(std, mtp) == [FlagDiff("--speculative-config", None, spec)]
    assert diff(std, std) == []
    assert diff(std, ded) == [
        FlagDiff("--kv-cache-memory-bytes", "1024", None),
        FlagDiff("--performance-mode", None, "interactivity"),
        FlagDiff("--max-num-seqs", None, "2"),
        FlagDiff("--speculative-config", None, spec),
        FlagDiff("--compilation-config", None, graphs),
    ]
    bare = build("standard", model="m", gpus=1, sets=[("enforce-eager", "true")])
    assert diff(bare, build("standard", model="m", gpus=1)) == [
        FlagDiff("--enforce-eager", "", None)
    ]


def test_cli_diff(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "engines",
        "vllm-cmd",
        "mtp",
        "--model",
        "m",
        "--gpus",
        "1",
        "--set",
        "synthetic_acceptance_length=2.8",
        "--set",
        "kv-cache-memory-bytes=64",
        "--diff",
        "standard",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# mtp vs standard: 1 setting(s) differ"
    assert out[1:] == ["+ --speculative-config " + json.dumps(MTP_SPEC, separators=(",", ":"))]
    assert main([*args[:2], "dedicated-decode", *args[3:], "--json"]) == 0
    flags = [d["flag"] for d in json.loads(capsys.readouterr().out)["diff"]]
    assert flags == [
        "--performance-mode",
        "--max-num-seqs",
        "--speculative-config",
        "--compilation-config",
    ]
