"""Driving real agent programs against a local endpoint: where they are installed, the
environment and settings files each needs on a fresh HOME, and an interactive one in
tmux. Shared by the benchmarks that record real clients and by tests/realclient.

Every program talks to loopback only: HTTP(S)_PROXY points at a closed loopback port, so
anything else it tries fails fast. ``key`` is the API key the program sends (any value:
the simulated engine takes any).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".real-clients" / "bin"
"""Where scripts/setup-real-clients.sh links the programs it installs."""
NODE22 = ROOT / ".real-clients" / "node22" / "bin"
"""node >= 22 (qwen-code and the current Claude Code need it), when installed there."""


def program(name: str) -> str | None:
    """The program's path: from scripts/setup-real-clients.sh, this Python's folder (pip)
    or PATH; None when not installed."""
    for folder in (BIN, Path(sys.executable).parent):
        if (folder / name).exists():
            return str(folder / name)
    return shutil.which(name)


def base_env(home: Path) -> dict[str, str]:
    """A clean environment on ``home``, with no way off loopback."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "USER", "SHELL")
    env = {k: v for k, v in os.environ.items() if k in keep}
    closed = "http://127.0.0.1:9"  # anything not on loopback fails fast
    env.update(
        HOME=str(home),
        HTTPS_PROXY=closed,
        HTTP_PROXY=closed,
        https_proxy=closed,
        http_proxy=closed,
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    return env


async def run_program(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    timeout_s: float = 240,
    stdin: str | None = None,
) -> tuple[int, str]:
    """Run to its end (killed after ``timeout_s``, raising ``TimeoutError``): the exit
    code and what it wrote (standard output and error together)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(
            proc.communicate(None if stdin is None else stdin.encode()), timeout_s
        )
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


# -- each program's settings ------------------------------------------------------------


def claude_env(
    url: str, model: str, home: Path, key: str, max_output: int = 4000
) -> dict[str, str]:
    """Claude Code against ``url`` with every model role on the engine's model."""
    env = base_env(home)
    env.update(
        ANTHROPIC_BASE_URL=url,
        ANTHROPIC_API_KEY=key,
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_ERROR_REPORTING="1",
        ANTHROPIC_MODEL=model,
        ANTHROPIC_SMALL_FAST_MODEL=model,
        ANTHROPIC_DEFAULT_HAIKU_MODEL=model,
        ANTHROPIC_DEFAULT_SONNET_MODEL=model,
        ANTHROPIC_DEFAULT_OPUS_MODEL=model,
        CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(max_output),
    )
    return env


def claude_state(home: Path, work: Path, key: str, allowed: Sequence[str]) -> None:
    """Interactive Claude Code's state on a fresh HOME: onboarding done, the key approved,
    ``work`` trusted with ``allowed`` tools."""
    (home / ".claude.json").write_text(
        orjson.dumps(
            {
                "hasCompletedOnboarding": True,
                "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
                "projects": {
                    str(work): {"hasTrustDialogAccepted": True, "allowedTools": list(allowed)}
                },
            }
        ).decode()
    )


def manual_permissions(exe: str) -> list[str]:
    """The current Claude Code starts interactive sessions in "auto" permission mode,
    whose safety check runs on Anthropic's servers: through a proxy it cannot, and every
    tool call waits for the user's approval (the session stops at its first tool call).
    "manual" mode asks only for tools not allowed by ``--allowedTools``. Releases without
    "manual" (2.1.197) start in their "default" mode, which is that."""
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60).stdout
    return ["--permission-mode", "manual"] if '"manual"' in out else []


def codex_env(url: str, model: str, home: Path, key: str) -> dict[str, str]:
    """Codex CLI: a ``[model_providers]`` entry on the Responses API in ``home`` (its
    CODEX_HOME), its key from the environment."""
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "sim"\n\n'
        f'[model_providers.sim]\nname = "sim"\nbase_url = "{url}/v1"\n'
        'wire_api = "responses"\nenv_key = "SIM_API_KEY"\n\n[analytics]\nenabled = false\n'
    )
    env = base_env(home)
    env.update(CODEX_HOME=str(home), SIM_API_KEY=key)
    return env


CODEX_FLAGS = ("--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox")


def opencode_env(url: str, model: str, home: Path, key: str) -> dict[str, str]:
    """opencode: a provider on the OpenAI-compatible SDK in its config file."""
    conf = home / ".config" / "opencode"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "opencode.json").write_text(
        orjson.dumps(
            {
                "provider": {
                    "sim": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "sim",
                        "options": {"baseURL": f"{url}/v1", "apiKey": key},
                        "models": {
                            model: {"name": model, "limit": {"context": 32768, "output": 4000}}
                        },
                    }
                },
                "model": f"sim/{model}",
                "share": "disabled",
                "autoupdate": False,
            }
        ).decode()
    )
    return base_env(home)


