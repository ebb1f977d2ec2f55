"""What the recording proxy adds to the latency a client sees.

The simulated engine runs in its own process, the recorder (``agent-replay record``) in
another; this process keeps N streams open at all times, each stream alternating its
requests between the engine directly (the baseline) and the recorder, so both see the same
engine load and the same background noise at the same moments. It compares the client-side
TTFT and chunk-gap distributions of the two, and times every hop: each request carries an
``X-Request-Id`` and the engine writes its ground truth (when it received each request and
wrote each chunk, ``time.monotonic_ns()``, shared by all processes of one host), so

* request hop = engine received - client sent (through the proxy: two hops and the proxy);
* chunk hop   = client read - engine write, for every chunk.

    .venv/bin/python benchmarks/bench_proxy.py --streams 100 --seconds 15 --prompt-len 32
    .venv/bin/python benchmarks/bench_proxy.py --streams 1,50,150 --pin --seconds 20 \
        --repeat 5 --prompt-len 32

A P99 of ~120 requests (one 20 s phase at 50 streams) is nearly their maximum: ``--repeat``
pools several phases, and each P99 is printed with its distribution-free 95% interval
(the order statistics whose ranks bound it), or "n too small" where the interval would
reach past the largest sample; the added P99 of each repeat is printed too, for the relay
(the floor any extra process and two loopback hops cost on this host) beside the proxy.

``--pin`` puts the engine on the first allowed CPU and the proxy, the relay and this
client on the second (``os.sched_setaffinity``), so that the engine's decode loop and the
proxy do not take turns on one core; ``--streams`` takes a list, one measurement each with
the same processes (the proxy's RSS is printed before and after each).

Arrivals: by default every request draws its max_tokens from [M/2, 3M/2] (mean M) and the
streams start spread over the first request's duration, so requests arrive spread out as
agents' do. ``--sync`` gives every request the same max_tokens: all streams then finish in
the same engine step and send their next requests at the same moment, a burst of N requests
every few seconds (a burst test: the proxy handles each burst's requests one after another).

Targets (``TARGETS``): at up to 50 streams the proxy adds at most 1 ms to P99 TTFT and
0.5 ms to P99 chunk gap; at 150 streams at most 5 ms to either. On a
shared 2-core machine the figures are noisy (the engine, the proxy and this client share
two cores, and other work preempts them): run it more than once, and read the proxy's CPU
time per request and per chunk (printed) as the figures least sensitive to that noise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import psutil
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
PRIO = os.environ.get("BENCH_PROXY_PRIO", "").split()
sys.path.insert(0, str(ROOT))

from agent_replay.engines.dialects import build_request, count_token_ids  # noqa: E402
from agent_replay.engines.sim import SimProcess, SimProfile  # noqa: E402
from agent_replay.engines.sse import SSEParser  # noqa: E402
from agent_replay.replay.provenance import code_version  # noqa: E402


def start_proxy(upstream: str, out: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [
            *PRIO,
            sys.executable,
            "-m",
            "agent_replay",
            "record",
            "--upstream",
            upstream,
            "--listen",
            "127.0.0.1:0",
            "-o",
            str(out),
            "--quiet",
        ],
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    if "->" not in line:
        proc.kill()
        raise SystemExit(f"recorder did not start: {line}")
    return proc, line.split()[2]


def serve_relay(upstream_port: int) -> None:
    """The floor of any proxy on this host: a bare TCP relay (one more process and two more
    loopback hops, no HTTP), with uvloop. Prints its port."""
    import uvloop

    class Pipe(asyncio.Protocol):
        def __init__(self) -> None:
            self.peer: asyncio.Transport | None = None
            self.transport: asyncio.Transport | None = None
            self.early: list[bytes] = []

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            if self.peer is None:
                self.early.append(data)
            else:
                self.peer.write(data)

        def connection_lost(self, exc: BaseException | None) -> None:
            if self.peer is not None:
                self.peer.close()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()

        def accept() -> Pipe:
            down = Pipe()

            async def connect() -> None:
                _, up = await loop.create_connection(Pipe, "127.0.0.1", upstream_port)
                assert down.transport is not None and up.transport is not None
                up.peer, down.peer = down.transport, up.transport
                for data in down.early:
                    up.transport.write(data)
                down.early.clear()

            task = loop.create_task(connect())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            return down

        server = await loop.create_server(accept, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    uvloop.run(serve())


def start_relay(upstream_port: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [*PRIO, sys.executable, __file__, "--serve-relay", str(upstream_port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, f"http://127.0.0.1:{int(proc.stdout.readline())}"


PATHS = ("direct", "relay", "proxy")
TARGETS = ((50, 1.0, 0.5), (150, 5.0, 5.0))
"""(up to this many streams, added P99 TTFT ms, added P99 chunk gap ms)."""


def targets(streams: int) -> tuple[float, float]:
    for most, ttft, gap in TARGETS:
        if streams <= most:
            return ttft, gap
    return TARGETS[-1][1], TARGETS[-1][2]


@dataclasses.dataclass(slots=True)
class Timed:
    """One request as the client saw it (monotonic ns)."""

    rid: str
    path: str
    sent: int
    chunks: list[int] = dataclasses.field(default_factory=list)
    """Read time of every event that carried output tokens."""


@dataclasses.dataclass(slots=True)
class Side:
    ttfts: list[int] = dataclasses.field(default_factory=list)
    gaps: list[int] = dataclasses.field(default_factory=list)
    requests: int = 0
    chunks: int = 0


async def one_stream(
    s: aiohttp.ClientSession, url: str, body: bytes, chat: bool, rec: Timed
) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    headers = {"Content-Type": "application/json", "X-Request-Id": rec.rid}
    rec.sent = time.monotonic_ns()
    async with s.post(url + path, data=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {(await r.read())[:200]!r}")
        parser = SSEParser()
        async for chunk in r.content.iter_any():
            t = time.monotonic_ns()
            for ev in parser.feed(chunk):
                if ev.data == b"[DONE]":
                    continue
                k = count_token_ids(ev.data)
                if k < 0 and chat:
                    obj = orjson.loads(ev.data)
                    k = 1 if obj.get("choices") and obj["choices"][0]["delta"].get("content") else 0
                if k > 0:
                    rec.chunks.append(t)


async def phase(
    urls: list[str], model: str, args: argparse.Namespace, seconds: float, seed: int
) -> list[Timed]:
    """Every stream sends its requests to ``urls`` in turn."""
    done: list[Timed] = []
    end = time.monotonic_ns() + int(seconds * 1e9)
    mt = args.max_tokens

    async def worker(i: int) -> None:
        rnd = random.Random(seed * 100_003 + i)
        if not args.sync:  # spread the streams' starts over one request's duration
            await asyncio.sleep(rnd.uniform(0, mt * args.step_ms / 1e3))
        n = 0
        while time.monotonic_ns() < end:
            which = (i + n) % len(urls)
            max_tokens = mt if args.sync else rnd.randint(max(1, mt // 2), mt + mt // 2)
            if args.chat:
                body = build_request(
                    "chat",
                    model=model,
                    prompt=f"q {seed} {i} {n} " + "w " * args.prompt_len,
                    max_tokens=max_tokens,
                )
                body.pop("return_token_ids", None)
                body.pop("stream_options", None)  # like an SDK user: the proxy injects usage
            else:
                prompt = [
                    1000 + (seed * 7919 + i * 131 + n * 17 + j) % 20000
                    for j in range(args.prompt_len)
                ]
                body = build_request(
                    "completions", model=model, prompt=prompt, max_tokens=max_tokens
                )
            rec = Timed(f"b{seed}-{args.streams}-{i}-{n}", PATHS[which], 0)
            await one_stream(s, urls[which], orjson.dumps(body), args.chat, rec)
            done.append(rec)
            n += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(*(worker(i) for i in range(args.streams)))
    return done


async def quiet_phase(
    urls: list[str], model: str, args: argparse.Namespace, seconds: float, seed: int
) -> list[Timed]:
    """``phase`` with this process's cyclic collector off: a full collection over the
    requests kept so far takes 18-40 ms here, and lands on whichever request is in
    flight (always the same one: the allocations repeat with the seeds). Collected
    between phases, outside the measurement."""
    gc.collect()
    gc.disable()
    try:
        return await phase(urls, model, args, seconds, seed)
    finally:
        gc.enable()


def pct(v: list[int], q: float) -> float:
    return float(np.percentile(np.asarray(v, dtype=np.int64), q)) / 1e6 if v else float("nan")


def p99_ci(n: int, q: float = 0.99) -> tuple[int, int] | None:
    """The ranks (0-based, in sorted order) that bound the ``q`` quantile of ``n`` samples
    with about 95% confidence (distribution-free: the rank of the true quantile among the
    samples is binomial(n, q), here by its normal approximation); None when the upper
    bound would be past the largest sample (too few samples for this quantile)."""
    half = 1.96 * (n * q * (1 - q)) ** 0.5
    lo, hi = int(np.floor(n * q - half)), int(np.ceil(n * q + half))
    if hi >= n:
        return None
    return max(0, lo), hi


def ci_text(v: list[int]) -> str:
    ci = p99_ci(len(v))
    if ci is None:
        return "n too small"
    s = np.sort(np.asarray(v, dtype=np.int64))
    return f"{s[ci[0]] / 1e6:.2f}..{s[ci[1]] / 1e6:.2f}"


@dataclasses.dataclass(slots=True)
class Run:
    timed: list[Timed]
    cpu_s: dict[str, float]
    """CPU seconds (user + system) of each process over the measured phases."""
    wall_s: float
    repeats: list[list[Timed]] = dataclasses.field(default_factory=list)
    """The requests of each measured phase (``timed`` is all of them)."""
    load: tuple[float, float] = (0.0, 0.0)
    """The host's 1-minute load average before and after."""


