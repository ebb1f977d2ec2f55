"""The server settings a run was measured against, from its run.json, and what differs
between runs: a comparison of two deployments means one thing only when they differ in the
variable named (the target), not also in flags nobody meant to change.

Sources, in run.json: ``launch`` (a server the run or the sweep started: its profile, argv
and environment; a simulated engine's profile and argv) and ``provenance.server`` (what the
launcher knew: ``command``, ``argv``, ``flags``, ``profile``, ``env``; the server's
``/version``). A server given by URL records only its version: its flags are unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent_replay.runmeta import RunMeta

PER_INSTANCE = frozenset(
    {"--port", "--host", "--seed", "--log", "--uvicorn-log-level", "--served-model-name"}
)
"""Flags that name this instance (where it listens, its log), not how it serves."""


def _argv_flags(argv: Sequence[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    args = [str(a) for a in argv]
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            name, eq, val = a.partition("=")
            if not eq:
                if i + 1 < len(args) and not args[i + 1].startswith("--"):
                    val = args[i + 1]
                    i += 1
                else:
                    val = "true"
            if name not in PER_INSTANCE:
                out[name] = val
        elif a == "serve" and i + 1 < len(args):
            out["model"] = args[i + 1]
            i += 1
        i += 1
    return out


def _table(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _source_settings(src: Mapping[str, Any]) -> dict[str, str]:
    """The settings one record of the server (provenance or launch) gives: profile, command
    line flags, environment additions, vLLM version."""
    out: dict[str, str] = {}
    if src.get("profile") is not None:
        out["profile"] = str(src["profile"])
    for k in ("command", "argv"):
        if isinstance(src.get(k), list):
            out.update(_argv_flags(src[k]))
    flags = src.get("flags")
    if isinstance(flags, Mapping):
        out.update({str(k): str(v) for k, v in flags.items()})
    elif isinstance(flags, list):
        out.update(_argv_flags(flags))
    env = src.get("env")
    if isinstance(env, Mapping):
        out.update({f"env {k}": str(v) for k, v in env.items()})
    if src.get("vllm_version"):
        out["vllm version"] = str(src["vllm_version"])
    return out


def server_settings(meta: RunMeta | Mapping[str, Any]) -> dict[str, str] | None:
    """The settings of the server a run measured: profile, flags, environment additions and
    version, as strings; None when run.json records none (a server given by URL)."""
    meta = RunMeta.of(meta)
    launch = _table(meta.launch)
    server = _table(meta.provenance.get("server"))
    out: dict[str, str] = {}
    for src in (server, launch):
        out.update(_source_settings(src))
    if not out:
        return None
    ver = server.get("version_endpoint")
    if isinstance(ver, Mapping) and ver.get("version") is not None:
        out["version"] = str(ver["version"])
    return out


def setting_differences(
    metas: Sequence[RunMeta | Mapping[str, Any]], names: Sequence[str]
) -> list[str]:
    """Each run's settings against the first's: one entry per differing setting
    (``name=value`` pairs, '(unset)' where a side has none); or a note that a run records no
    settings, so that nothing can be checked."""
    sets = [server_settings(m) for m in metas]
    out = []
    missing = [n for n, s in zip(names, sets, strict=True) if s is None]
    if missing:
        out.append(
            f"server settings not recorded for {', '.join(missing)} (a server given by URL): "
            "whether the targets differ only in what is compared cannot be checked"
        )
    base = sets[0]
    if base is None:
        return out
    for name, s in zip(names[1:], sets[1:], strict=True):
        diff = _differing(base, s) if s is not None else []
        if diff:
            out.append(
                f"{name} vs {names[0]}: the servers differ in {len(diff)} setting"
                f"{'s' if len(diff) > 1 else ''}: {'; '.join(diff)}"
            )
    return out


def _differing(base: Mapping[str, str], other: Mapping[str, str]) -> list[str]:
    """``key base-value vs other-value`` for every setting the two differ in."""
    keys = sorted(set(base) | set(other))
    return [
        f"{k} {base.get(k, '(unset)')} vs {other.get(k, '(unset)')}"
        for k in keys
        if base.get(k) != other.get(k)
    ]
