"""A DCGM exporter stand-in on loopback: serves the recorded page (tests/engines/data),
optionally with its energy counters advancing at the page's power draw."""

from __future__ import annotations

import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PAGE = Path(__file__).parent / "data" / "dcgm_exporter_h200.txt"
ENERGY = re.compile(r"^(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\{[^}]*\}) (\d+)$", re.M)
POWER = re.compile(r"^DCGM_FI_DEV_POWER_USAGE\{gpu=\"(\d+)\"[^}]*\} ([0-9.]+)$", re.M)


def page_at(text: str, elapsed_s: float) -> str:
    """The page with each GPU's energy counter advanced by its power x ``elapsed_s``."""
    power = {int(g): float(w) for g, w in POWER.findall(text)}
    gpus = iter(sorted(power))

    def bump(m: re.Match[str]) -> str:
        g = next(gpus)
        return f"{m.group(1)} {int(m.group(2)) + round(power[g] * elapsed_s * 1000)}"

    return ENERGY.sub(bump, text)


class DcgmPage:
    """``with DcgmPage() as url: ...``; ``live=True``: energy advances with time; ``status``
    other than 200 makes every request fail; ``hits`` counts requests."""

    def __init__(self, text: str | None = None, *, live: bool = False, status: int = 200) -> None:
        self.text = PAGE.read_text() if text is None else text
        self.live, self.status, self.hits = live, status, 0
        self.t0 = time.monotonic()
        page = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                page.hits += 1
                body = (
                    page_at(page.text, time.monotonic() - page.t0) if page.live else page.text
                ).encode()
                self.send_response(page.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