async def measure(
    args: argparse.Namespace, urls: list[str], procs: dict[str, psutil.Process]
) -> Run:
    async with aiohttp.ClientSession() as s, s.get(urls[0] + "/v1/models") as r:
        model = (await r.json())["data"][0]["id"]
    await phase(urls, model, args, 1.5, 999)  # warm-up, not counted

    def cpu() -> dict[str, float]:
        return {k: p.cpu_times().user + p.cpu_times().system for k, p in procs.items()}

    load0 = os.getloadavg()[0]
    c0 = cpu()
    t0 = time.monotonic_ns()
    repeats = [
        await quiet_phase(urls, model, args, args.seconds, 1 + k) for k in range(args.repeat)
    ]
    el = (time.monotonic_ns() - t0) / 1e9
    c1 = cpu()
    return Run(
        [t for r in repeats for t in r],
        {k: c1[k] - c0[k] for k in c0},
        el,
        repeats,
        (load0, os.getloadavg()[0]),
    )


def added_p99(timed: list[Timed], path: str) -> tuple[float, float]:
    """(added P99 TTFT, added P99 chunk gap) of ``path`` over direct, ms, in ``timed``."""

    def values(p: str) -> tuple[list[int], list[int]]:
        ttft: list[int] = []
        gaps: list[int] = []
        for t in timed:
            if t.path == p and t.chunks:
                ttft.append(t.chunks[0] - t.sent)
                gaps.extend(b - a for a, b in zip(t.chunks, t.chunks[1:], strict=False))
        return ttft, gaps

    dt, dg = values("direct")
    pt, pg = values(path)
    return pct(pt, 99) - pct(dt, 99), pct(pg, 99) - pct(dg, 99)


