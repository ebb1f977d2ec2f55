"""``agent-replay engines vllm-cmd | launch | tiny-model``: vLLM deployment profiles."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from traces.errors import InputError


def register(sub: Any) -> None:
    """Add ``vllm-cmd``, ``launch`` and ``tiny-model`` to the ``engines`` group, and make
    ``agent-replay run --launch`` start servers through ``launch_hook``."""
    from engines.vllm.profiles import PROFILES

    _install_launch_hook()

    names = ", ".join(PROFILES)
    p = sub.add_parser("vllm-cmd", help="print the exact vLLM commands of a deployment profile",
                       description="Print the per-node commands (env + argv) of a vLLM "
                       f"deployment profile ({names}). When vLLM is importable (this "
                       "python, --vllm-python or $AGENT_REPLAY_VLLM_PYTHON), every command "
                       "is checked with vLLM's own argument parser.")
    _deployment_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of shell lines")
    p.add_argument("--no-check", action="store_true", help="do not run vLLM's parser")
    p.set_defaults(func=_vllm_cmd)

    p = sub.add_parser("launch", help="start a local vLLM with a profile and wait until healthy",
                       description="Start a local vLLM server (one instance, one node), "
                       "wait for /health, print its URL and metadata, and stop it on Ctrl-C. "
                       "'agent-replay run --launch \"PROFILE --model M ...\"' takes the same "
                       "arguments.")
    add_launch_args(p)
    p.set_defaults(func=_launch)

    p = sub.add_parser("tiny-model", help="write a tiny model folder (tokenizer + config) "
                       "for --load-format dummy, offline")
    p.add_argument("out", help="output folder")
    p.add_argument("--arch", choices=("llama", "deepseek"), default="llama")
    p.add_argument("--vocab", type=int, default=None,
                   help="vocabulary size (default 32000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="overwrite an existing folder")
    p.set_defaults(func=_tiny_model)


def _install_launch_hook() -> None:
    try:
        import replay.run as run_module
    except ImportError:
        return
    if getattr(run_module, "LAUNCH_HOOK", None) is None:
        run_module.LAUNCH_HOOK = launch_hook


def _deployment_args(p: argparse.ArgumentParser, gpus_default: int | None = None) -> None:
    from engines.vllm.profiles import PROFILES

    p.add_argument("profile", choices=list(PROFILES), metavar="PROFILE",
                   help=", ".join(PROFILES))
    p.add_argument("--model", required=True, help="model path or hub name")
    p.add_argument("--gpus", type=int, default=gpus_default, required=gpus_default is None,
                   help="GPUs in total")
    p.add_argument("--nodes", type=int, default=1, help="nodes (GPUs split evenly)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a profile knob or a vLLM flag (repeatable); 'prefill.'/'decode.' "
                   "scopes a flag to one instance")
    p.add_argument("--vllm-python", default=None,
                   help="python of the venv that has vLLM (for checks and launch)")
    p.add_argument("--vllm-version", default=None,
                   help="adapt the commands to this vLLM version (default: the installed one)")


def add_launch_args(p: argparse.ArgumentParser) -> None:
    _deployment_args(p, gpus_default=1)
    p.add_argument("--port", type=int, default=None, help="API port (default: a free one)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health")
    p.add_argument("--log", default=None, help="server log file (default: a temporary file)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="how to start it: cpu = api_server module, gpu = vllm CLI serve")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment for the server (repeatable)")


def server_from_args(args: argparse.Namespace) -> Any:
    """A ``VllmServer`` (not started) from ``engines launch`` arguments."""
    from engines.vllm.launcher import VllmServer
    from engines.vllm.profiles import build, parse_sets

    dep = build(args.profile, model=args.model, gpus=args.gpus, nodes=args.nodes,
                sets=parse_sets(args.sets), version=args.vllm_version)
    env = dict(parse_sets(args.env))
    return VllmServer(dep, python=args.vllm_python, port=args.port, timeout_s=args.timeout,
                      log_path=args.log, device=args.device, env=env)


def launch_hook(config: Any) -> contextlib.AbstractContextManager[str]:
    """``replay.run.LAUNCH_HOOK``: start the server ``config.launch`` describes (the
    arguments of ``engines launch`` in one string), yield its URL, stop it afterwards."""
    return _launched(str(config.launch), getattr(config, "output", None))


@contextlib.contextmanager
def _launched(spec: str, output: str | None) -> Iterator[str]:
    parser = argparse.ArgumentParser(prog="--launch", exit_on_error=False, add_help=False)
    add_launch_args(parser)
    try:
        args = parser.parse_args(shlex.split(spec))
    except (argparse.ArgumentError, SystemExit) as exc:
        raise InputError(f"--launch {spec!r}: {exc} (expected: PROFILE --model M [--gpus N] "
                         "[--set K=V ...] [--vllm-python PATH] [--env K=V ...])") from None
    server = server_from_args(args)
    with server:
        print(f"agent-replay: launched vLLM {server.info.get('vllm_version')} "
              f"({args.profile}) at {server.url} in {server.info.get('start_s')} s; "
              f"log {server.log_path}", file=sys.stderr)
        try:
            yield server.url
        finally:
            if output:
                _record_launch(Path(output) / "run.json", server.info)


def _record_launch(run_json: Path, info: dict[str, Any]) -> None:
    """Add the launched server's metadata to run.json as ``launch``."""
    try:
        meta = json.loads(run_json.read_text())
    except (OSError, ValueError):
        return
    meta["launch"] = info
    tmp = run_json.with_name(f".{run_json.name}.launch.tmp")
    tmp.write_text(json.dumps(meta, indent=2, default=str))
    os.replace(tmp, run_json)


def _vllm_cmd(args: argparse.Namespace) -> int:
    from engines.vllm.argcheck import find_vllm_python
    from engines.vllm.profiles import build, parse_sets

    sets = parse_sets(args.sets)
    dep = build(args.profile, model=args.model, gpus=args.gpus, nodes=args.nodes, sets=sets,
                version=args.vllm_version)
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


def _checked(dep: Any, args: argparse.Namespace, sets: list[tuple[str, str]], python: str
             ) -> tuple[Any, str]:
    """Check ``dep`` with vLLM's parser; adapt to its version first when that changes it."""
    from engines.vllm.argcheck import require_valid
    from engines.vllm.profiles import build

    res = require_valid(dep, python)
    if args.vllm_version is None:
        adapted = build(args.profile, model=args.model, gpus=args.gpus, nodes=args.nodes,
                        sets=sets, version=res.version)
        if adapted.commands != dep.commands:
            res = require_valid(adapted, python)
        dep = adapted
    for name in res.unknown_env:
        print(f"agent-replay: warning: vLLM {res.version} does not know env {name}",
              file=sys.stderr)
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


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _tiny_model(args: argparse.Namespace) -> int:
    from engines.vllm.tiny_model import make_tiny_model

    path = make_tiny_model(args.out, arch=args.arch, vocab=args.vocab, seed=args.seed,
                           force=args.force)
    print(path)
    return 0
