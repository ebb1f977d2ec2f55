"""``agent-replay engines vllm-cmd | launch | tiny-model``: vLLM deployment profiles."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

from agent_replay.errors import InputError
from agent_replay.replay.launch import add_launch_args, deployment_args, server_from_args


def register(sub: Any) -> None:
    """Add ``vllm-cmd``, ``launch`` and ``tiny-model`` to the ``engines`` group."""
    from agent_replay.engines.vllm.profiles import PROFILES

    names = ", ".join(PROFILES)
    p = sub.add_parser(
        "vllm-cmd",
        help="print the exact vLLM commands of a deployment profile",
        description="Print the per-node commands (env + argv) of a vLLM "
        f"deployment profile ({names}). When vLLM is importable (this "
        "python, --vllm-python or $AGENT_REPLAY_VLLM_PYTHON), every command "
        "is checked with vLLM's own argument parser.",
    )
    deployment_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of shell lines")
    p.add_argument("--no-check", action="store_true", help="do not run vLLM's parser")
    p.add_argument(
        "--diff",
        default=None,
        metavar="PROFILE",
        help="print only what differs from PROFILE's command (built with the "
        "same model, GPUs and the --set flags it takes)",
    )
    p.set_defaults(func=_vllm_cmd)

    p = sub.add_parser(
        "launch",
        help="start a local vLLM with a profile and wait until healthy",
        description="Start a local vLLM server (one instance, one node), "
        "wait for /health, print its URL and metadata, and stop it on Ctrl-C. "
        "'agent-replay run --launch \"PROFILE --model M ...\"' takes the same "
        "arguments.",
    )
    add_launch_args(p)
    p.set_defaults(func=_launch)

    p = sub.add_parser(
        "vllm-settings",
        help="check a recorded launch: each flag of its "
        "command against what the server's log (and /metrics page) reports",
        description="Read a launch JSON (engines launch's output, or run.json, "
        "whose 'launch' holds it) and the server log it names, and print per "
        "flag what the server reports: in effect, differs, or not reported. "
        "Exit 1 when a setting differs.",
    )
    p.add_argument("launch_json", help="launch JSON or run.json")
    p.add_argument("--log", default=None, help="server log (default: the one the JSON names)")
    p.add_argument("--metrics", default=None, help="a saved /metrics page of the server")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_vllm_settings)

    p = sub.add_parser(
        "tiny-model",
        help="write a tiny model folder (tokenizer + config) for --load-format dummy, offline",
    )
    p.add_argument("out", help="output folder")
    p.add_argument(
        "--arch",
        choices=("llama", "deepseek", "moonlight"),
        default="llama",
        help="llama: tiny Llama; deepseek: tiny DeepSeek-V3 shape (4 layers); "
        "moonlight: Moonlight-16B-A3B's DeepSeek-V3 shape (16B, 27 layers, MTP)",
    )
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default 32000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="overwrite an existing folder")
    p.set_defaults(func=_tiny_model)


def _vllm_cmd(args: argparse.Namespace) -> int:
    from agent_replay.engines.vllm.argcheck import find_vllm_python
    from agent_replay.engines.vllm.profiles import build, parse_sets

    sets = parse_sets(args.sets)
    dep = build(
        args.profile,
        model=args.model,
        gpus=args.gpus,
        nodes=args.nodes,
        sets=sets,
        version=args.vllm_version,
    )
    if args.diff is not None:
        return _print_diff(dep, args, sets)
    python = None if args.no_check else find_vllm_python(args.vllm_python)
    checked = None
    if python is not None:
        dep, checked = _checked(dep, args, sets, python)
    if args.json:
        out = dep.to_dict()
        out["checked_with"] = checked
        print(json.dumps(out, indent=2))
    else:
        sys.stdout.write(dep.render())
        if checked:
            print(f"# checked: accepted by vLLM {checked}'s argument parser ({python})")
        elif args.no_check:
            print("# not checked (--no-check)")
        else:
            print("# not checked: no vLLM importable (use --vllm-python PATH)")
    return 0


def _print_diff(dep: Any, args: argparse.Namespace, sets: list[tuple[str, str]]) -> int:
    """The flags by which ``dep`` differs from profile ``args.diff``. The base takes the
    --set items that are its own knobs or vLLM flags, not the other profile's knobs."""
    from agent_replay.engines.vllm.profiles import build, diff, get_profile, render_diff

    mine, other = get_profile(args.profile), get_profile(args.diff)
    base_sets = [(k, v) for k, v in sets if other.knob(k) is not None or mine.knob(k) is None]
    base = build(
        other,
        model=args.model,
        gpus=args.gpus,
        nodes=args.nodes,
        sets=base_sets,
        version=args.vllm_version,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "profile": dep.profile,
                    "base": base.profile,
                    "diff": [
                        {"flag": d.flag, "base": d.base, "profile": d.other}
                        for d in diff(base, dep)
                    ],
                },
                indent=2,
            )
        )
    else:
        sys.stdout.write(render_diff(base, dep))
    return 0