def report(args: argparse.Namespace, run: Run, truth: dict[str, dict[str, object]]) -> None:
    sides = {k: Side() for k in PATHS}
    hop_req: dict[str, list[int]] = {k: [] for k in PATHS}
    hop_chunk: dict[str, list[int]] = {k: [] for k in PATHS}
    unmatched = 0
    for t in run.timed:
        side = sides[t.path]
        side.requests += 1
        side.chunks += len(t.chunks)
        if t.chunks:
            side.ttfts.append(t.chunks[0] - t.sent)
            side.gaps.extend(b - a for a, b in zip(t.chunks, t.chunks[1:], strict=False))
        g = truth.get(t.rid)
        if g is None:
            unmatched += 1
            continue
        hop_req[t.path].append(int(g["received_ns"]) - t.sent)  # type: ignore[call-overload]
        written = g["chunk_ns"]
        assert isinstance(written, list)
        if len(written) == len(t.chunks):
            hop_chunk[t.path].extend(c - w for w, c in zip(written, t.chunks, strict=True))
        else:
            unmatched += 1
    mode = "sync (all streams in step: bursts)" if args.sync else "spread arrivals"
    print(
        f"\n{args.streams} concurrent streams, "
        f"{'chat (proxy injects usage)' if args.chat else 'completions'}, max_tokens "
        f"{args.max_tokens}{'' if args.sync else ' (mean; uniform M/2..3M/2)'}, prompt "
        f"{args.prompt_len} tokens, step {args.step_ms:g} ms, {mode}, {run.wall_s:.0f} s; "
        "requests " + ", ".join(f"{k} {sides[k].requests}" for k in PATHS)
    )
    p = sides["proxy"]
    per_req = run.cpu_s["proxy"] / p.requests * 1e3 if p.requests else float("nan")
    per_chunk = run.cpu_s["proxy"] / p.chunks * 1e6 if p.chunks else float("nan")
    relay_chunk = (
        run.cpu_s["relay"] / sides["relay"].chunks * 1e6 if sides["relay"].chunks else float("nan")
    )
    print(
        "CPU, % of one core: "
        + ", ".join(f"{k} {v / run.wall_s * 100:.0f}%" for k, v in run.cpu_s.items())
        + f"; proxy {per_req:.2f} ms per request all included ({per_chunk:.0f} us per chunk), "
        f"relay {relay_chunk:.0f} us per chunk (proxy / relay {per_chunk / relay_chunk:.2f}: "
        "the figure least moved by other load)"
    )
    print("baseline = direct (same streams, same moments); added p99 = p99 - direct p99")
    print(
        f"{'metric':<15}{'path':<7}{'n':>7}{'p50':>9}{'p99':>9}{'p99 95% CI':>14}"
        f"{'added p99':>10}{'ratio':>7}{'target':>9}"
    )
    t_ttft, t_gap = targets(args.streams)
    rows = (
        ("TTFT ms", {k: v.ttfts for k, v in sides.items()}, t_ttft),
        ("chunk gap ms", {k: v.gaps for k, v in sides.items()}, t_gap),
        ("request hop ms", hop_req, None),
        ("chunk hop ms", hop_chunk, None),
    )
    for name, values, target in rows:
        base = pct(values["direct"], 99)
        for k in PATHS:
            v = values[k]
            add = pct(v, 99) - base
            verdict = (
                "" if target is None or k != "proxy" else (" ok" if add <= target else " MISSED")
            )
            tgt = "" if target is None or k == "direct" else f"<= {target:g}"
            added = "" if k == "direct" else f"{add:.3f}"
            print(
                f"{name if k == 'direct' else '':<15}{k:<7}{len(v):>7}{pct(v, 50):>9.3f}"
                f"{pct(v, 99):>9.3f}{ci_text(v):>14}{added:>10}{pct(v, 99) / base:>7.2f}"
                f"{tgt:>9}{verdict}"
            )
    if len(run.repeats) > 1:
        for k in ("relay", "proxy"):
            each = [added_p99(r, k) for r in run.repeats]
            print(
                f"added p99 per repeat, {k}: TTFT "
                + " ".join(f"{a:.2f}" for a, _ in each)
                + " ms; chunk gap "
                + " ".join(f"{b:.2f}" for _, b in each)
                + " ms"
            )
    ttft, gap = added_p99(run.timed, "proxy")
    rttft, rgap = added_p99(run.timed, "relay")
    n_proxy = sum(1 for t in run.timed if t.path == "proxy" and t.chunks)
    if not n_proxy:
        print(
            f"VERDICT {args.streams} streams: no request through the recorder (longer "
            "--seconds or more --repeat)"
        )
    else:
        print(
            f"VERDICT {args.streams} streams: added p99 TTFT proxy {ttft:.2f} ms (relay {rttft:.2f}), "
            f"target {t_ttft:g}: {'ok' if ttft <= t_ttft else 'MISSED'}; chunk gap proxy {gap:.2f} ms "
            f"(relay {rgap:.2f}), target {t_gap:g}: {'ok' if gap <= t_gap else 'MISSED'}; "
            f"{n_proxy} proxy requests"
            + ("" if p99_ci(n_proxy) else " (too few for a bounded p99: use --repeat or --seconds)")
            + f"; load average {run.load[0]:.1f} -> {run.load[1]:.1f}"
        )
    if unmatched:
        print(f"({unmatched} requests without a matching engine record left out of the hops)")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-relay":
        serve_relay(int(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", default="100", help="streams, or a list: 1,50,150")
    ap.add_argument(
        "--pin", action="store_true", help="engine on one CPU, proxy + relay + client on another"
    )
    ap.add_argument("--profile", default="default", help="sim profile (default: default)")
    ap.add_argument(
        "--step-ms",
        type=float,
        default=20.0,
        help="sim decode step time (default 20 ms: ~5k chunks/s at 100 streams, "
        "which the single-process sim itself can keep up with)",
    )
    ap.add_argument("--seconds", type=float, default=20.0, help="length of one measured phase")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measured phases per stream count, pooled (a P99 needs a few hundred "
        "requests per path to be more than the maximum)",
    )
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--chat", action="store_true", help="chat without include_usage (injected)")
    ap.add_argument(
        "--sync",
        action="store_true",
        help="same max_tokens for every request: synchronized bursts of N requests",
    )
    args = ap.parse_args()
    print(
        f"commit {code_version()}; host: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        prof = SimProfile.load(args.profile)
        data = {f.name: getattr(prof, f.name) for f in dataclasses.fields(prof)}
        data["decode_base_ns"] = int(args.step_ms * 1e6)
        data["eos_prob"] = 0.0
        pfile = Path(tmp) / "bench.json"
        pfile.write_text(json.dumps(data))
        gt = Path(tmp) / "truth.parquet"
        counts = [int(x) for x in str(args.streams).split(",")]
        with SimProcess(pfile, ground_truth=gt) as sim:
            runs, rows = run_proxy(args, sim, Path(tmp), counts)
        truth = {str(r["request_id"]): r for r in pq.read_table(gt).to_pylist()}
        for n, run in zip(counts, runs, strict=True):
            report(_with(args, streams=n), run, truth)
        print(
            "inside the proxy (from its own trace, all runs, ms from arrival): "
            + ", ".join(f"{c} p50 {pct(v, 50):.3f} p99 {pct(v, 99):.3f}" for c, v in rows.items())
        )
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


def _with(args: argparse.Namespace, **changes: object) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **changes})


def pin(procs: dict[str, psutil.Process]) -> str:
    """The engine on the first allowed CPU, everything else on the second."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return "not pinned: fewer than 2 CPUs allowed"
    for name, p in procs.items():
        want = {cpus[0]} if name == "sim" else {cpus[1]}
        for q in [p, *p.children(recursive=True)]:
            # every thread: an affinity set by pid holds for that one thread (Linux);
            # threads started later inherit their creator's
            for t in q.threads():
                try:
                    os.sched_setaffinity(t.id, want)
                except ProcessLookupError:
                    pass
    return f"pinned (every thread): sim on CPU {cpus[0]}; proxy, relay, client on CPU {cpus[1]}"


def run_proxy(
    args: argparse.Namespace, sim: SimProcess, tmp: Path, counts: list[int]
) -> tuple[list[Run], dict[str, list[int]]]:
    import uvloop

    from agent_replay.traces.io import read_trace

    relay, relay_url = start_relay(sim.port)
    proc, url = start_proxy(sim.url, tmp / "trace")
    runs = []
    try:
        assert sim.proc is not None
        procs = {
            "proxy": psutil.Process(proc.pid),
            "relay": psutil.Process(relay.pid),
            "sim": psutil.Process(sim.proc.pid),
            "client": psutil.Process(),
        }
        if args.pin:
            print(pin(procs))
        for n in counts:
            rss0 = procs["proxy"].memory_info().rss
            runs.append(
                uvloop.run(measure(_with(args, streams=n), [sim.url, relay_url, url], procs))
            )
            print(
                f"{n} streams: proxy RSS {rss0 / 2**20:.0f} -> "
                f"{procs['proxy'].memory_info().rss / 2**20:.0f} MiB",
                flush=True,
            )
    finally:
        proc.terminate()
        relay.terminate()
        proc.wait(timeout=30)
        relay.wait(timeout=30)
        if relay.stdout is not None:
            relay.stdout.close()
    cols = ("upstream_send_ns", "headers_ns", "ttft_ns")
    if not list((tmp / "trace").glob("*.parquet")):  # no request went through the recorder
        return runs, {c: [] for c in cols}
    table = read_trace(tmp / "trace")[0]
    return runs, {c: table.column(c).drop_null().to_pylist() for c in cols}


if __name__ == "__main__":
    main()
