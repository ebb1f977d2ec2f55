"""Headless Chromium over the Chrome DevTools protocol (a websocket, with aiohttp): open a
page, collect its console errors and uncaught exceptions, evaluate JavaScript in it, and
take a screenshot of the whole page. Used by the HTML report's tests and by
``scripts/report_screenshot.py`` (the README's picture).

Chromium is Debian's ``chromium`` package (``scripts/test.sh`` installs it where apt can);
``chromium_path()`` is None where it is missing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Page:
    errors: list[str] = field(default_factory=list)
    """Console errors, uncaught exceptions and failed loads, one line each."""
    result: Any = None
    """What the ``check`` expression returned once it was truthy (or last, at the timeout)."""


class _Session:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.loaded = asyncio.Event()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            elif data.get("method") == "Page.loadEventFired":
                self.loaded.set()
            elif "method" in data:
                self.events.append(data)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        i = next(self.ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[i] = fut
        await self.ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
        reply = await asyncio.wait_for(fut, 60)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return dict(reply.get("result") or {})

    def errors(self) -> list[str]:
        out = []
        for ev in self.events:
            m, p = ev["method"], ev.get("params") or {}
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(
                    "console."
                    + p["type"]
                    + ": "
                    + " ".join(
                        str(a.get("value", a.get("description", ""))) for a in p.get("args", [])
                    )
                )
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails") or {}
                out.append(
                    "exception: "
                    + str((d.get("exception") or {}).get("description") or d.get("text"))
                )
            elif m == "Log.entryAdded" and (p.get("entry") or {}).get("level") == "error":
                e = p["entry"]
                out.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}".strip())
        return out


async def _open(
    chromium: str, profile: str, width: int, height: int
) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [
            chromium,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # its helpers are ended with it
    port_file = Path(profile) / "DevToolsActivePort"
    for _ in range(300):
        if port_file.exists() and port_file.read_text().strip():
            port = port_file.read_text().split()[0]
            return proc, f"http://127.0.0.1:{port}"
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode} before listening")
        await asyncio.sleep(0.1)
    proc.kill()
    raise RuntimeError("chromium did not open its DevTools port in 30 s")


async def load(
    path: str | os.PathLike[str],
    *,
    check: str = "true",
    screenshot: str | None = None,
    width: int = 1280,
    height: int = 900,
    timeout_s: float = 60.0,
    max_height: int | None = None,
) -> Page:
    """Open the file ``path``, wait for its load event and then for the JavaScript
    expression ``check`` to return a truthy value (polled), take a full-page screenshot to
    ``screenshot`` (PNG; its top ``max_height`` pixels when given) when given, and return
    the page's errors and ``check``'s value."""
    chromium = chromium_path()
    if chromium is None:
        raise RuntimeError("no chromium on PATH (apt-get install chromium)")
    # Chromium's helper processes may still write to the profile while it is removed
    with tempfile.TemporaryDirectory(
        prefix="agent-replay-chromium-", ignore_cleanup_errors=True
    ) as profile:
        proc, base = await _open(chromium, profile, width, height)
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{base}/json/list") as r:
                    targets = await r.json(content_type=None)
                url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
                async with http.ws_connect(url, max_msg_size=0) as ws:
                    s = _Session(ws)
                    for domain in ("Runtime", "Log", "Page"):
                        await s.call(f"{domain}.enable")
                    await s.call("Page.navigate", url=Path(path).resolve().as_uri())
                    await asyncio.wait_for(s.loaded.wait(), timeout_s)
                    page = Page()
                    deadline = asyncio.get_running_loop().time() + timeout_s
                    while True:
                        got = await s.call(
                            "Runtime.evaluate",
                            expression=check,
                            returnByValue=True,
                            awaitPromise=True,
                        )
                        page.result = (got.get("result") or {}).get("value")
                        if page.result or asyncio.get_running_loop().time() > deadline:
                            break
                        await asyncio.sleep(0.2)
                    if screenshot is not None:
                        metrics = await s.call("Page.getLayoutMetrics")
                        size = metrics.get("cssContentSize") or metrics["contentSize"]
                        shot = await s.call(
                            "Page.captureScreenshot",
                            format="png",
                            captureBeyondViewport=True,
                            clip={
                                "x": 0,
                                "y": 0,
                                "width": size["width"],
                                "height": min(size["height"], max_height or size["height"]),
                                "scale": 1,
                            },
                        )
                        Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
                    page.errors = s.errors()
                    s.reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await s.reader
                    return page
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
