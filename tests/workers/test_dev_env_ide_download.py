"""A dev environment with an IDE ``version`` downloads the IDE's server from the base URL the server is
configured with (``CORRAL_IDE_DOWNLOAD_URL``; here a small archive served from loopback), unpacks it where
the IDE looks for it and installs its extensions with it, then prints the IDE link; a failed download fails
the job saying so."""

from __future__ import annotations

import base64
import io
import tarfile
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from server_harness import RunningServer, fleet_body, get_run, make_settings, running_server, wait_for

COMMIT = "0123abcd"
CODE_SERVER = b'#!/bin/sh\necho "code-server called with $*" >> "$HOME/code-server.calls"\n'


def _archive() -> bytes:
    """A stand-in for VS Code's server archive: one top directory (stripped when unpacked), ``bin/code-server``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data, mode in (
            ("vscode-server-linux-x64/bin/code-server", CODE_SERVER, 0o755),
            ("vscode-server-linux-x64/product.json", b'{"commit": "0123abcd"}\n', 0o644),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture
def mirror() -> Iterator[tuple[str, list[str]]]:
    archive, asked = _archive(), []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            if self.path.startswith(f"/commit:{COMMIT}/server-linux-") and self.path.endswith("/stable"):
                self.send_response(200)
                self.send_header("Content-Length", str(len(archive)))
                self.end_headers()
                self.wfile.write(archive)
            else:
                self.send_error(404)

        def log_message(self, *args: Any) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", asked
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
async def server(tmp_path: Path, mirror: tuple[str, list[str]]) -> AsyncIterator[RunningServer]:
    async with running_server(make_settings(tmp_path, ide_download_url=mirror[0] + "/")) as s:
        yield s


def _dev(name: str, version: str, home: Path) -> dict[str, Any]:
    conf = {
        "type": "dev-environment",
        "name": name,
        "ide": "vscode",
        "version": version,
        # no pip on PATH: the ipykernel step (which would try the network) finds none, as on a bare host
        "env": {"HOME": str(home), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        "init": [f"ls ~/.vscode-server/bin/{version}/bin", f"cat ~/.vscode-server/bin/{version}/product.json"],
        "resources": {"cpu": "1..", "memory": "0.1GB.."},
    }
    return {"force": False, "plan": {"run_spec": {"configuration": conf}}}


async def _output(c: Any, name: str) -> str:
    run = await get_run(c, name)
    sub = run["latest_job_submission"]["id"]
    r = await c.post("/api/project/main/logs/poll", json={"run_name": name, "job_submission_id": sub, "limit": 1000})
    return b"".join(base64.b64decode(x["message"]) for x in r.json()["logs"]).decode(errors="replace")


async def test_the_ide_server_comes_from_the_configured_mirror(
    server: RunningServer, mirror: tuple[str, list[str]], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    async with server.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body())).status_code == 200
        assert (await c.post("/api/project/main/runs/apply", json=_dev("ide-ok", COMMIT, home))).status_code == 200

        async def linked() -> str | None:
            out = await _output(c, "ide-ok")
            return out if "vscode://vscode-remote/ssh-remote+ide-ok" in out else None

        out = await wait_for(linked, timeout=60)
        assert "code-server" in out and '"commit": "0123abcd"' in out, out
        calls = (home / "code-server.calls").read_text()
        assert "--install-extension" in calls, calls  # the extensions dstack installs, with the server
        assert any(p.startswith(f"/commit:{COMMIT}/server-linux-") for p in mirror[1]), mirror[1]
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["ide-ok"], "abort": True})

        r = await c.post("/api/project/main/runs/apply", json=_dev("ide-missing", "fedcba98", home))
        assert r.status_code == 200, r.text

        async def finished() -> dict[str, Any] | None:
            run = await get_run(c, "ide-missing")
            return run if run["status"] in ("failed", "done", "terminated") else None

        run = await wait_for(finished, timeout=60)
        assert run["status"] == "failed", run["latest_job_submission"]
        out = await _output(c, "ide-missing")
        assert "the VS Code server download failed" in out and "CORRAL_IDE_DOWNLOAD_URL" in out, out
