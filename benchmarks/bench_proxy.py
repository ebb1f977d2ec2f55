"""What the recording proxy adds to the latency a client sees.

The simulated engine runs in its own process, the recorder (``agent-replay record``) in
another; this process keeps N streams open at all times, each stream alternating its
requests between the engine directly and the recorder (so both see the same engine load
and the same background noise at the same moments), and compares the client-side TTFT and
chunk-gap distributions of the two.

    .venv/bin/python benchmarks/bench_proxy.py --streams 100 --seconds 20

Targets: the proxy adds at most 1 ms to P99 TTFT and 0.2 ms to P99 chunk gap. On a
shared 2-core machine the figures are noisy (the engine, the proxy and this client share
two cores): run it more than once.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
PRIO = os.environ.get("BENCH_PROXY_PRIO", "").split()
sys.path.insert(0, str(ROOT))

from engines.dialects import build_request, count_token_ids  # noqa: E402
from engines.sim import SimProcess, SimProfile  # noqa: E402
from engines.sse import SSEParser  # noqa: E402


def start_proxy(upstream: str, out: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [*PRIO, sys.executable, "-m", "replay", "record", "--upstream", upstream, "--listen",
         "127.0.0.1:0", "-o", str(out), "--quiet"], stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    if "->" not in line:
        proc.kill()
        raise SystemExit(f"recorder did not start: {line}")
    return proc, line.split()[2]


async def one_stream(s: aiohttp.ClientSession, url: str, body: bytes, chat: bool,
                     ttfts: list[int], gaps: list[int]) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    sent = time.perf_counter_ns()
    last = None
    async with s.post(url + path, data=body, headers={"Content-Type": "application/json"}) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {(await r.read())[:200]!r}")
        parser = SSEParser()
        async for chunk in r.content.iter_any():
            t = time.perf_counter_ns()
            for ev in parser.feed(chunk):
                if ev.data == b"[DONE]":
                    continue
                k = count_token_ids(ev.data)
                if k < 0 and chat:
                    obj = orjson.loads(ev.data)
                    k = 1 if obj.get("choices") and obj["choices"][0]["delta"].get("content") else 0
                if k <= 0:
                    continue
                if last is None:
                    ttfts.append(t - sent)
                else:
                    gaps.append(t - last)
                last = t


async def phase(urls: list[str], model: str, streams: int, seconds: float, chat: bool,
                max_tokens: int, prompt_len: int, seed: int
                ) -> list[tuple[list[int], list[int], int]]:
    """Every stream sends its requests to ``urls`` in turn; results per URL."""
    res: list[tuple[list[int], list[int], int]] = [([], [], 0) for _ in urls]
    end = time.monotonic() + seconds

    async def worker(i: int) -> None:
        n = 0
        while time.monotonic() < end:
            which = (i + n) % len(urls)
            ttfts, gaps, _ = res[which]
            prompt = [1000 + (seed * 7919 + i * 131 + n * 17 + j) % 20000 for j in range(prompt_len)]
            if chat:
                body = build_request("chat", model=model, prompt=f"q {seed} {i} {n} " + "w " * prompt_len,
                                     max_tokens=max_tokens)
                body.pop("return_token_ids", None)
                body.pop("stream_options", None)  # like an SDK user: the proxy injects usage
            else:
                body = build_request("completions", model=model, prompt=prompt, max_tokens=max_tokens)
            await one_stream(s, urls[which], orjson.dumps(body), chat, ttfts, gaps)
            n += 1
            res[which] = (ttfts, gaps, res[which][2] + 1)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(*(worker(i) for i in range(streams)))
    return res


def pct(v: list[int], q: float) -> float:
    return float(np.percentile(np.asarray(v, dtype=np.int64), q)) / 1e6 if v else float("nan")


async def main_async(args: argparse.Namespace, sim_url: str, proxy_url: str,
                     proxy_proc: psutil.Process, sim_proc: psutil.Process) -> None:
    async with aiohttp.ClientSession() as s, s.get(sim_url + "/v1/models") as r:
        model = (await r.json())["data"][0]["id"]
    await phase([sim_url], model, args.streams, 1.0, args.chat, args.max_tokens,
                args.prompt_len, 999)  # warm-up, not counted
    c0, s0, m0 = proxy_proc.cpu_times(), sim_proc.cpu_times(), psutil.Process().cpu_times()
    t0 = time.monotonic()
    (dt, dg, dn), (pt, pg, pn) = await phase([sim_url, proxy_url], model, args.streams,
                                             args.seconds, args.chat, args.max_tokens,
                                             args.prompt_len, 1)
    el = time.monotonic() - t0
    c1, s1, m1 = proxy_proc.cpu_times(), sim_proc.cpu_times(), psutil.Process().cpu_times()
    cpu = ((c1.user + c1.system) - (c0.user + c0.system)) / el
    sim_cpu = ((s1.user + s1.system) - (s0.user + s0.system)) / el
    me_cpu = ((m1.user + m1.system) - (m0.user + m0.system)) / el
    res = {"direct": (dt, dg), "proxied": (pt, pg)}
    counts = {"direct": dn, "proxied": pn}
    print(f"\n{args.streams} concurrent streams, {'chat (proxy injects usage)' if args.chat else 'completions'}, "
          f"max_tokens {args.max_tokens}, prompt {args.prompt_len} tokens, {args.seconds:.0f} s; "
          f"requests direct {counts['direct']}, proxied {counts['proxied']}; proxy CPU "
          f"{cpu * 100:.0f}% of one core (it saw half the streams); sim CPU {sim_cpu * 100:.0f}%, "
          f"client CPU {me_cpu * 100:.0f}%")
    print(f"{'metric':<12}{'n direct':>10}{'n proxied':>11}{'p50 dir':>10}{'p50 prx':>10}"
          f"{'p99 dir':>10}{'p99 prx':>10}{'added p99':>11}{'ratio':>8}{'target':>9}")
    for name, idx, target in (("TTFT ms", 0, 1.0), ("gap ms", 1, 0.2)):
        d, p = res["direct"][idx], res["proxied"][idx]
        add = pct(p, 99) - pct(d, 99)
        ok = "ok" if add <= target else "MISSED"
        print(f"{name:<12}{len(d):>10}{len(p):>11}{pct(d, 50):>10.3f}{pct(p, 50):>10.3f}"
              f"{pct(d, 99):>10.3f}{pct(p, 99):>10.3f}{add:>11.3f}{pct(p, 99) / pct(d, 99):>8.3f}"
              f"{'<= ' + str(target):>9} {ok}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--profile", default="default", help="sim profile (default: default)")
    ap.add_argument("--step-ms", type=float, default=20.0,
                    help="sim decode step time (default 20 ms: ~5k chunks/s at 100 streams, "
                    "which the single-process sim itself can keep up with)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--chat", action="store_true", help="chat without include_usage (injected)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prof = SimProfile.load(args.profile)
        data = {f.name: getattr(prof, f.name) for f in dataclasses.fields(prof)}
        data["decode_base_ns"] = int(args.step_ms * 1e6)
        data["eos_prob"] = 0.0
        pfile = Path(tmp) / "bench.json"
        pfile.write_text(json.dumps(data))
        with SimProcess(pfile) as sim:
            run_all(args, sim, Path(tmp))
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


def run_all(args: argparse.Namespace, sim: SimProcess, tmp: Path) -> None:
    if True:
        proc, url = start_proxy(sim.url, tmp / "trace")
        try:
            assert sim.proc is not None
            coro = main_async(args, sim.url, url, psutil.Process(proc.pid),
                              psutil.Process(sim.proc.pid))
            try:
                import uvloop

                uvloop.run(coro)
            except ImportError:
                asyncio.run(coro)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        from traces.io import read_trace

        rows = read_trace(tmp / "trace")[0]
        print("inside the proxy (from its own trace, ms from arrival): " + ", ".join(
            f"{c} p50 {pct(rows.column(c).drop_null().to_pylist(), 50):.3f} "
            f"p99 {pct(rows.column(c).drop_null().to_pylist(), 99):.3f}"
            for c in ("upstream_send_ns", "headers_ns", "ttft_ns")))


if __name__ == "__main__":
    main()
