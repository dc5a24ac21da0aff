"""scripts/demo.sh with a server it did not start already on its port (``CORRAL_SERVER_PORT``): it says so,
uses it and leaves it running."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


class _Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_demo_says_it_reuses_a_server_it_did_not_start(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(HOME=str(tmp_path), CORRAL_CONFIG_DIR=str(tmp_path / "cli"), CORRAL_SERVER_PORT=str(port))
    try:
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "demo.sh")], env=env, capture_output=True, text=True, timeout=300
        )
        out = proc.stdout + proc.stderr
        assert f"A server this script did not start already answers on port {port}" in out, out
        assert "leaving it running" in out and "CORRAL_SERVER_PORT=" in out
        assert "Starting corral server" not in out
        # This stand-in is no corral server, and the CLI has no project for it: the demo stops there.
        assert proc.returncode != 0
        assert thread.is_alive()
    finally:
        server.shutdown()
        thread.join()


def test_the_port_variable_is_the_one_the_server_reads() -> None:
    for path in (REPO / "README.md", REPO / "scripts" / "demo.sh"):
        text = path.read_text()
        assert "CORRAL_PORT" not in text, path
    assert "CORRAL_SERVER_PORT" in (REPO / "scripts" / "demo.sh").read_text()
    assert '"CORRAL_SERVER_PORT"' in (REPO / "src" / "corral" / "cli" / "main.py").read_text()


def test_the_demo_runs_the_example_task_and_prints_only_corral_and_the_job(tmp_path: Path) -> None:
    """The README's first command, end to end on the embedded default: the server, the example fleet and task,
    the task's output. With every Python warning on, nothing a dependency says reaches the terminal (asyncssh,
    imported by the attached apply, warns about DSA at import)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(HOME=str(tmp_path), CORRAL_SERVER_PORT=str(port), PYTHONWARNINGS="default", TMPDIR=str(tmp_path))
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "demo.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Hello from hello-corral (node 0 of 1)" in out and "step 3" in out and "Exited (0)" in out, out
    assert "Warning" not in out and "DSA" not in out, out
    assert "Traceback" not in out and "Error" not in out, out
