"""A recorder started in front of an upstream that does not answer says so at once, and its
status line names why requests fail."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _dead_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dead_upstream_is_named_at_start_and_in_the_status_line(tmp_path: Path) -> None:
    upstream = f"http://127.0.0.1:{_dead_port()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent_replay",
            "record",
            "--upstream",
            upstream,
            "--listen",
            "127.0.0.1:0",
            "-o",
            str(tmp_path / "trace"),
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        url = first.split()[2]
        warning = proc.stderr.readline()
        assert "WARNING: the upstream" in warning and "cannot connect" in warning, warning
        req = urllib.request.Request(
            url + "/v1/completions",
            method="POST",
            data=json.dumps({"model": "m", "prompt": "hi"}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(req, timeout=10).read()
        except (urllib.error.URLError, ConnectionError):
            pass  # the client sees the connection close, as without the proxy
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    last = rest.strip().splitlines()[-1]
    assert "(1 failed, last: upstream connect failed:" in last, rest
