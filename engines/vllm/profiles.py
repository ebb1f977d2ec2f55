"""vLLM deployment profiles as data, and the exact per-node commands they produce.

A profile is a name, the flags and environment every ``vllm serve`` of it carries, a set of
typed knobs (``--set name=value``) and a layout rule that places instances on GPUs and
nodes. ``build(profile, model=..., gpus=..., nodes=...)`` returns a ``Deployment``: one
``Command`` per process to start (env + argv), in start order.

Profiles:

``standard``
    One instance over every GPU: tensor parallel within a node, pipeline parallel across
    nodes (multi-node over vLLM's own multiprocessing backend, ``--headless`` workers).
``mtp``
    ``standard`` plus MTP speculative decoding (3 draft tokens) and nothing else, so that a
    comparison against ``standard`` measures speculative decoding alone.
``dedicated-decode``
    InferenceX AgentX's vLLM recipe for DeepSeek with MTP on one instance (its
    ``dsv4_fp4_b300_vllm_mtp.sh`` without data parallelism): ``--max-num-seqs`` of twice the
    concurrency it is sized for (headroom for subagent fan-out), MTP with 3 draft tokens
    accepted synthetically at AgentX's golden length (2.49), full CUDA graphs for decode only
    with capture sizes in tokens (multiples of 1 + draft tokens up to the batch cap) and no
    torch.compile, and ``--performance-mode interactivity``. ``role=pd-decode`` makes it the
    decode side of a prefill/decode split over NixlConnector. One replica per node.
``dep``
    The same recipe over data-parallel attention with expert parallelism (InferenceX's
    DEP): ``--data-parallel-size`` of every GPU, ``--enable-expert-parallel``, prefill admitted
    every 8th step (``--prefill-schedule-interval``, which only a data-parallel engine
    reads), ``--long-prefill-token-threshold 512``, ``--max-num-batched-tokens 8192``, a batch
    cap of 2 x concurrency / DP per rank, and a session-affine router in front
    (vllm-router, consistent hashing on the session header). Needs 2 GPUs or more.
``wide-ep``
    Data-parallel attention with expert parallelism over every GPU: ``-dp/-dpl/-dpa/-dpp``,
    ``-dpr`` plus ``--headless`` on secondary nodes, ``--enable-expert-parallel``,
    ``--enable-eplb`` with ``--eplb-config``, an ``--all2all-backend``.
``pd-disagg``
    A prefill instance and a decode instance (the dedicated-decode flags) connected by
    NixlConnector, with vllm-router in front.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from agent_replay.engines.vllm.versions import adapt_argv
from agent_replay.errors import InputError

Flag = tuple[str, "str | None"]

#: Multicast over NVLink is off in every profile: it is what fails first on shared or
#: virtualised hosts, and none of these deployments depends on it.
NO_MULTICAST_ENV: tuple[tuple[str, str], ...] = (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
)


@dataclass(frozen=True, slots=True)
class Knob:
    name: str
    default: int | float | str | bool | None
    help: str

    def parse(self, text: str) -> int | float | str | bool | None:
        if text.strip().lower() in ("none", "null"):
            return None
        try:
            return self._value(text)
        except ValueError:
            kind = type(self.default).__name__
            raise InputError(f"--set {self.name}={text}: expected {kind}") from None

    def _value(self, text: str) -> int | float | str | bool:
        """``text`` as the default's type (a number or text for a knob without one);
        ``ValueError`` when it is not one."""
        if isinstance(self.default, bool):
            return _boolean(text)
        if isinstance(self.default, int):
            return int(text)
        if isinstance(self.default, float):
            return float(text)
        if self.default is None:
            return _number_or_text(text)
        return text


def _boolean(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _number_or_text(text: str) -> int | float | str:
    try:
        return _number(text)
    except ValueError:
        return text


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


@dataclass(frozen=True, slots=True)
class Command:
    """One process to start: ``env`` + ``argv`` on ``node``."""

    name: str
    node: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    is_vllm_serve: bool = True
    port: int | None = None

    @property
    def serve_args(self) -> list[str]:
        """The arguments after ``vllm serve`` (model first); empty for other programs."""
        return list(self.argv[2:]) if self.is_vllm_serve else []

    def shell(self) -> str:
        env = " ".join(f"{k}={_quote(v)}" for k, v in self.env)
        cmd = " ".join(_quote(a) for a in self.argv)
        return f"{env} {cmd}" if env else cmd

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "node": self.node,
            "env": dict(self.env),
            "argv": list(self.argv),
            "port": self.port,
        }


_PLACEHOLDER = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")
_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]*")


def _quote(text: str) -> str:
    # "${HEAD_IP}" style placeholders stay expandable by the user's shell.
    if "${" in text and _SAFE.fullmatch(_PLACEHOLDER.sub("", text)):
        return text
    return shlex.quote(text)


@dataclass(frozen=True, slots=True)
class Deployment:
    profile: str
    model: str
    gpus: int
    nodes: int
    commands: tuple[Command, ...]
    endpoint: str
    notes: tuple[str, ...] = ()
    knobs: Mapping[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "profile": self.profile,
            "model": self.model,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "endpoint": self.endpoint,
            "knobs": dict(self.knobs),
            "commands": [c.to_dict() for c in self.commands],
            "notes": list(self.notes),
        }

    def render(self) -> str:
        lines = [
            f"# profile {self.profile}: {self.model} on {self.gpus} GPU(s), "
            f"{self.nodes} node(s); clients use {self.endpoint}"
        ]
        lines += [f"# note: {n}" for n in self.notes]
        for c in self.commands:
            lines.append(f"# {c.name} (node {c.node})")
            lines.append(c.shell())
        return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Layout:
    """What a profile's layout rule receives."""

    model: str
    gpus: int
    nodes: int
    knobs: Mapping[str, object]

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    summary: str
    flags: tuple[Flag, ...]
    env: tuple[tuple[str, str], ...]
    knobs: tuple[Knob, ...]
    layout: Callable[[Profile, Layout], tuple[list[Command], str, list[str]]]
    min_gpus: int = 1
    max_nodes: int | None = None
    """The most nodes the layout places instances on (None: any)."""

    def knob(self, name: str) -> Knob | None:
        return next((k for k in self.knobs if k.name == name), None)


