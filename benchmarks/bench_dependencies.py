"""The dependencies real agent programs have, found by delaying their requests, against
the trace's ``depends_on``.

Each client runs one session several times through the recorder in front of the simulated
engine, with a small hop between the two (``DelayHop``). The first run is the baseline;
each later run holds back one chosen request of it by ``--delay`` seconds before the hop
forwards it. A request depends on X (directly or through others) iff its arrival moved by
at least half the delay when X was held back: the client waited for X's answer before
sending it. The trace of the baseline says the same through ``depends_on`` (spawns and
joins included), closed transitively: the replay holds a request until all of those have
ended. Per client the table gives

    requests    the baseline's requests (those found again in every run)
    true deps   direct edges of the measured relation (its transitive reduction)
    trace deps  ``depends_on`` edges of the baseline trace
    false       pairs (Y, X) the trace makes Y wait for that Y did not wait for
    missing     pairs (Y, X) Y waited for that the trace does not make it wait for
    sessions    sessions of the baseline trace
    server      prompt tokens the engine reported cached, of the baseline's input
    trace       those the baseline trace's hash ids imply (as ``traces inspect`` says)

Requests are matched across runs by ``request_label``: the API, the tools offered, the
length of the conversation and the order among requests alike in those (the clients run
in the same folders each time and the engine answers alike, so a run repeats the last).

    .venv/bin/python benchmarks/bench_dependencies.py [--clients claude,claude-agent,...]
        [--delay 8] [--repeats 1] [--keep DIR]

Each request is held back in ``--repeats`` runs; a dependency must show in every one. On
a loaded host a client may take seconds more between two requests in one run: the delay
must be well above that (on 2 shared cores, 8 s: 3 s was not). Needs the programs of
scripts/setup-real-clients.sh; a missing one is skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from agent_replay.engines.apis import dialect
from agent_replay.engines.sim import SimServer
from agent_replay.replay.record import Recorder
from agent_replay.replay.record.content import conversation
from agent_replay.replay.record.wire import api_for, end_to_end_headers
from agent_replay.traces.io import read_trace
from agent_replay.traces.summary import summarize_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import realclients
from benchmarks.realclients import (
    AIDER_FLAGS,
    CODEX_FLAGS,
    ROOT,
    Tmux,
    aider_env,
    base_env,
    claude_env,
    claude_state,
    codex_env,
    env_script,
    gemini_env,
    manual_permissions,
    opencode_env,
    program,
    qwen_env,
)

KEY = "sk-bench-dependencies"
BLOCK_SIZE = [64]
"""The trace's block size (``--block-size``)."""

# -- matching requests across runs ------------------------------------------------------


def _tool_names(tools: Any) -> list[str]:
    out = []
    for t in tools if isinstance(tools, list) else ():
        if isinstance(t, dict) and isinstance(t.get("functionDeclarations"), list):
            out += _tool_names(t["functionDeclarations"])  # Gemini's group of functions
        elif isinstance(t, dict):
            fn = t.get("function")
            name = fn.get("name") if isinstance(fn, dict) else t.get("name")
            out.append(str(name))
    return sorted(out)


def request_kind(api: str, body: Mapping[str, Any]) -> str:
    """What a request looks like, apart from text that may differ between runs: its API,
    a digest of the tools it offers and its conversation's length."""
    tools = hashlib.blake2b(
        orjson.dumps(_tool_names(dialect(api).tools(body))), digest_size=3
    ).hexdigest()
    return f"{api}:{tools}:{len(conversation(api, body))}"


class Labeler:
    """Labels requests in arrival order: their kind and the count of that kind so far."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def __call__(self, kind: str) -> str:
        n = self._seen.get(kind, 0)
        self._seen[kind] = n + 1
        return f"{kind}#{n}"


def label_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The rows of a trace recorded with ``content="full"``, by label."""
    lab = Labeler()
    out = {}
    for r in sorted(rows, key=lambda r: r["arrival_ns"]):
        body = orjson.loads(r["content"]) if r["content"] else {}
        out[lab(request_kind(r["api"], body))] = r
    return out


# -- the oracle -------------------------------------------------------------------------


def measured_ancestors(
    base: Mapping[str, int],
    delayed: Mapping[str, Sequence[Mapping[str, int]]],
    delay_ns: int,
    answered: Mapping[str, Sequence[int | None]] | None = None,
) -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """``base``: label -> arrival in the baseline; ``delayed``: X -> the runs that held X
    back (label -> arrival); ``answered``: X -> when X's answer began in each of those
    runs (None: not known). Y waited for X iff every run that can tell (``run_verdicts``)
    says so, and one can. Also the pairs (Y, X) with no verdict: X was not sent again, no
    run that held X back sent Y (the client ended first), or none could tell."""
    out: dict[str, set[str]] = {y: set() for y in base}
    unknown = {(y, x) for x in base for y in base if x != y and not delayed.get(x)}
    for x, runs in delayed.items():
        if not runs:
            continue
        said: dict[str, list[bool | None]] = {}
        for i, run in enumerate(runs):
            ans = answered.get(x) if answered else None
            verdicts = run_verdicts(base, run, x, delay_ns, ans[i] if ans else None)
            for y, v in verdicts.items():
                said.setdefault(y, []).append(v)
        for y in base:
            if y == x:
                continue
            told = [v for v in said.get(y, ()) if v is not None]
            if not told:
                unknown.add((y, x))
            elif all(told):
                out[y].add(x)
    return out, unknown


