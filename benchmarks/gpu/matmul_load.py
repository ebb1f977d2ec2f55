"""A steady GPU load for the telemetry benchmark: bf16 matrix multiplies on every visible
GPU, one thread each, until killed."""

from __future__ import annotations

import threading

import torch


def spin(dev: int) -> None:
    with torch.cuda.device(dev):
        a = torch.randn(8192, 8192, device=f"cuda:{dev}", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=f"cuda:{dev}", dtype=torch.bfloat16)
        while True:
            for _ in range(20):
                a = (a @ b).clamp_(-1, 1)
            torch.cuda.synchronize()


threads = [
    threading.Thread(target=spin, args=(d,), daemon=True) for d in range(torch.cuda.device_count())
]
for t in threads:
    t.start()
for t in threads:
    t.join()
