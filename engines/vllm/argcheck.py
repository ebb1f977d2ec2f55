"""Check ``vllm serve`` arguments with vLLM's own argument parser.

The parser lives in whatever Python has vLLM installed: this interpreter, or another venv's
(``--vllm-python``). We run a small probe program there (it imports only vLLM), send it
every command's arguments at once as JSON on stdin, and read one JSON line back. Building
vLLM's parser takes several seconds, so one probe checks a whole deployment.

A flag the installed vLLM does not know, a bad value for a flag with choices, or an unknown
key in ``--speculative-config`` becomes an ``InputError`` that names the vLLM version.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from agent_replay.engines.vllm.profiles import Command, Deployment
from agent_replay.errors import InputError, LaunchError

_MARK = "@@agent-replay-vllm-probe@@"

# Runs inside the vLLM interpreter: standard library + vLLM only.
PROBE = (
    r'''
import contextlib, dataclasses, io, json, sys
request = json.loads(sys.stdin.read())
out = {"version": None, "results": [], "unknown_env": []}
try:
    import vllm
    out["version"] = vllm.__version__
    from vllm import platforms
    if platforms.current_platform.is_unspecified():
        # No accelerator here: the parser itself does not depend on one.
        from vllm.platforms.cpu import CpuPlatform
        platforms.current_platform = CpuPlatform()
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    import vllm.entrypoints.cli.serve as serve
    parser = FlexibleArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="subparser")
    serve_cmd = serve.cmd_init()[0]
    serve_cmd.subparser_init(sub)
    spec_fields = None
    try:
        from vllm.config import SpeculativeConfig
        spec_fields = set(getattr(SpeculativeConfig, "__dataclass_fields__", {}))
    except Exception:
        pass
    for argv in request.get("argvs", []):
        err = io.StringIO()
        res = {"ok": True, "error": None}
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(["serve", *argv])
                serve_cmd.validate(ns)
            sc = getattr(ns, "speculative_config", None)
            if spec_fields and isinstance(sc, dict):
                bad = sorted(set(sc) - spec_fields)
                if bad:
                    res = {"ok": False, "error": "--speculative-config: unknown key(s) "
                           + ", ".join(bad)}
        except SystemExit:
            lines = [l for l in err.getvalue().splitlines() if l.strip()]
            res = {"ok": False, "error": lines[-1] if lines else "rejected by the parser"}
        except Exception as exc:
            res = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        out["results"].append(res)
    try:
        import vllm.envs as envs
        known = set(envs.environment_variables)
        out["unknown_env"] = sorted(n for n in request.get("env", [])
                                    if n.startswith("VLLM_") and n not in known)
    except Exception:
        pass
except Exception as exc:
    out["fatal"] = f"{type(exc).__name__}: {exc}"
print("'''
    + _MARK
    + r"""" + json.dumps(out), flush=True)
"""
)


@dataclass(frozen=True, slots=True)
class CheckResult:
    version: str
    errors: tuple[tuple[str, str], ...]  # (command name, parser message)
    unknown_env: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.errors


def find_vllm_python(explicit: str | None = None) -> str | None:
    """The interpreter to ask: ``explicit``, else $AGENT_REPLAY_VLLM_PYTHON, else this one
    when it can import vllm; ``None`` when there is none."""
    if explicit:
        return explicit
    env = os.environ.get("AGENT_REPLAY_VLLM_PYTHON")
    if env:
        return env
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def vllm_python_available(python: str | None = None) -> bool:
    """True when ``python`` (default: this interpreter) can import vllm (cheap: find_spec)."""
    exe = python or sys.executable
    try:
        proc = subprocess.run(
            [
                exe,
                "-c",
                "import importlib.util,sys;sys.exit(0 if importlib.util.find_spec('vllm') else 1)",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def run_probe(
    python: str,
    argvs: Sequence[Sequence[str]],
    env_names: Sequence[str] = (),
    timeout_s: float = 300.0,
) -> dict[str, object]:
    payload = json.dumps({"argvs": [list(a) for a in argvs], "env": list(env_names)})
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run(
            [python, "-c", PROBE],
            input=payload,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except FileNotFoundError:
        raise InputError(f"--vllm-python {python}: no such interpreter") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(
            f"{python}: vLLM's argument parser did not answer in {timeout_s:.0f} s"
        ) from None
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            result: dict[str, object] = json.loads(line[len(_MARK) :])
            if result.get("fatal"):
                raise InputError(
                    f"{python}: cannot build vLLM's argument parser: {result['fatal']}"
                )
            return result
    tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-5:])
    raise InputError(f"{python}: vLLM argument probe failed (exit {proc.returncode}): {tail}")


def check_deployment(deployment: Deployment, python: str | None = None) -> CheckResult:
    """Parse every ``vllm serve`` command of ``deployment`` with vLLM's parser."""
    serve = [c for c in deployment.commands if c.is_vllm_serve]
    env_names = sorted({k for c in serve for k, _ in c.env})
    return _check_result(
        serve, run_probe(python or sys.executable, [c.serve_args for c in serve], env_names)
    )


def _check_result(serve: list[Command], res: dict[str, object]) -> CheckResult:
    """The probe's answer for the ``serve`` commands: those its parser rejected, with the
    error, and the environment variables vLLM does not know."""
    results = res.get("results")
    assert isinstance(results, list)
    errors = tuple(
        (c.name, str(r.get("error")))
        for c, r in zip(serve, results, strict=True)
        if not r.get("ok")
    )
    unknown = res.get("unknown_env") or []
    assert isinstance(unknown, list)
    return CheckResult(
        version=str(res.get("version")), errors=errors, unknown_env=tuple(str(u) for u in unknown)
    )


def probe_version(python: str) -> str:
    """vLLM's version in ``python``, without building the parser."""
    res = run_probe(python, [])
    return str(res.get("version"))


def require_valid(deployment: Deployment, python: str | None = None) -> CheckResult:
    """Like ``check_deployment``; raises ``InputError`` naming the version on any error."""
    res = check_deployment(deployment, python)
    if not res.ok:
        lines = "; ".join(f"{name}: {msg}" for name, msg in res.errors)
        raise InputError(f"vLLM {res.version} rejects the {deployment.profile} command(s): {lines}")
    return res
