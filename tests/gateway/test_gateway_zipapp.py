"""The gateway ships as a stdlib-only zipapp, reproducible and cached by content, that runs under ``python3 -I``."""

from __future__ import annotations

import ast
import http.client
import json
import socket
import ssl
import subprocess
from pathlib import Path

from gw_harness import GOOD, GatewayProc, PrivateCA, StandIn, base_python, free_port, service_body

import corral.gateway
from corral.gateway.zipapp import build_zipapp, content_hash
from old_python import OLDEST_PYTHON, find_python
from skip_policy import platform_skipif

GATEWAY_DIR = Path(corral.gateway.__file__).parent


def test_build_is_reproducible_and_cached_by_content(tmp_path: Path) -> None:
    one = build_zipapp(tmp_path / "a" / "corral-gateway.pyz")
    two = build_zipapp(tmp_path / "b" / "corral-gateway.pyz")
    assert one.read_bytes() == two.read_bytes()
    assert one.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    assert content_hash().encode() in one.read_bytes()
    mtime = one.stat().st_mtime_ns
    assert build_zipapp(one) == one and one.stat().st_mtime_ns == mtime
    one.write_bytes(b"garbage")
    build_zipapp(one)
    assert one.read_bytes() == two.read_bytes()


def test_zipapp_imports_only_the_standard_library(tmp_path: Path) -> None:
    pyz = build_zipapp(tmp_path / "corral-gateway.pyz")
    modules = [
        f"corral.gateway.{p.relative_to(GATEWAY_DIR).with_suffix('').as_posix().replace('/', '.')}"
        for p in sorted(GATEWAY_DIR.rglob("*.py"))
        if p.name not in ("__init__.py", "__main__.py")
    ]
    code = (
        "import sys, json, importlib; sys.path.insert(0, sys.argv[1]);"
        f"[importlib.import_module(m) for m in {modules!r}];"
        "import corral, corral.gateway;"
        "print(json.dumps({'mods': sorted(sys.modules), 'stdlib': sorted(sys.stdlib_module_names),"
        " 'file': corral.gateway.__file__, 'version': corral.__version__}))"
    )
    out = subprocess.run([base_python(), "-I", "-S", "-c", code, str(pyz)], capture_output=True, check=True, timeout=30)
    data = json.loads(out.stdout)
    assert str(pyz) in data["file"], "corral.gateway must come from the zipapp"
    assert data["version"] == corral.__version__
    mods = set(data["mods"])
    assert {m for m in mods if m.startswith("corral")} <= {"corral", "corral.gateway", "corral.gateway.core", *modules}
    foreign = {m.split(".")[0] for m in mods} - set(data["stdlib"]) - {"corral", "__main__"}
    assert not foreign, foreign


def test_gateway_sources_parse_as_python_39() -> None:
    for path in GATEWAY_DIR.rglob("*.py"):
        source = path.read_text()
        ast.parse(source, filename=str(path), feature_version=(3, 9))
        assert "from __future__ import annotations" in source or path.name == "__init__.py", path


def test_the_command_line_refuses_bad_flags(tmp_path: Path) -> None:
    pyz = build_zipapp(tmp_path / "corral-gateway.pyz")
    (tmp_path / "token").write_text("t\n")
    base = [base_python(), "-I", str(pyz), "serve", "--state-dir", str(tmp_path / "s"), "--token-file"]
    out = subprocess.run(
        [*base, str(tmp_path / "token"), "--management", "0.0.0.0:8090"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "--management '0.0.0.0:8090' must be a loopback address" in out.stderr
    out = subprocess.run(
        [*base, str(tmp_path / "token"), "--management", "127.0.0.1:1", "--http", "nowhere"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "--http 'nowhere' must be ADDRESS:PORT" in out.stderr
    out = subprocess.run(
        [*base, str(tmp_path / "missing"), "--management", "127.0.0.1:1"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "cannot read the token file" in out.stderr


_OLD_PYTHON = find_python(OLDEST_PYTHON)


@platform_skipif(_OLD_PYTHON is None, f"no Python {OLDEST_PYTHON} interpreter here (Debian 12 ships only 3.11)")
def test_zipapp_serves_under_the_oldest_supported_python(tmp_path: Path) -> None:
    assert _OLD_PYTHON is not None
    stand_in = StandIn()
    https_port = free_port()
    g = GatewayProc(
        tmp_path / "gw",
        http=f"127.0.0.1:{free_port()}",
        https=f"127.0.0.1:{https_port}",
        management=f"127.0.0.1:{free_port()}",
        python=_OLD_PYTHON,
    ).start()
    try:
        ca = PrivateCA(tmp_path)
        g.ok("PUT", "/api/config", {"server_url": stand_in.url, "secret": "s"})
        g.ok("PUT", "/api/services/p/r", service_body("a.gw.test", auth=True))
        chain, key, _ = ca.issue("a.gw.test")
        g.ok("PUT", "/api/certificates/a.gw.test", {"fullchain_pem": chain, "key_pem": key})
        assert g.mgmt("PUT", "/api/services/p/r", {"host": "a.gw.test"})[0] == 400
        ctx = ssl.create_default_context(cafile=str(ca.path))
        conn = http.client.HTTPSConnection("127.0.0.1", https_port, timeout=10, context=ctx)
        conn.sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", https_port)), server_hostname="a.gw.test")
        conn.request("GET", "/old", headers={"Host": "a.gw.test", "Authorization": GOOD})
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["path"] == "/proxy/services/p/r/old"
        conn.close()
        assert g.stop() == 0
    finally:
        stand_in.close()
        if g.proc is not None and g.proc.poll() is None:
            g.proc.kill()
    assert (
        f"Python {OLDEST_PYTHON}" in subprocess.run([_OLD_PYTHON, "--version"], capture_output=True, text=True).stdout
    )