def qwen_env(url: str, model: str, home: Path, key: str) -> dict[str, str]:
    """qwen-code: the OpenAI variables, the openai auth type and a max_tokens that fits
    the engine's context (it asks for 32000 otherwise); node >= 22 first on PATH."""
    conf = home / ".qwen"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "settings.json").write_text(
        orjson.dumps(
            {
                "security": {"auth": {"selectedType": "openai"}},
                "model": {"generationConfig": {"samplingParams": {"max_tokens": 4000}}},
            }
        ).decode()
    )
    env = base_env(home)
    if NODE22.is_dir():
        env["PATH"] = f"{NODE22}:{env.get('PATH', '')}"
    env.update(
        OPENAI_BASE_URL=f"{url}/v1",
        OPENAI_API_KEY=key,
        OPENAI_MODEL=model,
        QWEN_CODE_SUPPRESS_YOLO_WARNING="1",
    )
    return env


def gemini_env(url: str, model: str, home: Path, key: str) -> dict[str, str]:
    """Gemini CLI on a fresh HOME, as the README's recipe writes it: the API-key auth
    chosen in its settings (with only the base-URL variable it picks a gateway auth it
    then refuses: "Invalid auth method selected"), the model, no usage statistics; the
    key and the base URL. Run it with ``--skip-trust`` (a fresh folder is not trusted)."""
    conf = home / ".gemini"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "settings.json").write_text(
        orjson.dumps(
            {
                "security": {"auth": {"selectedType": "gemini-api-key"}},
                "model": {"name": model},
                "privacy": {"usageStatisticsEnabled": False},
            }
        ).decode()
    )
    env = base_env(home)
    env.update(GEMINI_API_KEY=key, GOOGLE_GEMINI_BASE_URL=url)
    return env


def aider_env(url: str, home: Path, key: str) -> dict[str, str]:
    """aider (through litellm): the OpenAI variables; the model is ``openai/MODEL``."""
    env = base_env(home)
    env.update(OPENAI_API_BASE=f"{url}/v1", OPENAI_API_KEY=key, LITELLM_LOCAL_MODEL_COST_MAP="True")
    return env


AIDER_FLAGS = (
    "--no-git",
    "--yes-always",
    "--no-check-update",
    "--no-show-model-warnings",
    "--analytics-disable",
    "--no-fancy-input",
    "--no-pretty",
    "--no-show-release-notes",
)
"""aider reading plain prompts on its standard input, asking nothing, sending nothing
but its requests."""


# -- interactive programs in tmux -------------------------------------------------------


def env_script(path: Path, env: Mapping[str, str], command: str) -> Path:
    """A shell script that runs ``command`` in exactly ``env`` (tmux starts programs in
    its own environment)."""
    path.write_text(
        "#!/bin/sh\nexec env -i " + " ".join(f"{k}='{v}'" for k, v in env.items()) + f" {command}\n"
    )
    path.chmod(0o755)
    return path


class Tmux:
    """A program in a detached tmux session of its own (150 x 40)."""

    def __init__(self, name: str) -> None:
        tmux = shutil.which("tmux")
        if tmux is None:
            raise FileNotFoundError("tmux not installed")
        self.tmux = tmux
        self.name = name

    def start(self, script: Path, cwd: Path) -> None:
        subprocess.run(
            [self.tmux, "new-session", "-d", "-s", self.name, "-x", "150", "-y", "40"]
            + ["-c", str(cwd), str(script)],
            check=True,
        )

    def screen(self) -> str:
        return subprocess.run(
            [self.tmux, "capture-pane", "-p", "-t", self.name], capture_output=True, text=True
        ).stdout

    async def type_in(self, text: str, enter_apart: bool = False) -> None:
        """``text`` and Enter; ``enter_apart``: Enter a second later (Gemini CLI and
        qwen-code take text and Enter that come at once for a paste, the Enter a new
        line)."""
        if enter_apart:
            subprocess.run([self.tmux, "send-keys", "-t", self.name, text], check=True)
            await asyncio.sleep(1)
            subprocess.run([self.tmux, "send-keys", "-t", self.name, "Enter"], check=True)
        else:
            subprocess.run([self.tmux, "send-keys", "-t", self.name, text, "Enter"], check=True)

    def alive(self) -> bool:
        """The session is there (its program has not ended)."""
        return (
            subprocess.run(
                [self.tmux, "has-session", "-t", self.name], stderr=subprocess.DEVNULL
            ).returncode
            == 0
        )

    async def ended(self, limit_s: float = 15) -> bool:
        """Wait up to ``limit_s`` for the program to end by itself (it may still be
        writing its state after it was told to quit)."""
        for _ in range(int(limit_s * 10)):
            if not self.alive():
                return True
            await asyncio.sleep(0.1)
        return False

    def kill(self) -> None:
        """End the session (gone already when the program quit)."""
        subprocess.run(
            [self.tmux, "kill-session", "-t", self.name], check=False, stderr=subprocess.DEVNULL
        )