COMMON_KNOBS: tuple[Knob, ...] = (
    Knob("port", 8000, "API port of the (head) server"),
    Knob("head_address", "${HEAD_IP}", "address of node 0 as other nodes reach it"),
)

AGENTX_SPEC_KNOBS: tuple[Knob, ...] = (
    Knob("spec_method", "mtp", "speculative decoding: mtp, ngram or none"),
    Knob("spec_tokens", 3, "draft tokens per step (MTP nextn)"),
    Knob(
        "synthetic_acceptance_length",
        2.49,
        "accept drafts synthetically at this mean acceptance length (AgentX's golden 2.49 "
        "for 3 draft tokens; none: real verification)",
    ),
)

DECODE_KNOBS: tuple[Knob, ...] = (
    Knob("concurrency", 8, "concurrency the instance is sized for: --max-num-seqs is twice it"),
    Knob("max_num_seqs", None, "batch cap (default: 2 x concurrency)"),
    *AGENTX_SPEC_KNOBS,
)

#: Flags that a single engine ignores: vLLM reads them only in its data-parallel engine core
#: (``DPEngineCoreProc._should_throttle_prefills``; the plain ``EngineCore`` never throttles).
DP_ONLY_FLAGS: dict[str, str] = {
    "--prefill-schedule-interval": "only a data-parallel engine core throttles prefills "
    "(vLLM's EngineCore._should_throttle_prefills is False)",
}


