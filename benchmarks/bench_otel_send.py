"""Send times of the OTel import against the recorder's, per way: the same session against
the simulated engine, recorded by the proxy and, at once, received by ``record-otlp`` from
the agent's own telemetry. Per request, error = |recorder arrival - OTel send|, where the
recorder's arrival is when it read the request's headers off the connection
(``replay.record.arrivals``) and the OTel send is what the import takes (docs/recording.md,
"Send times"). The requests of the two traces are paired by their token counts.

The engine (``agent-replay engines sim``) and the receiver (``agent-replay record-otlp``)
run as programs of their own: this process's event loop is the recorder's alone, as when a
user records. Per way, all its runs pooled: n, p50, p90, max (nearest rank,
``analysis.hist``), and the max without each session's first request (the client opens its
connection after its marker); ``handler``: the same had the recorder stamped each request
when its handler started (what it did before), paired request by request in the same run;
``lag``: how late the recorder's loop woke for 1 ms sleeps, at most (an upper bound on how
long a request's headers waited in the socket before the recorder read them). The host:
load average at the start and end of the way's runs, the cores other processes kept busy
meanwhile, and ``host_busy`` as ``analysis.selfcheck`` says it.

    .venv/bin/python benchmarks/bench_otel_send.py OUT.json [--runs 5] [--ways a,b] [--keep DIR]

Ways (each skipped, saying why, where its package or program is missing):
openai-v2, openai-v2+http, openinference, openinference+http (tests/record/otel_agent.py,
4 requests a run); claude-events, claude-spans (Claude Code ``-p``, 2 requests);
claude-197-subagents-events, claude-197-subagents-spans (Claude Code 2.1.197 with nested
subagents, 13 requests); claude-subagents-events, claude-subagents-spans (the current
Claude Code's background subagents, 9 requests); codex (Codex ``exec`` with
``trace_exporter``, 2 requests). With the default 5 runs: about 4 minutes on the 2-core
host at load 4. Needs the dev extra and
scripts/setup-real-clients.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import importlib.util
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import numpy as np  # noqa: E402
from aiohttp import web  # noqa: E402

from agent_replay.analysis.hist import percentile_summary  # noqa: E402
from agent_replay.analysis.selfcheck import MachineMeter, host_busy  # noqa: E402
from agent_replay.replay.record import Recorder  # noqa: E402
from agent_replay.replay.record.arrivals import arrival_of  # noqa: E402
from agent_replay.replay.record.proxy import ProxyHandler  # noqa: E402
from agent_replay.replay.record.wire import api_for  # noqa: E402
from agent_replay.traces.io import read_trace  # noqa: E402
from benchmarks.realclients import BIN  # noqa: E402
from tests.realclient.test_otel_clients import claude_env  # noqa: E402
from tests.realclient.test_real_clients import (  # noqa: E402
    AGENT,
    CODEX_LS,
    LS,
    codex_exec,
    run_program,
)

SDK_AGENT = ROOT / "tests" / "record" / "otel_agent.py"
CLI = str(Path(sys.executable).with_name("agent-replay"))
SDK_TURNS = 4
SDK_WAYS = ("openai-v2", "openai-v2+http", "openinference", "openinference+http")
CLIENT_WAYS = (
    "claude-events",
    "claude-spans",
    "claude-197-subagents-events",
    "claude-197-subagents-spans",
    "claude-subagents-events",
    "claude-subagents-spans",
    "codex",
)
WAYS = SDK_WAYS + CLIENT_WAYS
BOUND_MS = 5.0
"""The send-time bound asked of every way."""


class Skip(Exception):
    """A way that cannot run here (its package or program is missing)."""


@dataclass
class Leads:
    """Per request of the recorder: handler start - header stamp (ns), by stamp."""

    by_stamp: dict[int, int] = field(default_factory=dict)


LEADS = Leads()


def _measure_handler_lead() -> None:
    """Wrap the recorder's handler so that each API request's time between its header
    stamp and its handler's start is kept (``LEADS``): the error the old stamp had."""
    orig = ProxyHandler.handle

    async def handle(self: ProxyHandler, request: web.Request) -> web.StreamResponse:
        now, stamp = self.clock(), arrival_of(request)
        if stamp is not None and api_for(request.method, request.path) is not None:
            LEADS.by_stamp[stamp] = now - stamp
        return await orig(self, request)

    ProxyHandler.handle = handle  # type: ignore[method-assign]


def _program(name: str) -> str:
    path = BIN / name
    if not path.exists():
        raise Skip(f"{name} not installed (scripts/setup-real-clients.sh)")
    return str(path)


