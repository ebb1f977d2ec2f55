"""Probing the target before a run: reachable, which model, /metrics present. Fails fast
with one line (TargetError, exit 3) when the server cannot be used."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from traces.errors import TargetError


@dataclass
class TargetInfo:
    url: str
    models: list[str] = field(default_factory=list)
    max_model_len: int | None = None
    has_metrics: bool = False
    raw_models: list[dict[str, Any]] = field(default_factory=list)


async def probe(url: str, timeout_s: float = 5.0) -> TargetInfo:
    base = url.rstrip("/")
    info = TargetInfo(url=base)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as s:
            async with s.get(base + "/v1/models") as resp:
                if resp.status != 200:
                    raise TargetError(f"{base}/v1/models answered HTTP {resp.status}: is this an "
                                      "OpenAI-compatible server?")
                data = await resp.json(content_type=None)
            for m in (data or {}).get("data") or ():
                if isinstance(m, dict) and "id" in m:
                    info.models.append(str(m["id"]))
                    info.raw_models.append(m)
                    if info.max_model_len is None and isinstance(m.get("max_model_len"), int):
                        info.max_model_len = m["max_model_len"]
            try:
                async with s.get(base + "/metrics") as resp:
                    info.has_metrics = resp.status == 200
                    await resp.read()
            except aiohttp.ClientError:
                info.has_metrics = False
    except (aiohttp.ClientConnectorError, aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
        raise TargetError(f"cannot reach {base}: {exc}") from exc
    except asyncio.TimeoutError as exc:
        raise TargetError(f"{base} did not answer within {timeout_s:g} s") from exc
    except (aiohttp.ClientError, ValueError) as exc:
        raise TargetError(f"{base}: unusable answer from /v1/models ({exc})") from exc
    return info