def run_verdicts(
    base: Mapping[str, int],
    run: Mapping[str, int],
    x: str,
    delay_ns: int,
    answered: int | None = None,
) -> dict[str, bool | None]:
    """What one run that held X back says of each request Y it sent: True (Y waited for
    X), False (it did not) or None (the run cannot tell).

    Y waited when it arrived at least ``delay_ns / 2`` later both on the run's clock
    (``run_shift`` aside) and counted from X's own arrival: a client slowed by the host
    between its requests fools one, seldom both. Y sent before X in the baseline did not
    wait for X's answer. Nor did Y sent before X's answer began in this run
    (``answered``, on the run's clock), however late a slow host made it. Y that did not
    move but was sent after X's answer began may have waited for X off the critical path
    (something else held it longer than X was held): the run cannot tell (None); a run
    holding X longer (``longer_holds``) can. Without ``answered`` such a Y counts as not
    waiting."""
    shift = run_shift(base, run, x)
    out: dict[str, bool | None] = {}
    for y, t in run.items():
        if y == x or y not in base:
            continue
        late = min(t - shift - base[y], (t - run[x]) - (base[y] - base[x]))
        if base[y] <= base[x] or (answered is not None and t < answered):
            out[y] = False
        elif late >= delay_ns // 2:
            out[y] = True
        elif answered is not None and t >= answered:
            out[y] = None
        else:
            out[y] = False
    return out


def longer_holds(
    base: Mapping[str, int],
    delayed: Mapping[str, Sequence[Mapping[str, int]]],
    answered: Mapping[str, Sequence[int | None]],
    delay_ns: int,
) -> dict[str, int]:
    """X -> how long to hold X back in a run that tells what the runs so far could not:
    for each Y no run could tell about (sent ``gap`` after X's answer began, not moved),
    a hold of 2 * ``delay_ns`` + the largest such gap. Then a Y that waited for X comes
    at least ``delay_ns`` later than it did, and one that did not comes before X's answer
    begins."""
    out: dict[str, int] = {}
    for x, runs in delayed.items():
        gaps = []
        said: dict[str, list[bool | None]] = {}
        for i, run in enumerate(runs):
            ans = answered.get(x, [None] * len(runs))[i]
            for y, v in run_verdicts(base, run, x, delay_ns, ans).items():
                said.setdefault(y, []).append(v)
                if v is None and ans is not None:
                    gaps.append(run[y] - ans)
        if gaps and any(all(v is None for v in vs) for vs in said.values()):
            out[x] = 2 * delay_ns + max(gaps)
    return out


def run_shift(base: Mapping[str, int], run: Mapping[str, int], x: str) -> int:
    """How much later a run's clock reads than the baseline's at X: the shift of the
    request that arrived last before X in the baseline (it cannot have waited for X's
    answer), 0 when there is none. Arrivals count from a run's first request, and a
    client's start is not the same each time (one sent 1.5 s after the first on a loaded
    host moves everything after it); nor is its pace (a baseline slowed by the host
    between its requests reads seconds later by X's time than a run that was not, and
    the request nearest X tells the run's clock there best)."""
    before = [y for y in base if y != x and y in run and base[y] < base[x]]
    if not before:
        return 0
    y = max(before, key=lambda y: base[y])
    return run[y] - base[y]


def trace_ancestors(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, set[str]]:
    """What the trace makes each request wait for: ``depends_on`` closed transitively
    (within its session)."""
    by_key = {(r["session_id"], r["request_index"]): lab for lab, r in rows.items()}
    direct = {
        lab: {
            by_key[(r["session_id"], d)]
            for d in (r["depends_on"] or ())
            if (r["session_id"], d) in by_key
        }
        for lab, r in rows.items()
    }
    return {lab: closure(lab, direct) for lab in rows}