def _need(*modules: str) -> None:
    for m in modules:
        if importlib.util.find_spec(m) is None:
            raise Skip(f"{m} not installed (the dev extra)")


RunFn = Callable[[str, str, Path], Awaitable[None]]
"""(recorder url, receiver url, folder): runs the agent once."""


def _sdk(kind: str) -> RunFn:
    base = kind.removesuffix("+http")
    _need("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http", "opentelemetry.proto")
    _need(
        "opentelemetry.instrumentation.openai_v2"
        if base == "openai-v2"
        else "openinference.instrumentation.openai"
    )
    if kind.endswith("+http"):
        _need("opentelemetry.instrumentation.httpx")

    async def run(url: str, otlp: str, tmp: Path) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SDK_AGENT),
            url,
            otlp,
            kind,
            str(SDK_TURNS),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        if proc.returncode != 0:
            raise RuntimeError(err.decode()[-500:])

    return run


def _client(way: str) -> tuple[RunFn, list[str]]:
    """A real client's run and the tool calls the engine answers with."""
    if way == "codex":
        codex = _program("codex")
        plain = codex_exec(codex, "List the files here.")

        def codex_argv(url: str, model: str, home: Path, otlp: str) -> Any:
            argv, env = plain(url, model, home)
            with (home / "config.toml").open("a") as fh:  # docs/recording.md's [otel]
                fh.write(
                    "\n[otel]\nlog_user_prompt = false\nexporter = { otlp-http = { endpoint = "
                    f'"{otlp}/v1/logs", protocol = "json" }} }}\n'
                    "trace_exporter = { otlp-http = { endpoint = "
                    f'"{otlp}/v1/traces", protocol = "json" }} }}\n'
                )
            return argv, env

        return _agent_run(codex_argv), [CODEX_LS, LS]
    claude = _program("claude-2.1.197" if way.startswith("claude-197") else "claude")
    spans = way.endswith("spans")
    subagents = "subagents" in way

    def claude_argv(url: str, model: str, home: Path, otlp: str) -> Any:
        argv, env = claude_env(claude, url, model, home, otlp, spans=spans)
        return ([*argv, "Agent"] if subagents else argv), env

    return _agent_run(claude_argv), ([AGENT, LS] if subagents else [LS])


def _agent_run(argv_env: Callable[[str, str, Path, str], Any]) -> RunFn:
    async def run(url: str, otlp: str, tmp: Path) -> None:
        home, work = tmp / "home", tmp / "work"
        home.mkdir()
        work.mkdir()
        (work / "hello.txt").write_text("hello\n")
        argv, env = argv_env(url, "sim-fast", home, otlp)
        await run_program(argv, env, work)

    return run


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _started(argv: list[str], url: str) -> asyncio.subprocess.Process:
    """A server program, once ``url`` answers."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    async with aiohttp.ClientSession() as s:
        for _ in range(300):
            if proc.returncode is not None:
                err = await proc.stderr.read() if proc.stderr else b""
                raise RuntimeError(f"{argv[1]} exited: {err.decode()[-300:]}")
            try:
                async with s.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                    await r.read()
                    return proc
            except (aiohttp.ClientError, asyncio.TimeoutError):
                await asyncio.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{argv[1]} did not answer at {url}")


async def _ended(proc: asyncio.subprocess.Process) -> None:
    """Ctrl-C, as a user stops it (the receiver then writes its trace)."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGINT)
    try:
        await asyncio.wait_for(proc.wait(), 60)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()


async def _loop_lag(wakes: list[tuple[int, int]], stop: asyncio.Event) -> None:
    """This loop's (the recorder's) 1 ms sleeps: (asleep, awake) monotonic ns each. A
    request read while the loop was late was read late by at most the sleep's overshoot."""
    while not stop.is_set():
        t = time.monotonic_ns()
        await asyncio.sleep(0.001)
        wakes.append((t, time.monotonic_ns()))


def _stall_ms(wakes: list[tuple[int, int]], stamp: int) -> float:
    """Up to how late the recorder may have read a request stamped at ``stamp``: the time
    from the start of the sleep that spans it, less the 1 ms asked (0: no such sleep)."""
    i = bisect.bisect_right(wakes, (stamp, 1 << 62)) - 1
    if i < 0 or stamp > wakes[i][1] + 500_000:
        return 0.0
    return max(0.0, (stamp - wakes[i][0]) / 1e6 - 1.0)


