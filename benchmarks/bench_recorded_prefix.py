"""Recorded prefix reuse vs the server's own: real agent programs recorded through the
proxy in front of the simulated engine (cold prefix cache), then, per client, the share of
prompt tokens the engine reported cached (``cached_tokens``, from its usage) against the
share the trace's hash ids imply (``traces.stats.implied_cached_tokens``, an unbounded
prefix cache replayed in arrival order). "before" re-hashes the same recorded prompts the
way the recorder did without a tokenizer until 2026-12-03 (4 bytes a token, fixed
256-byte blocks, the list padded with ids unique to the request up to the server's
count), so both figures come from one recording.

    .venv/bin/python benchmarks/bench_recorded_prefix.py [--clients claude,codex,opencode,mini,gemini]
        [--turns 4] [--block-size 64] [--new-sessions]

Each client gets ``--turns`` user turns in one conversation (Claude Code ``-p`` then
``--continue``; Codex ``exec`` then ``exec resume --last``; opencode ``run`` then ``run
--continue``; Gemini CLI ``-p`` then ``--resume latest``; mini-swe-agent one task with a step
limit); the engine answers each user turn with a tool call (``ls``). Needs the
programs of scripts/setup-real-clients.sh; a missing one is skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from agent_replay.engines.sim import SimServer
from agent_replay.replay.provenance import code_version
from agent_replay.replay.record import Recorder
from agent_replay.replay.record.content import fit_ids, prompt_parts, render
from agent_replay.traces.hashing import hash_bytes
from agent_replay.traces.io import read_trace
from agent_replay.traces.stats import implied_cached_tokens

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.realclients import (  # noqa: E402
    base_env,
    claude_env,
    gemini_env,
    opencode_env,
    program,
)

KEY = "sk-bench-recorded-prefix"
FRESH = False
"""--new-sessions: every turn a new session (they share the agent's tools and system
prompt, not the conversation)."""


def claude_runs(
    exe: str, url: str, model: str, home: Path, turns: int
) -> list[tuple[list[str], dict[str, str]]]:
    env = claude_env(url, model, home, KEY)
    env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
    runs = []
    for t in range(turns):
        more = ["--continue"] if t and not FRESH else []
        runs.append(
            (
                [
                    exe,
                    "-p",
                    f"Step {t}: list the files here.",
                    *more,
                    "--max-turns",
                    "3",
                    "--allowedTools",
                    "Bash(ls)",
                ],
                env,
            )
        )
    return runs


def codex_runs(
    exe: str, url: str, model: str, home: Path, turns: int
) -> list[tuple[list[str], dict[str, str]]]:
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "sim"\n\n'
        f'[model_providers.sim]\nname = "sim"\nbase_url = "{url}/v1"\n'
        'wire_api = "responses"\nenv_key = "SIM_API_KEY"\n\n[analytics]\nenabled = false\n'
    )
    env = base_env(home)
    env.update(CODEX_HOME=str(home), SIM_API_KEY=KEY)
    flags = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
    runs = []
    for t in range(turns):
        prompt = f"Step {t}: list the files here."
        argv = (
            [exe, "exec", *flags, prompt]
            if t == 0 or FRESH
            else [exe, "exec", *flags, "resume", "--last", prompt]
        )
        runs.append((argv, env))
    return runs


def mini_runs(
    exe: str, url: str, model: str, home: Path, turns: int
) -> list[tuple[list[str], dict[str, str]]]:
    env = base_env(home)
    env.update(
        MSWEA_CONFIGURED="true",
        MSWEA_GLOBAL_CONFIG_DIR=str(home),
        MSWEA_COST_TRACKING="ignore_errors",
        OPENAI_API_KEY=KEY,
        LITELLM_LOCAL_MODEL_COST_MAP="True",
    )
    return [
        (
            [
                exe,
                "-m",
                f"openai/{model}",
                "-t",
                "List the files here.",
                "-y",
                "-c",
                "mini.yaml",
                "-c",
                f"model.model_kwargs.api_base={url}/v1",
                "-c",
                f"agent.step_limit={2 * turns}",
                "-c",
                "agent.cost_limit=0",
                "-o",
                str(home / "trajectory.json"),
            ],
            env,
        )
    ]


def opencode_runs(
    exe: str, url: str, model: str, home: Path, turns: int
) -> list[tuple[list[str], dict[str, str]]]:
    env = opencode_env(url, model, home, KEY)
    return [
        (
            [
                exe,
                "run",
                *(["--continue"] if t and not FRESH else []),
                f"Step {t}: list the files here.",
            ],
            env,
        )
        for t in range(turns)
    ]


def gemini_runs(
    exe: str, url: str, model: str, home: Path, turns: int
) -> list[tuple[list[str], dict[str, str]]]:
    """Gemini CLI -p, then ``--resume latest``: each later prompt sends the earlier
    prompts' function calls without the ``thoughtSignature`` they had while they ran."""
    env = gemini_env(url, model, home, KEY)
    return [
        (
            [
                exe,
                "-p",
                f"Step {t}: list the files here.",
                "-m",
                model,
                "--yolo",
                "--skip-trust",
                *(["--resume", "latest"] if t and not FRESH else []),
            ],
            env,
        )
        for t in range(turns)
    ]


