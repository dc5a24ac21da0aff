"""scripts/check_yaml_corpus.py: the local mode passes on the real corpus and fails on a wrong
one; the HTTP mode posts each configuration to the right endpoint and judges status codes."""

from __future__ import annotations

import http.server
import importlib.util
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_yaml_corpus.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_yaml_corpus", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_corpus(directory: Path, accepted: list[Any], rejected: list[Any]) -> None:
    (directory / "dstack-yaml-corpus.json").write_text(json.dumps(accepted))
    (directory / "dstack-yaml-rejected.json").write_text(json.dumps(rejected))


def test_local_mode_passes_on_the_real_corpus() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "accepted: 261/261 pass; rejected: 13/13 rejected" in proc.stdout


def test_local_mode_reports_each_failure(tmp_path: Path) -> None:
    good = {"source": "a.md", "config": {"type": "task", "commands": ["x"]}}
    bad = {"source": "b.md", "config": {"type": "task", "commands": ["x"], "resources": {"gpu": "A100:xx"}}}
    wrongly_ok = {"source": "c.md", "config": {"type": "task", "image": "ubuntu"}}
    _write_corpus(tmp_path, [good, bad], [wrongly_ok])
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--reference-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "ACCEPTED b.md (type=task, name=None): resources.gpu: invalid GPU spec 'A100:xx'" in proc.stdout
    assert "REJECTED c.md" in proc.stdout
    assert "accepted: 1/2 pass; rejected: 0/1 rejected" in proc.stdout


class _FakeServer(http.server.BaseHTTPRequestHandler):
    """Answers 422 to configurations named `bad*`, 400 to `missing*`, 500 to `boom*`, else 200."""

    seen: list[tuple[str, str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _FakeServer.seen.append((self.path, self.headers["Authorization"], body))
        conf = (
            body.get("run_spec", {}).get("configuration")
            or body.get("spec", {}).get("configuration")
            or body.get("configuration")
        )
        name = conf.get("name") or ""
        status = 200
        for prefix, code in (("bad", 422), ("missing", 400), ("boom", 500)):
            if name.startswith(prefix):
                status = code
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def fake_server() -> Iterator[str]:
    _FakeServer.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_http_mode_posts_to_plan_endpoints(tmp_path: Path, fake_server: str) -> None:
    accepted = [
        {"source": "t", "config": {"type": "task", "name": "t1", "commands": ["x"]}},
        {"source": "f", "config": {"type": "fleet", "name": "missing-backend", "nodes": 1}},
        {"source": "g", "config": {"type": "gateway", "name": "g", "backend": "aws", "region": "r"}},
        {"source": "v", "config": {"type": "volume", "name": "v", "backend": "aws", "region": "r"}},
    ]
    rejected = [{"source": "r", "config": {"type": "task", "name": "bad-1"}}]
    _write_corpus(tmp_path, accepted, rejected)
    module = _load_script()
    args = ["--reference-dir", str(tmp_path), "--url", fake_server, "--token", "tok", "--project", "p"]
    assert module.main(args) == 0
    paths = [(path, auth) for path, auth, _ in _FakeServer.seen]
    assert paths == [
        ("/api/project/p/runs/get_plan", "Bearer tok"),
        ("/api/project/p/fleets/get_plan", "Bearer tok"),
        ("/api/project/p/gateways/get_plan", "Bearer tok"),
        ("/api/project/p/volumes/create", "Bearer tok"),
        ("/api/project/p/runs/get_plan", "Bearer tok"),
    ]
    bodies = [body for _, _, body in _FakeServer.seen]
    assert bodies[0] == {"run_spec": {"configuration": accepted[0]["config"]}}
    assert bodies[1] == {"spec": {"configuration": accepted[1]["config"], "profile": {}}}
    assert bodies[2] == {"spec": {"configuration": accepted[2]["config"]}}
    assert bodies[3] == {"configuration": accepted[3]["config"]}


def test_http_mode_fails_on_422_5xx_and_accepted_rejects(
    tmp_path: Path, fake_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    accepted = [
        {"source": "a", "config": {"type": "task", "name": "bad-but-valid", "commands": ["x"]}},
        {"source": "b", "config": {"type": "task", "name": "boom", "commands": ["x"]}},
    ]
    rejected = [{"source": "c", "config": {"type": "task", "name": "fine"}}]
    _write_corpus(tmp_path, accepted, rejected)
    module = _load_script()
    assert module.main(["--reference-dir", str(tmp_path), "--url", fake_server, "--token", "t"]) == 1
    out = capsys.readouterr().out
    assert "-> 422" in out and "-> 500" in out and "expected 422" in out
    assert "accepted: 0/2 pass; rejected: 0/1 rejected" in out