def _decode_batch(knobs: Mapping[str, object], ranks: int = 1) -> int:
    if knobs["max_num_seqs"] is not None:
        if not isinstance(knobs["max_num_seqs"], int):
            raise InputError(f"--set max_num_seqs={knobs['max_num_seqs']}: expected int")
        return knobs["max_num_seqs"]
    total = 2 * int(str(knobs["concurrency"]))
    if total % ranks:
        raise InputError(
            f"--set concurrency={knobs['concurrency']}: 2 x concurrency must "
            f"divide over {ranks} data-parallel ranks"
        )
    return total // ranks


def _compilation_config(knobs: Mapping[str, object], batch: int) -> str:
    """FULL_DECODE_ONLY CUDA graphs with capture sizes in tokens: a decode step of S
    sequences verifies S x (1 + draft tokens) tokens, so the sizes are those multiples up to
    the batch cap (vLLM would round a plain 1..S list up and keep only S / (1 + N) of it);
    mode 0: no torch.compile, as the recipe runs."""
    per_seq = 1 + (int(str(knobs["spec_tokens"])) if _spec_config(knobs) else 0)
    sizes = [per_seq * n for n in range(1, batch + 1)]
    return json.dumps(
        {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": sizes, "mode": 0},
        separators=(",", ":"),
    )


def _decode_flags(knobs: Mapping[str, object], ranks: int = 1) -> list[Flag]:
    batch = _decode_batch(knobs, ranks)
    flags: list[Flag] = [("--performance-mode", "interactivity"), ("--max-num-seqs", str(batch))]
    spec = _spec_config(knobs)
    if spec is not None:
        flags.append(("--speculative-config", spec))
    flags.append(("--compilation-config", _compilation_config(knobs, batch)))
    return flags


def _spec_config(knobs: Mapping[str, object]) -> str | None:
    method = str(knobs["spec_method"] or "none")
    if method == "none":
        return None
    if method not in ("mtp", "ngram"):
        raise InputError(f"--set spec_method={method}: expected mtp, ngram or none")
    cfg: dict[str, object] = {"method": method, "num_speculative_tokens": knobs["spec_tokens"]}
    if method == "ngram":
        cfg.update(prompt_lookup_max=4, prompt_lookup_min=2)
    if knobs["synthetic_acceptance_length"] is not None:
        cfg.update(
            rejection_sample_method="synthetic",
            synthetic_acceptance_length=knobs["synthetic_acceptance_length"],
        )
    return json.dumps(cfg, separators=(",", ":"))


AGENTX_ACCEPTANCE_LENGTH: dict[str, dict[int, float]] = {
    "deepseek": {1: 1.79, 2: 2.27, 3: 2.49, 4: 2.54},
}
"""InferenceX AgentX's pinned synthetic acceptance (mean accepted length per verify step)
by model family and draft tokens K: its DeepSeek MTP runs accept drafts synthetically at
these lengths (K=3: 2.49, the ``SIMULATE_ACC_LEN`` of its DeepSeek recipes), so that
deployments are compared at one acceptance instead of at what their weights happen to
draft. A family matches when its key is part of the model name (lower case)."""


def agentx_speculative_config(model: str, k: int) -> str:
    """``--speculative-config`` for MTP with K draft tokens accepted synthetically at
    AgentX's pinned length for ``model`` (``AGENTX_ACCEPTANCE_LENGTH``); an InputError
    names the families and K values known when there is none."""
    name = model.lower()
    for family, by_k in AGENTX_ACCEPTANCE_LENGTH.items():
        if family in name:
            if k not in by_k:
                raise InputError(
                    f"no AgentX acceptance length for {family} MTP with K={k} "
                    f"(known: K={', '.join(map(str, sorted(by_k)))})"
                )
            return json.dumps(
                {
                    "method": "mtp",
                    "num_speculative_tokens": k,
                    "rejection_sample_method": "synthetic",
                    "synthetic_acceptance_length": by_k[k],
                },
                separators=(",", ":"),
            )
    raise InputError(
        f"no AgentX acceptance length for model {model!r} (known families: "
        f"{', '.join(AGENTX_ACCEPTANCE_LENGTH)})"
    )


def _nixl(role: str = "kv_both") -> Flag:
    return (
        "--kv-transfer-config",
        json.dumps({"kv_connector": "NixlConnector", "kv_role": role}, separators=(",", ":")),
    )


def _serve(
    name: str,
    node: int,
    model: str,
    flags: Iterable[Flag],
    env: Iterable[tuple[str, str]],
    port: int | None,
) -> Command:
    argv = ["vllm", "serve", model]
    for flag, value in flags:
        argv.append(flag)
        if value is not None:
            argv.append(value)
    return Command(name=name, node=node, argv=tuple(argv), env=tuple(env), port=port)


def _standard_layout(p: Profile, lay: Layout) -> tuple[list[Command], str, list[str]]:
    port = int(str(lay.knobs["port"]))
    head = str(lay.knobs["head_address"])
    base = [*p.flags, ("--tensor-parallel-size", str(lay.gpus_per_node))]
    spec = _spec_config(lay.knobs) if "spec_method" in lay.knobs else None
    if spec is not None:
        base.append(("--speculative-config", spec))
    if lay.nodes == 1:
        cmd = _serve("server", 0, lay.model, [*base, ("--port", str(port))], p.env, port)
        return [cmd], f"http://localhost:{port}", []
    base += [
        ("--pipeline-parallel-size", str(lay.nodes)),
        ("--nnodes", str(lay.nodes)),
        ("--master-addr", head),
        ("--master-port", str(lay.knobs["master_port"])),
    ]
    cmds = [
        _serve(
            "head", 0, lay.model, [*base, ("--node-rank", "0"), ("--port", str(port))], p.env, port
        )
    ]
    cmds += [
        _serve(
            f"worker{i}",
            i,
            lay.model,
            [*base, ("--node-rank", str(i)), ("--headless", None)],
            p.env,
            None,
        )
        for i in range(1, lay.nodes)
    ]
    return cmds, f"http://{head}:{port}", []


def _decode_layout(p: Profile, lay: Layout) -> tuple[list[Command], str, list[str]]:
    port = int(str(lay.knobs["port"]))
    role = str(lay.knobs["role"])
    if role not in ("alone", "pd-decode"):
        raise InputError(f"--set role={role}: expected alone or pd-decode")
    flags = [
        *p.flags,
        *_decode_flags(lay.knobs),
        ("--tensor-parallel-size", str(lay.gpus_per_node)),
        ("--port", str(port)),
    ]
    notes = []
    if role == "pd-decode":
        flags.append(_nixl())
        notes.append(
            "decode side of a P/D split: put a prefill instance and a router "
            "(see the pd-disagg profile) in front"
        )
    cmds = [_serve(f"decode{i}", i, lay.model, flags, p.env, port) for i in range(lay.nodes)]
    if lay.nodes > 1:
        notes.append(
            f"{lay.nodes} independent replicas, one per node: balance clients "
            "over them with a router"
        )
    return cmds, f"http://localhost:{port}", notes


def _wide_ep_layout(p: Profile, lay: Layout) -> tuple[list[Command], str, list[str]]:
    port = int(str(lay.knobs["port"]))
    head = str(lay.knobs["head_address"])
    backend = lay.knobs["all2all_backend"] or (
        "allgather_reducescatter" if lay.nodes == 1 else "deepep_low_latency"
    )
    eplb = {
        "window_size": lay.knobs["eplb_window_size"],
        "step_interval": lay.knobs["eplb_step_interval"],
        "num_redundant_experts": lay.knobs["num_redundant_experts"],
    }
    base: list[Flag] = [
        *p.flags,
        ("--data-parallel-size", str(lay.gpus)),
        ("--data-parallel-size-local", str(lay.gpus_per_node)),
        ("--all2all-backend", str(backend)),
    ]
    if lay.knobs["eplb"]:
        base += [
            ("--enable-eplb", None),
            ("--eplb-config", json.dumps(eplb, separators=(",", ":"))),
        ]
    if lay.nodes == 1:
        cmd = _serve("server", 0, lay.model, [*base, ("--port", str(port))], p.env, port)
        return [cmd], f"http://localhost:{port}", []
    rpc = [
        ("--data-parallel-address", head),
        ("--data-parallel-rpc-port", str(lay.knobs["dp_rpc_port"])),
    ]
    cmds = [_serve("head", 0, lay.model, [*base, *rpc, ("--port", str(port))], p.env, port)]
    for i in range(1, lay.nodes):
        cmds.append(
            _serve(
                f"worker{i}",
                i,
                lay.model,
                [
                    *base,
                    *rpc,
                    ("--data-parallel-start-rank", str(i * lay.gpus_per_node)),
                    ("--headless", None),
                ],
                p.env,
                None,
            )
        )
    return cmds, f"http://{head}:{port}", []


def _dep_layout(p: Profile, lay: Layout) -> tuple[list[Command], str, list[str]]:
    port = int(str(lay.knobs["port"]))
    backend = int(str(lay.knobs["backend_port"] or port + 1))
    flags: list[Flag] = [
        *p.flags,
        *_decode_flags(lay.knobs, ranks=lay.gpus),
        ("--tensor-parallel-size", "1"),
        ("--data-parallel-size", str(lay.gpus)),
        ("--prefill-schedule-interval", str(lay.knobs["prefill_schedule_interval"])),
        ("--long-prefill-token-threshold", str(lay.knobs["long_prefill_token_threshold"])),
        ("--max-num-batched-tokens", str(lay.knobs["max_num_batched_tokens"])),
        ("--port", str(backend)),
    ]
    server = _serve("server", 0, lay.model, flags, p.env, backend)
    router = Command(
        name="router",
        node=0,
        is_vllm_serve=False,
        port=port,
        argv=(
            "vllm-router",
            "--worker-urls",
            f"http://localhost:{backend}",
            "--policy",
            "consistent_hash",
            "--intra-node-data-parallel-size",
            str(lay.gpus),
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
        ),
    )
    notes = [
        "router: vllm-router (pip install vllm-router), consistent hashing on the "
        "session header so that every turn of a session reaches the same rank; its "
        "flags are not checked by vLLM's parser"
    ]
    return [server, router], f"http://localhost:{port}", notes


def _pd_layout(p: Profile, lay: Layout) -> tuple[list[Command], str, list[str]]:
    port = int(str(lay.knobs["port"]))
    head = str(lay.knobs["head_address"])
    prefill_gpus = int(str(lay.knobs["prefill_gpus"] or lay.gpus // 2))
    decode_gpus = lay.gpus - prefill_gpus
    if prefill_gpus < 1 or decode_gpus < 1:
        raise InputError(
            f"pd-disagg: prefill_gpus={prefill_gpus} leaves "
            f"{decode_gpus} GPU(s) for decode; both need at least 1"
        )
    p_port, d_port = port + 100, port + 200
    if lay.nodes == 1:
        p_node, d_node = 0, 0
        p_env = [
            *p.env,
            ("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(prefill_gpus)))),
            ("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"),
        ]
        d_env = [
            *p.env,
            ("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(prefill_gpus, lay.gpus)))),
            ("VLLM_NIXL_SIDE_CHANNEL_PORT", "5700"),
        ]
        p_host = d_host = "localhost"
    elif lay.nodes == 2:
        if prefill_gpus != lay.gpus_per_node:
            raise InputError(
                "pd-disagg over 2 nodes puts prefill on node 0 and decode on "
                f"node 1: prefill_gpus must be {lay.gpus_per_node}"
            )
        p_node, d_node = 0, 1
        p_env = [*p.env, ("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")]
        d_env = [*p.env, ("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")]
        p_host, d_host = head, str(lay.knobs["decode_address"])
    else:
        raise InputError("pd-disagg takes 1 or 2 nodes")
    prefill = _serve(
        "prefill",
        p_node,
        lay.model,
        [*p.flags, ("--tensor-parallel-size", str(prefill_gpus)), ("--port", str(p_port)), _nixl()],
        p_env,
        p_port,
    )
    decode = _serve(
        "decode",
        d_node,
        lay.model,
        [
            *p.flags,
            *_decode_flags(lay.knobs),
            ("--tensor-parallel-size", str(decode_gpus)),
            ("--port", str(d_port)),
            _nixl(),
        ],
        d_env,
        d_port,
    )
    router = Command(
        name="router",
        node=0,
        is_vllm_serve=False,
        port=port,
        argv=(
            "vllm-router",
            "--vllm-pd-disaggregation",
            "--prefill",
            f"http://{p_host}:{p_port}",
            "--decode",
            f"http://{d_host}:{d_port}",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--prefill-policy",
            "cache_aware",
            "--decode-policy",
            "power_of_two",
        ),
    )
    notes = [
        "router: vllm-router (pip install vllm-router); its flags are not checked by vLLM's parser"
    ]
    return (
        [prefill, decode, router],
        f"http://{head if lay.nodes > 1 else 'localhost'}:{port}",
        notes,
    )


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "standard",
            "one instance over every GPU (TP in a node, PP across nodes)",
            flags=(),
            env=NO_MULTICAST_ENV,
            knobs=(*COMMON_KNOBS, Knob("master_port", 29501, "torch.distributed port")),
            layout=_standard_layout,
        ),
        Profile(
            "mtp",
            "standard plus MTP speculative decoding, nothing else",
            flags=(),
            env=NO_MULTICAST_ENV,
            knobs=(
                *COMMON_KNOBS,
                Knob("master_port", 29501, "torch.distributed port"),
                *AGENTX_SPEC_KNOBS,
            ),
            layout=_standard_layout,
        ),
        Profile(
            "dedicated-decode",
            "InferenceX AgentX's MTP recipe on one instance (batch 2 x concurrency, "
            "MTP 3 at AL 2.49, decode-only full CUDA graphs, interactivity mode)",
            flags=(),
            env=NO_MULTICAST_ENV,
            knobs=(
                *COMMON_KNOBS,
                *DECODE_KNOBS,
                Knob("role", "alone", "alone, or pd-decode (NixlConnector)"),
            ),
            layout=_decode_layout,
        ),
        Profile(
            "dep",
            "the dedicated-decode recipe over DP attention + expert parallelism, "
            "prefill every 8th step, session-affine router",
            flags=(("--enable-expert-parallel", None),),
            env=NO_MULTICAST_ENV,
            knobs=(
                *COMMON_KNOBS,
                *DECODE_KNOBS,
                Knob(
                    "prefill_schedule_interval",
                    8,
                    "admit prefill only every N steps (data-parallel engines only)",
                ),
                Knob(
                    "long_prefill_token_threshold",
                    512,
                    "longest prefill chunk of a request per step",
                ),
                Knob("max_num_batched_tokens", 8192, "token budget of a step"),
                Knob("backend_port", None, "port of vLLM behind the router (default: port + 1)"),
            ),
            layout=_dep_layout,
            min_gpus=2,
            max_nodes=1,
        ),
        Profile(
            "wide-ep",
            "DP attention + expert parallelism + EPLB over every GPU",
            flags=(("--enable-expert-parallel", None),),
            env=NO_MULTICAST_ENV,
            knobs=(
                *COMMON_KNOBS,
                Knob(
                    "all2all_backend",
                    None,
                    "MoE all2all backend (default: allgather_reducescatter on one "
                    "node, deepep_low_latency across nodes)",
                ),
                Knob("eplb", True, "expert-parallel load balancing"),
                Knob("eplb_window_size", 1000, "EPLB window"),
                Knob("eplb_step_interval", 3000, "EPLB rebalance interval (steps)"),
                Knob("num_redundant_experts", 0, "EPLB redundant experts"),
                Knob("dp_rpc_port", 13345, "data-parallel RPC port on node 0"),
            ),
            layout=_wide_ep_layout,
        ),
        Profile(
            "pd-disagg",
            "prefill + decode instances over NixlConnector, router in front",
            flags=(),
            env=NO_MULTICAST_ENV,
            knobs=(
                *COMMON_KNOBS,
                *DECODE_KNOBS,
                Knob("prefill_gpus", None, "GPUs of the prefill instance (default: half)"),
                Knob("decode_address", "${DECODE_IP}", "address of the decode node"),
            ),
            layout=_pd_layout,
            min_gpus=2,
        ),
    )
}


@dataclass(frozen=True, slots=True)
class FlagDiff:
    """One flag or environment variable that differs between two deployments' commands.
    ``None``: absent; ``""``: present without a value."""

    flag: str
    base: str | None
    other: str | None


def _flag_map(args: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    items = list(args)
    i = 0
    while i < len(items):
        if items[i].startswith("-") and i + 1 < len(items) and not items[i + 1].startswith("-"):
            out[items[i]] = items[i + 1]
            i += 2
        else:
            out[items[i]] = ""
            i += 1
    return out


def diff(base: Deployment, other: Deployment) -> list[FlagDiff]:
    """What ``other``'s first vLLM command sets differently from ``base``'s: each flag (and
    each environment variable, as ``env:NAME``) that one has and the other lacks or sets to
    another value, in ``base``'s order, then ``other``'s new ones."""

    def first(dep: Deployment) -> Command:
        cmd = next((c for c in dep.commands if c.is_vllm_serve), None)
        if cmd is None:
            raise InputError(f"profile {dep.profile} starts no vllm serve")
        return cmd

    a, b = first(base), first(other)
    fa = {**_flag_map(a.serve_args[1:]), **{f"env:{k}": v for k, v in a.env}}
    fb = {**_flag_map(b.serve_args[1:]), **{f"env:{k}": v for k, v in b.env}}
    return [
        FlagDiff(k, fa.get(k), fb.get(k))
        for k in [*fa, *(k for k in fb if k not in fa)]
        if fa.get(k) != fb.get(k)
    ]


def render_diff(base: Deployment, other: Deployment) -> str:
    """``diff`` as text: one line per flag, ``-`` what only ``base`` has, ``+`` ``other``'s."""
    rows = diff(base, other)
    lines = [f"# {other.profile} vs {base.profile}: {len(rows)} setting(s) differ"]
    for d in rows:
        if d.base is not None:
            lines.append(f"- {d.flag} {d.base}".rstrip())
        if d.other is not None:
            lines.append(f"+ {d.flag} {d.other}".rstrip())
    return "\n".join(lines) + "\n"


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise InputError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None


def parse_sets(items: Iterable[str]) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {item!r}: expected key=value")
        out.append((key.strip(), value.strip()))
    return out


def build(
    profile: str | Profile,
    *,
    model: str,
    gpus: int,
    nodes: int = 1,
    sets: Iterable[tuple[str, str]] = (),
    version: str | None = None,
) -> Deployment:
    """The commands of ``profile`` for ``model`` on ``gpus`` GPUs over ``nodes`` nodes.

    ``sets`` are ``(key, value)`` pairs: a knob of the profile, or a vLLM flag (``max-num-seqs``
    or ``--max-num-seqs``; ``prefill.KEY``/``decode.KEY`` only for that instance). Value
    ``true`` or empty adds a bare flag, ``false`` removes it (or adds ``--no-FLAG``).
    ``version``: adapt the commands to that vLLM release (see ``versions``).
    """
    p = get_profile(profile) if isinstance(profile, str) else profile
    _check_shape(p, model, gpus, nodes)
    knobs: dict[str, object] = {k.name: k.default for k in p.knobs}
    flag_sets: list[_FlagSet] = []
    for key, value in sets:
        knob = p.knob(key)
        if knob is not None:
            knobs[key] = knob.parse(value)
        else:
            flag_sets.append(_flag_set(p, key, value))
    commands, endpoint, notes = p.layout(p, Layout(model, gpus, nodes, knobs))
    out = [_with_sets(cmd, flag_sets, version, notes) for cmd in commands]
    for cmd in out:
        refuse_inert_flags(cmd)
    return Deployment(
        profile=p.name,
        model=model,
        gpus=gpus,
        nodes=nodes,
        commands=tuple(out),
        endpoint=endpoint,
        notes=tuple(notes),
        knobs=knobs,
    )


def _check_shape(p: Profile, model: str, gpus: int, nodes: int) -> None:
    """The model is named and the GPUs and nodes fit the profile."""
    if not model:
        raise InputError("--model is required")
    if gpus < p.min_gpus:
        raise InputError(f"profile {p.name} needs at least {p.min_gpus} GPUs, got {gpus}")
    if nodes < 1 or gpus % nodes:
        raise InputError(f"--gpus {gpus} does not divide over --nodes {nodes}")
    if p.max_nodes is not None and nodes > p.max_nodes:
        raise InputError(f"profile {p.name} runs on {p.max_nodes} node(s), got --nodes {nodes}")


_FlagSet = tuple["str | None", str, str]
"""A ``--set`` of a vLLM flag: (the instances it is for by name prefix, None: all; the
flag; its value)."""


def _flag_set(p: Profile, key: str, value: str) -> _FlagSet:
    """A ``--set KEY=VALUE`` that is no knob of the profile, as a vLLM flag (``KEY``,
    ``--KEY`` or ``SCOPE.KEY``)."""
    scope, dot, flag = key.partition(".")
    if not dot:
        scope, flag = "", key
    if not flag.startswith("-"):
        if flag.replace("_", "-") != flag or not flag.replace("-", "").isalnum():
            raise InputError(
                f"--set {key}: not a knob of profile {p.name} "
                f"({', '.join(k.name for k in p.knobs)}) nor a vLLM flag"
            )
        flag = "--" + flag
    return scope or None, flag, value


def _with_sets(
    cmd: Command, flag_sets: list[_FlagSet], version: str | None, notes: list[str]
) -> Command:
    """A ``vllm serve`` command with the flags set for its instance, adapted to
    ``version`` (its notes added to ``notes``); other commands as they are."""
    if not cmd.is_vllm_serve:
        return cmd
    args = cmd.serve_args[1:]
    for only, flag, value in flag_sets:
        if only is None or cmd.name.startswith(only):
            args = _apply_flag(args, flag, value)
    if version is not None:
        protected = frozenset(f for _, f, _ in flag_sets)
        args, adapt_notes = adapt_argv(args, version, protected=protected)
        notes += [n for n in adapt_notes if n not in notes]
    return Command(
        name=cmd.name, node=cmd.node, argv=(*cmd.argv[:3], *args), env=cmd.env, port=cmd.port
    )


def refuse_inert_flags(cmd: Command) -> None:
    """An InputError naming the first flag of ``cmd`` that its parallelism makes inert
    (``DP_ONLY_FLAGS`` without ``--data-parallel-size`` of 2 or more)."""
    if not cmd.is_vllm_serve:
        return
    flags = _flag_map(cmd.serve_args[1:])
    dp = flags.get("--data-parallel-size") or flags.get("-dp") or "1"
    if int(dp) >= 2:
        return
    for flag, why in DP_ONLY_FLAGS.items():
        if flag in flags:
            raise InputError(
                f"{flag} has no effect at data-parallel size {dp}: {why}; "
                "use the dep profile (data parallel over 2 GPUs or more)"
            )


def _apply_flag(args: list[str], flag: str, value: str) -> list[str]:
    out: list[str] = []
    found = False
    i = 0
    while i < len(args):
        has_value = i + 1 < len(args) and not args[i + 1].startswith("-")
        width = 2 if has_value else 1
        if args[i] == flag:
            found = True
            if value.lower() != "false":
                out += [flag] if value.lower() in ("", "true") else [flag, value]
        else:
            out += args[i : i + width]
        i += width
    if not found:
        if value.lower() in ("", "true"):
            out.append(flag)
        elif value.lower() == "false":
            out.append("--no-" + flag[2:])
        else:
            out += [flag, value]
    return out