CLIENTS: dict[str, tuple[str, Any, list[str]]] = {
    "claude": ("claude", claude_runs, ['Bash={"command": "ls"}']),
    "codex": ("codex", codex_runs, ['exec_command={"cmd": "ls"}', 'shell={"command": ["ls"]}']),
    "mini": ("mini", mini_runs, ['bash={"command": "ls"}']),
    "opencode": ("opencode", opencode_runs, ['bash={"command": "ls", "description": "List"}']),
    "gemini": ("gemini", gemini_runs, ['list_directory={"dir_path": "."}']),
}


async def record(name: str, exe: str, tmp: Path, turns: int, block_size: int) -> Path:
    _, runs_of, calls = CLIENTS[name]
    trace, home, work = tmp / "trace", tmp / "home", tmp / "work"
    home.mkdir(parents=True)
    work.mkdir()
    (work / "hello.txt").write_text("hello\n")
    async with (
        SimServer("fast", seed=3, tool_call=calls) as sim,
        Recorder(
            sim.url,
            "127.0.0.1:0",
            trace,
            flush_interval_s=60,
            content="full",
            hash_seed=1,
            block_size=block_size,
        ) as rec,
    ):
        for argv, env in runs_of(exe, rec.url, sim.profile.model_name, home, turns):
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 300)
            if proc.returncode != 0:
                print(
                    f"{name}: exit {proc.returncode}: {out.decode(errors='replace')[-500:]}",
                    file=sys.stderr,
                )
    return trace


def old_render(part: Any) -> str:
    """``content.render`` as it was before 2026-12-03: every key of an item rendered."""
    return render(part, not_seen=frozenset({"role", "content"}))


def old_ids(row: dict[str, Any], block_size: int, seed: int) -> list[int]:
    """The recorder's ids without a tokenizer before 2026-12-03 (the baseline)."""
    body = orjson.loads(row["content"])
    parts = prompt_parts(row["api"], body)
    assert not hasattr(parts, "dtype"), "token-id prompts were exact before and after"
    data = "".join(old_render(p) for p in parts).encode()
    want = -(-row["input_tokens"] // block_size)
    return fit_ids(hash_bytes(data[: want * block_size * 4], block_size * 4, seed), want)


def rates(trace: Path) -> dict[str, float]:
    table, meta = read_trace(trace)
    rows = sorted(table.to_pylist(), key=lambda r: r["arrival_ns"])
    rows = [r for r in rows if r["error"] is None and r["cached_tokens"] is not None]
    bs = meta.block_size
    inputs = sum(r["input_tokens"] for r in rows)

    def implied(hash_lists: list[list[int]]) -> float:
        t = pa.table(
            {
                "arrival_ns": pa.array([r["arrival_ns"] for r in rows], pa.int64()),
                "input_tokens": pa.array([r["input_tokens"] for r in rows], pa.int32()),
                "hash_ids": pa.array(hash_lists, pa.list_(pa.int64())),
            }
        )
        return float(implied_cached_tokens(t, bs).sum()) / inputs

    return {
        "requests": len(rows),
        "sessions": len({r["session_id"] for r in rows}),
        "input_tokens": inputs,
        "server": sum(r["cached_tokens"] for r in rows) / inputs,
        "before": implied([old_ids(r, bs, 1) for r in rows]),
        "after": implied([r["hash_ids"] for r in rows]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", default="claude,codex,opencode,mini")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument(
        "--block-size", type=int, default=64, help="the trace's (the engine caches 16-token blocks)"
    )
    ap.add_argument(
        "--new-sessions",
        action="store_true",
        help="every turn a new session of the agent (mini-swe-agent: one task)",
    )
    args = ap.parse_args()
    global FRESH
    FRESH = args.new_sessions
    print(
        f"# commit {code_version()}, host {os.uname().nodename}, {os.cpu_count()} cpus, "
        f"trace block size {args.block_size}, {args.turns} turns"
        f"{', each a new session' if FRESH else ''}"
    )
    print(
        "| client | requests | sessions | input tokens | server cached | trace implies, "
        "before | after | after - server |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.clients.split(","):
        exe = program(CLIENTS[name][0])
        if exe is None:
            print(f"| {name} | not installed | | | | | | |")
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f"bench-prefix-{name}-"))
        try:
            r = rates(asyncio.run(record(name, exe, tmp, args.turns, args.block_size)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(
            f"| {name} | {r['requests']} | {r['sessions']} | {r['input_tokens']:,} | "
            f"{r['server']:.1%} | {r['before']:.1%} | {r['after']:.1%} | "
            f"{(r['after'] - r['server']) * 100:+.1f} pt |",
            flush=True,
        )


if __name__ == "__main__":
    main()
