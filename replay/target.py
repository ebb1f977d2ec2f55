"""Probing the target before a run: reachable, which model, /metrics present. Fails fast
with one line (TargetError, exit 3) when the server cannot be used."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from agent_replay.errors import TargetError
from agent_replay.redact import redact_url


@dataclass
class TargetInfo:
    url: str
    models: list[str] = field(default_factory=list)
    max_model_len: int | None = None
    has_metrics: bool = False
    raw_models: list[dict[str, Any]] = field(default_factory=list)


def base_url(url: str) -> str:
    """The server's root: a base URL given as ``.../v1`` (the way SDKs take it) loses the
    ``/v1``, since every path the replay sends starts with it."""
    base = url.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


def _check_models_status(shown: str, status: int) -> None:
    if status in (401, 403):
        raise TargetError(
            f"{shown}/v1/models answered HTTP {status}: the server "
            "wants a key (--api-key, or OPENAI_API_KEY / "
            "ANTHROPIC_API_KEY)"
        )
    if status != 200:
        raise TargetError(
            f"{shown}/v1/models answered HTTP {status}: is this an OpenAI-compatible server?"
        )


def _add_models(info: TargetInfo, data: Any) -> None:
    """The served models of a /v1/models answer, and the first one's context length."""
    for m in (data or {}).get("data") or ():
        if isinstance(m, dict) and "id" in m:
            info.models.append(str(m["id"]))
            info.raw_models.append(m)
            if info.max_model_len is None and isinstance(m.get("max_model_len"), int):
                info.max_model_len = m["max_model_len"]


async def _has_metrics(s: aiohttp.ClientSession, base: str) -> bool:
    """Whether the server answers /metrics."""
    try:
        async with s.get(base + "/metrics") as resp:
            await resp.read()
            return resp.status == 200
    except aiohttp.ClientError:
        return False


async def probe(
    url: str,
    timeout_s: float = 5.0,
    *,
    headers: Mapping[str, str] | None = None,
    insecure: bool = False,
) -> TargetInfo:
    base = url.rstrip("/")
    info = TargetInfo(url=base)
    shown = redact_url(base)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(ssl=not insecure)
    try:
        async with aiohttp.ClientSession(
            timeout=timeout, headers=dict(headers or {}), connector=connector
        ) as s:
            async with s.get(base + "/v1/models") as resp:
                _check_models_status(shown, resp.status)
                data = await resp.json(content_type=None)
            _add_models(info, data)
            info.has_metrics = await _has_metrics(s, base)
    except aiohttp.ClientConnectorCertificateError as exc:
        raise TargetError(
            f"{shown}: TLS certificate not trusted ({exc.certificate_error}); "
            "--insecure accepts it (a self-signed test server)"
        ) from exc
    except (
        aiohttp.ClientConnectorError,
        aiohttp.ClientOSError,
        aiohttp.ServerDisconnectedError,
    ) as exc:
        raise TargetError(f"cannot reach {shown}: {redact_url(str(exc))}") from exc
    except asyncio.TimeoutError as exc:
        raise TargetError(f"{shown} did not answer within {timeout_s:g} s") from exc
    except (aiohttp.ClientError, ValueError) as exc:
        raise TargetError(
            f"{shown}: unusable answer from /v1/models ({redact_url(str(exc))})"
        ) from exc
    return info