def _checked(
    dep: Any, args: argparse.Namespace, sets: list[tuple[str, str]], python: str
) -> tuple[Any, str]:
    """Check ``dep`` with vLLM's parser; adapt to its version first when that changes it."""
    from agent_replay.engines.vllm.argcheck import require_valid
    from agent_replay.engines.vllm.profiles import build

    res = require_valid(dep, python)
    if args.vllm_version is None:
        adapted = build(
            args.profile,
            model=args.model,
            gpus=args.gpus,
            nodes=args.nodes,
            sets=sets,
            version=res.version,
        )
        if adapted.commands != dep.commands:
            res = require_valid(adapted, python)
        dep = adapted
    for name in res.unknown_env:
        print(
            f"agent-replay: warning: vLLM {res.version} does not know env {name}", file=sys.stderr
        )
    return dep, res.version


def _launch(args: argparse.Namespace) -> int:
    server = server_from_args(args)
    signal.signal(signal.SIGTERM, _interrupt)
    with server:
        print(json.dumps({"url": server.url, **server.info}, indent=2), flush=True)
        print(f"agent-replay: vLLM serving at {server.url}; Ctrl-C stops it", file=sys.stderr)
        try:
            while server.running():
                time.sleep(0.5)
        except KeyboardInterrupt:
            return 0
    raise InputError(f"the vLLM server exited on its own; see its log {server.log_path}")


def _vllm_settings(args: argparse.Namespace) -> int:
    from pathlib import Path

    from agent_replay.engines.vllm.resolved import check_launch, mismatches, to_markdown

    def read(path: str, what: str) -> str:
        try:
            return Path(path).read_text(errors="replace")
        except OSError as exc:
            raise InputError(f"{path}: cannot read the {what} ({exc.strerror})") from None

    try:
        info = json.loads(read(args.launch_json, "launch JSON"))
    except ValueError as exc:
        raise InputError(f"{args.launch_json}: not JSON ({exc})") from None
    if isinstance(info, dict) and isinstance(info.get("launch"), dict):
        info = info["launch"]
    if not isinstance(info, dict):
        raise InputError(f"{args.launch_json}: expected a JSON object")
    log = args.log or info.get("log")
    if not log:
        raise InputError(f"{args.launch_json}: names no server log: pass --log FILE")
    metrics = read(args.metrics, "metrics page") if args.metrics else ""
    try:
        checks = check_launch(info, read(str(log), "server log"), metrics)
    except ValueError as exc:
        raise InputError(f"{args.launch_json}: {exc}") from None
    if args.json:
        print(json.dumps([c.to_dict() for c in checks], indent=2))
    else:
        sys.stdout.write(to_markdown(checks))
    return 1 if mismatches(checks) else 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _tiny_model(args: argparse.Namespace) -> int:
    from agent_replay.engines.vllm.tiny_model import make_tiny_model

    path = make_tiny_model(
        args.out, arch=args.arch, vocab=args.vocab, seed=args.seed, force=args.force
    )
    print(path)
    return 0
