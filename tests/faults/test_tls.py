"""``--insecure``: a self-signed TLS endpoint is refused with one line by default and
accepted with it, on the probe and on the replay's own session."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
from aiohttp import web

from agent_replay.errors import TargetError
from agent_replay.replay.client import make_session
from agent_replay.replay.target import probe


@pytest.fixture
async def tls_url(tmp_path: Path) -> str:  # type: ignore[misc]
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a self-signed certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tls-model"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"https://127.0.0.1:{port}"
    await runner.cleanup()


async def test_insecure_accepts_a_self_signed_server(tls_url: str) -> None:
    with pytest.raises(TargetError, match="certificate not trusted .* --insecure"):
        await probe(tls_url)
    info = await probe(tls_url, insecure=True)
    assert info.models == ["tls-model"]
    session = make_session(10, insecure=True)
    try:
        async with session.get(tls_url + "/v1/models") as r:
            assert r.status == 200
    finally:
        await session.close()