def closure(node: str, direct: Mapping[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = list(direct.get(node, ()))
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(direct.get(n, ()))
    return seen


def reduction(anc: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The direct edges of a transitive relation: X is a direct dependency of Y unless
    some other ancestor of Y has X as its own."""
    return {
        y: {x for x in xs if not any(x in anc.get(z, ()) for z in xs if z != x)}
        for y, xs in anc.items()
    }


@dataclass
class Verdict:
    requests: int
    true_deps: int
    trace_deps: int
    false: list[tuple[str, str]] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)
    unknown: int = 0
    """Pairs the trace makes wait with no verdict (see ``measured_ancestors``)."""


def compare(
    measured: Mapping[str, set[str]],
    traced: Mapping[str, set[str]],
    trace_direct: int,
    unknown: Collection[tuple[str, str]] = (),
) -> Verdict:
    """False and missing pairs, leaving out those with no verdict (``unknown``)."""
    keys = [y for y in measured if y in traced]
    v = Verdict(
        len(keys),
        sum(len(s) for s in reduction({y: measured[y] & set(keys) for y in keys}).values()),
        trace_direct,
    )
    for y in keys:
        m = measured[y] & set(keys)
        t = traced[y] & set(keys)
        v.false += [(y, x) for x in sorted(t - m) if (y, x) not in unknown]
        v.missing += [(y, x) for x in sorted(m - t)]
    v.unknown = sum(1 for y, x in unknown if x in traced.get(y, ()) or x in measured.get(y, ()))
    return v


# -- the hop ----------------------------------------------------------------------------


SUGGESTION = "[SUGGESTION MODE:"
"""How interactive qwen-code opens the request it sends after each answer for the next
prompt it shows the user greyed out: not an answer the user waits for."""


def suggestion(api: str, body: Mapping[str, Any]) -> bool:
    """The request is qwen-code's prompt suggestion (``SUGGESTION``)."""
    conv = conversation(api, body)
    last = conv[-1] if conv else None
    content = last.get("content") if isinstance(last, dict) else None
    if isinstance(content, list):
        content = " ".join(b.get("text", "") for b in content if isinstance(b, dict))
    return isinstance(content, str) and content.lstrip().startswith(SUGGESTION)


class DelayHop:
    """A proxy that forwards to ``upstream``, holding the request labelled ``target``
    back by ``delay_s`` before it goes on."""

    def __init__(self, upstream: str, target: str | None, delay_s: float) -> None:
        self.upstream = upstream.rstrip("/")
        self.target = target
        self.delay_s = delay_s
        self.hit = False
        self.labels: list[str] = []
        self.busy = 0
        """Requests offering tools (the agents' turns, not titles or suggestions) in
        flight."""
        self.changed = 0.0
        """When the last request arrived or the last turn (not a title) ended (loop time)."""
        self._label = Labeler()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def __aenter__(self) -> DelayHop:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        self.changed = loop.time()
        turn: list[bool] = []
        try:
            return await self._forward(request, turn)
        finally:
            if turn:  # a title's answer is no reason for the user to wait
                self.changed = loop.time()
                self.busy -= 1

    async def _forward(self, request: web.Request, turn: list[bool]) -> web.StreamResponse:
        raw = await request.read()
        api = api_for(request.method, request.path)
        if api is not None and not request.headers.get("content-encoding"):
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                body = None
            if isinstance(body, dict):
                label = self._label(request_kind(api, body))
                self.labels.append(label)
                if dialect(api).tools(body) and not suggestion(api, body):
                    turn.append(True)
                    self.busy += 1
                if label == self.target:
                    self.hit = True
                    await asyncio.sleep(self.delay_s)
        if self._session is None or self._session.closed:
            return web.Response(status=503, text="the hop is closing")
        drop = frozenset({"host", "content-length"})
        async with self._session.request(
            request.method,
            self.upstream + request.path_qs,
            data=raw,
            headers=end_to_end_headers(request.headers, drop),
        ) as up:
            resp = web.StreamResponse(
                status=up.status,
                headers=end_to_end_headers(up.headers, frozenset({"content-length"})),
            )
            await resp.prepare(request)
            try:
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
            except (ConnectionError, aiohttp.ClientError):
                pass  # the client left (it ended with a request still streaming)
            return resp


# -- clients ----------------------------------------------------------------------------


LS = 'Bash={"command": "ls"}'
AGENT = (
    'Agent={"description": "List files", "prompt": "List the files here.", '
    '"subagent_type": "general-purpose"}'
)
GEMINI_LS = 'list_directory={"dir_path": "."}'
GEMINI_AGENT = 'invoke_agent={"agent_name": "generalist", "prompt": "List the files here."}'
GEMINI_DONE = 'complete_task={"result": {"response": "hello.txt"}}'
"""A Gemini CLI subagent's answer: done at once (the tools are offered in this order)."""
Run = Callable[[str, str, Path, Path], Any]
"""(recorder url, model, home, work) -> an awaitable that runs the client's session."""


async def run_program(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    timeout_s: float = 240,
    stdin: str | None = None,
) -> None:
    """Run the program; a failure is noted on standard error (the oracle judges what
    it sent)."""
    rc, out = await realclients.run_program(argv, env, cwd, timeout_s, stdin)
    if rc != 0:
        print(f"  exit {rc}: {out[-400:]}", file=sys.stderr)


def claude_p(exe: str, *tools: str) -> Run:
    async def run(url: str, model: str, home: Path, work: Path) -> None:
        await run_program(
            [
                exe,
                "-p",
                "List the files here.",
                "--max-turns",
                "3",
                "--allowedTools",
                "Bash(ls)",
                *tools,
            ],
            claude_env(url, model, home, KEY),
            work,
        )

    return run


def claude_interactive(exe: str, prompts: Sequence[str], settle_s: float = 10.0) -> Run:
    """Interactive Claude Code in tmux: each prompt typed once the previous turn has gone
    quiet for ``settle_s``."""

    async def run(url: str, model: str, home: Path, work: Path) -> None:
        claude_state(home, work, KEY, ["Bash(ls)"])
        env = claude_env(url, model, home, KEY)
        env["TERM"] = "xterm-256color"
        script = env_script(
            home / "claude.sh",
            env,
            f"{exe} {' '.join(manual_permissions(exe))} --allowedTools 'Bash(ls)' Agent",
        )
        await _in_tmux(script, work, prompts, "/exit", settle_s)

    return run


async def _in_tmux(
    script: Path,
    work: Path,
    prompts: Sequence[str],
    leave: str,
    settle_s: float,
    enter_apart: bool = False,
    ready: str | None = None,
) -> None:
    """Run ``script`` in tmux and type each prompt once the previous turn has gone quiet
    (``_quiet``), then ``leave``. ``enter_apart``: see ``Tmux.type_in``; ``ready``: the
    first prompt waits until the screen shows this (at most 60 s; without it, 5 s)."""
    tmux = Tmux(f"bench-deps-{os.getpid()}")
    tmux.start(script, work)
    try:
        for _ in range(600 if ready else 50):
            await asyncio.sleep(0.1)
            if ready and ready in tmux.screen():
                await asyncio.sleep(1)  # the input box takes keys a moment after it shows
                break
        for text in prompts:
            await tmux.type_in(text, enter_apart)
            await _quiet(settle_s)
        await tmux.type_in(leave, enter_apart)
        await tmux.ended()  # its last writes to HOME are done before the next run
    finally:
        tmux.kill()


_QUIET: dict[str, Any] = {}


async def _quiet(settle_s: float) -> None:
    """Wait, as a user reading the agent's answer would, until no turn of the agent (a
    request offering tools: not a title) is in flight and nothing arrived or ended for
    ``settle_s`` (at most 120 s)."""
    hop: DelayHop = _QUIET["hop"]
    loop = asyncio.get_running_loop()
    for _ in range(1200):
        await asyncio.sleep(0.1)
        if hop.labels and hop.busy == 0 and loop.time() - hop.changed >= settle_s:
            return


def codex_exec(exe: str, prompt: str, *more: str) -> Run:
    """``codex exec`` on ``prompt``, then ``codex exec resume --last`` on each of ``more``
    (a session continued by later runs of the program)."""

    async def run(url: str, model: str, home: Path, work: Path) -> None:
        env = codex_env(url, model, home, KEY)
        await run_program([exe, "exec", *CODEX_FLAGS, prompt], env, work)
        for text in more:
            await run_program([exe, "exec", "resume", "--last", *CODEX_FLAGS, text], env, work)

    return run


def opencode_run(exe: str, *more: str) -> Run:
    """``opencode run``, then ``opencode run --continue`` on each of ``more``."""

    async def run(url: str, model: str, home: Path, work: Path) -> None:
        env = opencode_env(url, model, home, KEY)
        await run_program([exe, "run", "List the files here."], env, work)
        for text in more:
            await run_program([exe, "run", "--continue", text], env, work)

    return run


def mini_run(exe: str, task: str = "List the files here.", steps: int = 3) -> Run:
    async def run(url: str, model: str, home: Path, work: Path) -> None:
        env = base_env(home)
        env.update(
            MSWEA_CONFIGURED="true",
            MSWEA_GLOBAL_CONFIG_DIR=str(home),
            MSWEA_COST_TRACKING="ignore_errors",
            OPENAI_API_KEY=KEY,
            LITELLM_LOCAL_MODEL_COST_MAP="True",
        )
        await run_program(
            [
                exe,
                "-m",
                f"openai/{model}",
                "-t",
                task,
                "-y",
                "-c",
                "mini.yaml",
                "-c",
                f"model.model_kwargs.api_base={url}/v1",
                "-c",
                f"agent.step_limit={steps}",
                "-c",
                "agent.cost_limit=0",
                "-o",
                str(home / "trajectory.json"),
            ],
            env,
            work,
        )

    return run


def qwen_run(exe: str) -> Run:
    """qwen-code -p."""

    async def run(url: str, model: str, home: Path, work: Path) -> None:
        await run_program(
            [exe, "-p", "List the files here.", "--yolo"], qwen_env(url, model, home, KEY), work
        )

    return run


def qwen_interactive(exe: str, prompts: Sequence[str], settle_s: float = 10.0) -> Run:
    """Interactive qwen-code in tmux: each prompt typed once the previous turn has gone
    quiet for ``settle_s``."""

    async def run(url: str, model: str, home: Path, work: Path) -> None:
        env = qwen_env(url, model, home, KEY)
        env["TERM"] = "xterm-256color"
        script = env_script(home / "qwen.sh", env, f"{exe} --yolo")
        await _in_tmux(
            script, work, prompts, "/quit", settle_s, enter_apart=True, ready="Type your message"
        )

    return run


def gemini_interactive(exe: str, prompts: Sequence[str], settle_s: float = 10.0) -> Run:
    """Interactive Gemini CLI in tmux: each prompt typed once the previous turn has gone
    quiet for ``settle_s``."""

    async def run(url: str, model: str, home: Path, work: Path) -> None:
        env = gemini_env(url, model, home, KEY)
        env["TERM"] = "xterm-256color"
        script = env_script(home / "gemini.sh", env, f"{exe} -m {model} --yolo --skip-trust")
        await _in_tmux(
            script, work, prompts, "/quit", settle_s, enter_apart=True, ready="Type your message"
        )

    return run


def gemini_run(exe: str, prompt: str) -> Run:
    """Gemini CLI -p (``--skip-trust``: a fresh folder is not trusted otherwise)."""

    async def run(url: str, model: str, home: Path, work: Path) -> None:
        await run_program(
            [exe, "-p", prompt, "-m", model, "--yolo", "--skip-trust"],
            gemini_env(url, model, home, KEY),
            work,
        )

    return run


def aider_run(
    exe: str, prompts: Sequence[str], files: Sequence[str] = (), git: bool = False
) -> Run:
    """aider, one run answering ``prompts`` read from standard input one after the other
    (plain input), on the OpenAI variables. ``files``: files of this repository copied
    into the work folder and added to the chat (their text is in every prompt, as in a
    real session); ``git``: the folder is a git repository with them committed (aider
    then sends its map of the repository too)."""

    async def run(url: str, model: str, home: Path, work: Path) -> None:
        env = aider_env(url, home, KEY)
        names = []
        for f in files:
            dst = work / Path(f).name
            shutil.copyfile(ROOT / f, dst)
            names.append(dst.name)
        flags = list(AIDER_FLAGS)
        if git:
            flags.remove("--no-git")
            for argv in (
                ["git", "init", "-q"],
                ["git", "add", "."],
                ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "start"],
            ):
                subprocess.run(argv, cwd=work, check=True, env=env)
            flags.append("--no-auto-commits")
        await run_program(
            [exe, *flags, "--model", f"openai/{model}", *names],
            env,
            work,
            stdin="".join(f"{p}\n" for p in prompts),
        )

    return run


AIDER_FILES = ("replay/record/sessions.py", "replay/record/spawns.py")
"""Real source files for aider's chat: prompts of the length real aider sessions send."""
WEATHER = 'get_weather={"city": "Paris"}'


AGENTS_SDK = """
import asyncio, sys
import agents
from openai import AsyncOpenAI
agents.set_tracing_disabled(True)

@agents.function_tool
def get_weather(city: str) -> str:
    \"\"\"The weather in a city.\"\"\"
    return f"Sunny in {city}."

async def main():
    client = AsyncOpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[3], max_retries=0)
    model = agents.OpenAIChatCompletionsModel(model=sys.argv[2], openai_client=client)
    kind = sys.argv[4]
    if kind == "handoff":
        maths = agents.Agent(name="Math agent", instructions="You answer maths.", model=model)
        triage = agents.Agent(name="Triage", instructions="You route questions.",
                              handoffs=[maths], model=model)
        await agents.Runner.run(triage, "What is 2+2?")
    else:
        agent = agents.Agent(name="Weather", instructions="You tell the weather.",
                             tools=[get_weather], model=model)
        result = await agents.Runner.run(agent, "Weather in Paris?")
        if kind == "chat":  # a second user turn on the conversation so far
            await agents.Runner.run(
                agent, result.to_input_list() + [{"role": "user", "content": "And Rome?"}]
            )
    await client.close()
asyncio.run(main())
"""


def agents_sdk_run(kind: str = "handoff") -> Run:
    """The OpenAI Agents SDK: ``handoff`` (triage hands off to a maths agent), ``tool``
    (one function tool called, then the answer) or ``chat`` (``tool``, then a second
    user turn on the conversation so far)."""

    async def run(url: str, model: str, home: Path, work: Path) -> None:
        await run_program(
            [sys.executable, "-c", AGENTS_SDK, url, model, KEY, kind], base_env(home), work
        )

    return run


@dataclass
class Client:
    exe: str | None
    tool_calls: list[str]
    make: Callable[[str], Run]


def clients() -> dict[str, Client]:
    codex_ls = 'exec_command={"cmd": "ls"}'
    return {
        "claude": Client(program("claude"), [LS], lambda e: claude_p(e)),
        "claude-agent": Client(program("claude"), [AGENT, LS], lambda e: claude_p(e, "Agent")),
        "claude-interactive": Client(
            program("claude"),
            [AGENT, LS],
            lambda e: claude_interactive(e, ["List the files here.", "List them again."]),
        ),
        "claude-2.1.197": Client(program("claude-2.1.197"), [LS], lambda e: claude_p(e)),
        "claude-2.1.197-agent": Client(
            program("claude-2.1.197"), [AGENT, LS], lambda e: claude_p(e, "Agent")
        ),
        "claude-2.1.197-interactive": Client(
            program("claude-2.1.197"),
            [AGENT, LS],
            lambda e: claude_interactive(e, ["List the files here.", "List them again."]),
        ),
        "codex": Client(
            program("codex"), [codex_ls], lambda e: codex_exec(e, "List the files here.")
        ),
        "codex-resume": Client(
            program("codex"),
            [codex_ls],
            lambda e: codex_exec(e, "List the files here.", "List them again."),
        ),
        "codex-agent": Client(
            program("codex"),
            ['spawn_agent={"message": "List the files."}', codex_ls],
            lambda e: codex_exec(e, "Spawn a subagent to list the files here."),
        ),
        "opencode": Client(
            program("opencode"),
            ['bash={"command": "ls", "description": "List"}'],
            lambda e: opencode_run(e),
        ),
        "opencode-continue": Client(
            program("opencode"),
            ['bash={"command": "ls", "description": "List"}'],
            lambda e: opencode_run(e, "List them again."),
        ),
        "opencode-agent": Client(
            program("opencode"),
            [
                'task={"description": "List files", "prompt": "List the files here.", '
                '"subagent_type": "general"}',
                'bash={"command": "ls", "description": "List"}',
            ],
            lambda e: opencode_run(e),
        ),
        "qwen": Client(
            program("qwen"), ['run_shell_command={"command": "ls"}'], lambda e: qwen_run(e)
        ),
        "qwen-interactive": Client(
            program("qwen"),
            ['run_shell_command={"command": "ls"}'],
            lambda e: qwen_interactive(e, ["List the files here.", "List them again."]),
        ),
        "qwen-agent": Client(
            program("qwen"),
            [
                'agent={"description": "List files", "prompt": "List the files here.", '
                '"subagent_type": "general-purpose"}',
                'run_shell_command={"command": "ls"}',
            ],
            lambda e: qwen_run(e),
        ),
        "mini": Client(program("mini"), ['bash={"command": "ls"}'], lambda e: mini_run(e)),
        "mini-5": Client(
            program("mini"),
            ['bash={"command": "cat hello.txt"}'],
            lambda e: mini_run(e, "Show what hello.txt says.", 5),
        ),
        "mini-4": Client(
            program("mini"),
            ['bash={"command": "wc -l hello.txt"}'],
            lambda e: mini_run(e, "Count the lines of hello.txt.", 4),
        ),
        "gemini": Client(
            program("gemini"), [GEMINI_LS], lambda e: gemini_run(e, "List the files here.")
        ),
        "gemini-agent": Client(
            program("gemini"),
            [GEMINI_DONE, GEMINI_AGENT, GEMINI_LS],
            lambda e: gemini_run(e, "Use a subagent to list the files."),
        ),
        "gemini-interactive": Client(
            program("gemini"),
            [GEMINI_LS],
            lambda e: gemini_interactive(e, ["List the files here.", "List them again."]),
        ),
        "aider": Client(
            program("aider"),
            [],
            lambda e: aider_run(e, ["Say hello.", "Now say goodbye.", "Once more."]),
        ),
        "aider-files": Client(
            program("aider"),
            [],
            lambda e: aider_run(
                e,
                ["What does sessions.py do?", "And spawns.py?", "How do they fit together?"],
                AIDER_FILES,
            ),
        ),
        "aider-git": Client(
            program("aider"),
            [],
            lambda e: aider_run(
                e,
                ["Explain spawns.py.", "Which function is the entry point?"],
                AIDER_FILES[1:],
                True,
            ),
        ),
        "agents-sdk": Client(
            sys.executable, ["transfer_to_math_agent={}"], lambda e: agents_sdk_run()
        ),
        "agents-sdk-tool": Client(sys.executable, [WEATHER], lambda e: agents_sdk_run("tool")),
        "agents-sdk-chat": Client(sys.executable, [WEATHER], lambda e: agents_sdk_run("chat")),
    }


# -- running ----------------------------------------------------------------------------


@dataclass
class Recorded:
    rows: dict[str, Mapping[str, Any]]
    """By label."""
    hit: bool
    """The request to hold back was seen (and held)."""
    server: float | None
    """The share of prompt tokens the engine reported cached (answered requests)."""
    implied: float | None
    """The share the trace's hash ids imply, on the same requests."""


async def record_once(client: Client, folder: Path, target: str | None, delay_s: float) -> Recorded:
    """One run of the client's session."""
    assert client.exe is not None
    home, work, trace = folder / "home", folder / "work", folder / "trace"
    for d in (home, work, trace):
        shutil.rmtree(d, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    (work / "hello.txt").write_text("hello\n")
    async with (
        SimServer("fast", seed=3, tool_call=client.tool_calls) as sim,
        DelayHop(sim.url, target, delay_s) as hop,
        Recorder(
            hop.url,
            "127.0.0.1:0",
            trace,
            flush_interval_s=60,
            content="full",
            hash_seed=1,
            block_size=BLOCK_SIZE[0],
        ) as rec,
    ):
        _QUIET["hop"] = hop
        await client.make(client.exe)(rec.url, sim.profile.model_name, home, work)
        for _ in range(300):  # what the client left running ends
            if not rec.in_flight:
                break
            await asyncio.sleep(0.1)
    table, meta = read_trace(trace)
    summary = summarize_table(table, meta.block_size)
    return Recorded(
        label_rows(table.to_pylist()),
        hop.hit,
        summary.server_cached_rate,
        summary.implied_cached_rate,
    )


async def oracle(
    name: str, client: Client, folder: Path, delay_s: float, repeats: int = 1, max_hold_s=120.0
) -> tuple[Verdict, Recorded, list[str]]:
    first = await record_once(client, folder, None, 0)
    shutil.rmtree(folder / "base-trace", ignore_errors=True)
    shutil.copytree(folder / "trace", folder / "base-trace")  # to judge again (``--judge``)
    base = first.rows
    notes = []
    failed = [lab for lab, r in base.items() if r["error"] is not None]
    if failed:
        notes.append(f"baseline: {len(failed)} failed requests ({', '.join(failed)})")
    arrivals = {lab: r["arrival_ns"] for lab, r in base.items()}
    order = sorted(base, key=lambda lab: base[lab]["arrival_ns"])
    delayed: dict[str, list[dict[str, int]]] = {}
    answered: dict[str, list[int | None]] = {}
    holds: dict[str, list[int]] = {}
    await held_runs(
        client, folder, base, {x: delay_s for x in order}, repeats, notes, delayed, answered, holds
    )
    longer = longer_holds(arrivals, delayed, answered, int(delay_s * 1e9))
    wanted = {x: ns / 1e9 for x, ns in longer.items() if ns / 1e9 <= max_hold_s}
    for x in sorted(set(longer) - set(wanted)):
        notes.append(f"{x}: a hold of {longer[x] / 1e9:.0f} s would tell more (over --max-hold)")
    if wanted:
        notes.append("held longer: " + ", ".join(f"{x} {s:.1f} s" for x, s in wanted.items()))
    await held_runs(client, folder, base, wanted, repeats, notes, delayed, answered, holds)
    (folder / "arrivals.json").write_bytes(
        orjson.dumps(
            {
                "delay_s": delay_s,
                "base": arrivals,
                "delayed": delayed,
                "answered": answered,
                "holds": holds,
            },
            option=orjson.OPT_INDENT_2,
        )
    )
    return judge(base, arrivals, delayed, answered, delay_s), first, [layout(base), *notes]


def judge(
    base: Mapping[str, Mapping[str, Any]],
    arrivals: Mapping[str, int],
    delayed: Mapping[str, Sequence[Mapping[str, int]]],
    answered: Mapping[str, Sequence[int | None]] | None,
    delay_s: float,
) -> Verdict:
    """The verdict on the baseline trace's rows ``base`` (by label) from the runs."""
    measured, unknown = measured_ancestors(arrivals, delayed, int(delay_s * 1e9), answered)
    # waiting composes: a chain of waits a host's slow steps hid at its far end is one
    measured = {y: closure(y, measured) for y in measured}
    traced = trace_ancestors(base)
    return compare(
        measured, traced, sum(len(r["depends_on"] or ()) for r in base.values()), unknown
    )


def judge_kept(folder: Path) -> tuple[Verdict, Recorded, list[str]]:
    """The verdict again from a client's kept runs (``--keep``): its arrivals.json and
    baseline trace (folders kept before the baseline was: the last run's trace, whose
    rows carry the same labels)."""
    kept = orjson.loads((folder / "arrivals.json").read_bytes())
    trace = folder / "base-trace"
    table, meta = read_trace(trace if trace.exists() else folder / "trace")
    summary = summarize_table(table, meta.block_size)
    rows = label_rows(table.to_pylist())
    rec = Recorded(rows, True, summary.server_cached_rate, summary.implied_cached_rate)
    v = judge(rows, kept["base"], kept["delayed"], kept.get("answered"), kept.get("delay_s", 8.0))
    return v, rec, [layout(rows)]


def layout(base: Mapping[str, Mapping[str, Any]]) -> str:
    """The baseline's sessions, and each request's stream, index and dependencies."""
    sessions = len({r["session_id"] for r in base.values()})
    return f"{sessions} session(s); " + "; ".join(
        f"{lab}={r['agent_id']}:{r['request_index']}<-{list(r['depends_on'] or ())}"
        for lab, r in sorted(base.items(), key=lambda kv: kv[1]["arrival_ns"])
    )


async def held_runs(
    client: Client,
    folder: Path,
    base: Mapping[str, Mapping[str, Any]],
    hold_s: Mapping[str, float],
    repeats: int,
    notes: list[str],
    delayed: dict[str, list[dict[str, int]]],
    answered: dict[str, list[int | None]],
    holds: dict[str, list[int]],
) -> None:
    """For each request X of ``hold_s``, ``repeats`` runs holding X back that long; each
    run that sent X again goes to ``delayed[X]`` (label -> arrival), when X's answer
    began in it to ``answered[X]``, the hold to ``holds[X]`` (ns)."""
    for x in sorted(hold_s, key=lambda lab: base[lab]["arrival_ns"]):
        for _ in range(repeats):
            held = await record_once(client, folder, x, hold_s[x])
            if not held.hit or x not in held.rows:
                notes.append(f"{x}: not sent again")
                continue
            lost = set(base) - set(held.rows)
            if lost:
                notes.append(f"{x} held: {len(lost)} requests not sent ({', '.join(sorted(lost))})")
            delayed.setdefault(x, []).append({lab: r["arrival_ns"] for lab, r in held.rows.items()})
            row = held.rows[x]
            began = None if row["headers_ns"] is None else row["arrival_ns"] + row["headers_ns"]
            answered.setdefault(x, []).append(began)
            holds.setdefault(x, []).append(int(hold_s[x] * 1e9))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def report(name: str, v: Verdict, base: Recorded, notes: list[str]) -> None:
    """The client's table row (standard output) and what the oracle noted (standard
    error)."""
    diff = (
        "-"
        if base.server is None or base.implied is None
        else f"{(base.implied - base.server) * 100:+.2f} pt"
    )
    sessions = len({r["session_id"] for r in base.rows.values()})
    print(
        f"| {name} | {v.requests} | {v.true_deps} | {v.trace_deps} | {len(v.false)} "
        f"| {len(v.missing)} | {v.unknown} | {sessions} | {_pct(base.server)} "
        f"| {_pct(base.implied)} | {diff} |",
        flush=True,
    )
    for n in notes:
        print(f"    {n}", file=sys.stderr)
    for y, x in v.false:
        print(f"    false: {y} waits for {x}", file=sys.stderr)
    for y, x in v.missing:
        print(f"    missing: {y} waited for {x}", file=sys.stderr)
    sys.stderr.flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--clients",
        default="claude,claude-agent,codex,codex-agent,opencode,opencode-agent,mini,agents-sdk",
    )
    ap.add_argument("--delay", type=float, default=8.0, help="seconds a request is held")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per held request (a dependency moves in every one; 0: the "
        "baseline only, for its sessions and prefix reuse)",
    )
    ap.add_argument(
        "--block-size", type=int, default=64, help="the trace's block size (the engine's is 16)"
    )
    ap.add_argument("--keep", default=None, help="folder for the runs (default: a temporary one)")
    ap.add_argument(
        "--max-hold",
        type=float,
        default=120.0,
        help="longest hold of a request run again to tell what --delay could not (s)",
    )
    ap.add_argument(
        "--judge",
        default=None,
        metavar="DIR",
        help="run nothing: judge again the clients' runs kept in DIR (by --keep)",
    )
    args = ap.parse_args()
    table = clients()
    BLOCK_SIZE[0] = args.block_size
    root = Path(args.keep or tempfile.mkdtemp(prefix="bench-deps-"))
    print(
        "| client | requests | true deps | trace deps | false | missing | no verdict "
        "| sessions | server cached | trace implies | trace - server |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.clients.split(","):
        if args.judge:
            report(name, *judge_kept(Path(args.judge) / name))
            continue
        c = table[name]
        if c.exe is None:
            print(f"| {name} | not installed | | | | | | | | | |")
            continue
        report(
            name,
            *asyncio.run(oracle(name, c, root / name, args.delay, args.repeats, args.max_hold)),
        )
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