async def one_run(
    way: str, run: RunFn, tools: list[str], tmp: Path, lags: list[float]
) -> list[dict[str, Any]]:
    """One session of ``way``: per request its signed error (recorder - OTel, ms), whether
    it is its session's first, and the handler's lead. The engine and the receiver run as
    programs of their own, so that this process's event loop is the recorder's alone, as
    when a user records."""
    tmp.mkdir(parents=True)
    sim_port, otlp_port = _free_port(), _free_port()
    tool_args = [a for t in tools for a in ("--tool-call", t)]
    sim = await _started(
        [CLI, "engines", "sim", "--port", str(sim_port), "--profile", "fast", "--seed", "3"]
        + tool_args,
        f"http://127.0.0.1:{sim_port}/health",
    )
    try:
        otlp = await _started(
            [CLI, "record-otlp", "--listen", f"127.0.0.1:{otlp_port}", "-o"]
            + [str(tmp / "received"), "--flush-interval", "60", "--quiet"],
            f"http://127.0.0.1:{otlp_port}/v1/metrics",
        )
        try:
            async with Recorder(
                f"http://127.0.0.1:{sim_port}",
                "127.0.0.1:0",
                tmp / "recorded",
                flush_interval_s=60,
            ) as rec:
                stop, wakes = asyncio.Event(), list[tuple[int, int]]()
                lag = asyncio.create_task(_loop_lag(wakes, stop))
                try:
                    await run(rec.url, f"http://127.0.0.1:{otlp_port}", tmp)
                finally:
                    stop.set()
                    await lag
                t0 = rec._t0 or 0
        finally:
            await _ended(otlp)
    finally:
        await _ended(sim)
    lags += [(b - a) / 1e6 - 1.0 for a, b in wakes]
    return _paired(tmp, t0, wakes)


def _paired(tmp: Path, t0: int, wakes: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """The recorder's requests and the receiver's, paired by token counts (the same
    request has the same counts in both) and, among requests of equal counts, by order."""
    (r_tab, r_meta), (o_tab, o_meta) = read_trace(tmp / "recorded"), read_trace(tmp / "received")
    recorded = sorted(r_tab.to_pylist(), key=lambda r: r["arrival_ns"])
    received = sorted(o_tab.to_pylist(), key=lambda r: r["arrival_ns"])
    if len(recorded) != len(received):
        raise RuntimeError(f"{len(recorded)} requests recorded, {len(received)} received")
    by_counts: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for o in received:
        by_counts.setdefault((o["input_tokens"], o["output_tokens"]), []).append(o)
    seen: set[str] = set()
    seen_streams: set[tuple[str, str]] = set()
    out = []
    for r in recorded:
        same = by_counts.get((r["input_tokens"], r["output_tokens"]))
        if not same:
            raise RuntimeError(
                f"no received request of {r['input_tokens']} / {r['output_tokens']} tokens"
            )
        o = same.pop(0)
        gap = (r_meta.start_wall_ns or 0) + r["arrival_ns"] - (o_meta.start_wall_ns or 0)
        gap -= o["arrival_ns"]
        lead = LEADS.by_stamp.get(r["arrival_ns"] + t0)
        first = r["session_id"] not in seen
        stream_first = (r["session_id"], r["agent_id"].split("/")[0]) not in seen_streams
        seen.add(r["session_id"])
        seen_streams.add((r["session_id"], r["agent_id"].split("/")[0]))
        out.append(
            {
                "error_ms": gap / 1e6,
                "first": first,
                "stream_first": stream_first,
                "handler_lead_ms": lead / 1e6 if lead is not None else None,
                "loop_stall_ms": _stall_ms(wakes, r["arrival_ns"] + t0),
            }
        )
    return out


def stats(errors: list[float], firsts: list[bool]) -> dict[str, Any]:
    """n, p50, p90, max of |error| and the max without each session's first request."""
    size = np.abs(np.asarray(errors, dtype=np.float64))
    if not size.size:
        return {"n": 0}
    s = percentile_summary(size, (50, 90))
    rest = size[~np.asarray(firsts, dtype=bool)]
    return {
        "n": s.count,
        "p50_ms": s.get(50),
        "p90_ms": s.get(90),
        "max_ms": s.max,
        "n_without_first": int(rest.size),
        "max_without_first_ms": float(rest.max()) if rest.size else None,
    }


def _cpu_s() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


async def bench_way(way: str, runs: int, keep: Path) -> dict[str, Any]:
    try:
        if way in SDK_WAYS:
            run, tools = _sdk(way), []
        else:
            run, tools = _client(way)
    except Skip as exc:
        return {"skipped": str(exc)}
    meter, cpu0, load0 = MachineMeter(), _cpu_s(), os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    errors = []
    lags: list[float] = []
    t = time.monotonic()
    for i in range(runs):
        try:
            got = await one_run(way, run, tools, keep / way / f"run{i}", lags)
        except Exception as exc:  # one run's failure is reported, the rest still count
            errors.append(f"run {i}: {type(exc).__name__}: {str(exc)[-300:]}")
            continue
        rows += [{"run": i, **g} for g in got]
    machine = meter.machine(_cpu_s() - cpu0)
    firsts = [r["first"] for r in rows]
    leads = [r["handler_lead_ms"] for r in rows]
    handler = (
        stats([r["error_ms"] + r["handler_lead_ms"] for r in rows], firsts)
        if rows and all(x is not None for x in leads)
        else None
    )
    return {
        **stats([r["error_ms"] for r in rows], firsts),
        "handler": handler,
        "handler_lead_ms": stats([x for x in leads if x is not None], [False] * len(rows)),
        "loop_lag_ms": stats(lags, [False] * len(lags)),
        "max_without_stream_first_ms": stats(
            [r["error_ms"] for r in rows], [r["stream_first"] for r in rows]
        ).get("max_without_first_ms"),
        "over_5ms": sum(abs(r["error_ms"]) > BOUND_MS for r in rows),
        "over_5ms_loop_late": sum(
            abs(r["error_ms"]) > BOUND_MS and r["loop_stall_ms"] >= abs(r["error_ms"]) - BOUND_MS
            for r in rows
        ),
        "seconds": round(time.monotonic() - t, 1),
        "load1": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "others_cores": round(machine.others_cores, 2),
        "steal": round(machine.steal, 3),
        "cpus": machine.cpus,
        "host_busy": host_busy(machine),
        "errors": errors,
        "requests": rows,
    }


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def line(way: str, r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"{way:28} skipped: {r['skipped']}"
    if not r.get("n"):
        return f"{way:28} no requests: {'; '.join(r['errors'])}"
    h = r.get("handler") or {}
    lag = r.get("loop_lag_ms") or {}
    return (
        f"{way:28} {r['n']:>3} {_f(r['p50_ms']):>6} {_f(r['p90_ms']):>6} {_f(r['max_ms']):>6} "
        f"{_f(r['max_without_first_ms']):>8}   {_f(h.get('p50_ms')):>6} {_f(h.get('max_ms')):>6}"
        f" {_f(lag.get('max_ms')):>6} {r['over_5ms']:>3}/{r['over_5ms_loop_late']:<3}"
        f" {r['load1'][0]:>5.1f}-{r['load1'][1]:<5.1f}"
        f" {r['others_cores']:>5.2f}{'  BUSY' if r['host_busy'] else ''}"
        + (f"  ({len(r['errors'])} runs failed: {r['errors'][0]})" if r["errors"] else "")
    )


async def main_async(args: argparse.Namespace) -> int:
    ways = args.ways.split(",") if args.ways else list(WAYS)
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        print(f"--ways: unknown {', '.join(unknown)} (known: {', '.join(WAYS)})", file=sys.stderr)
        return 2
    _measure_handler_lead()
    print(
        f"|recorder arrival - OTel send| in ms, {args.runs} runs a way; handler: had the "
        "recorder stamped at its handler's start; lag: the recorder's event loop, most late; "
        ">5/late: requests over 5 ms / of them, those the recorder's loop may have read late "
        "by the excess; "
        "load: 1-min average at start-end; others: cores other processes used"
    )
    print(
        f"{'way':28} {'n':>3} {'p50':>6} {'p90':>6} {'max':>6} {'max-1st':>8}   "
        f"{'h.p50':>6} {'h.max':>6} {'lag':>6} {'>5/late':>7} {'load':>11} {'others':>6}"
    )
    out: dict[str, Any] = {
        "runs": args.runs,
        "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ways": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-otel-send-") as tmp:
        keep = Path(args.keep) if args.keep else Path(tmp)
        for way in ways:
            r = await bench_way(way, args.runs, keep)
            out["ways"][way] = r
            print(line(way, r), flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the JSON file to write")
    ap.add_argument("--runs", type=int, default=5, help="sessions per way (default 5)")
    ap.add_argument("--ways", default="", help=f"comma-separated, of: {', '.join(WAYS)}")
    ap.add_argument("--keep", default="", help="keep each run's traces under this folder")
    args = ap.parse_args()
    if args.runs < 1:
        print("--runs must be at least 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists():
        print(f"{out}: exists; choose another path", file=sys.stderr)
        return 2
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
