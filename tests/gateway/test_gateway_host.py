"""The gateway on a host of its own: a fake SSH host (a network namespace with its own address, ``fakehosts``)
where the zipapp binds :80 and :443 itself, driven through its management API, with a stand-in corral server
on the host end of the bridge. TLS is checked against the test's own CA only."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gw_harness import GOOD, GatewayProc, PrivateCA, StandIn, service_body, start_relay

from fakehosts import FakeHosts, HostSpec
from skip_policy import needs_root

pytestmark = needs_root("the gateway binds :80/:443 of a network namespace of its own")

MGMT_PORT, RELAY_PORT = 8090, 8091
#: A refused handshake reaches the client as the TLS alert or, when the server's close overtakes it, as a reset.
REFUSED = (ssl.SSLError, ConnectionResetError)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHosts]:
    fh = FakeHosts({"gw": HostSpec()}, tmp_path_factory.mktemp("gw-hosts")).start()
    try:
        yield fh
    finally:
        fh.stop()


@pytest.fixture
def stand_in(host: FakeHosts) -> Iterator[StandIn]:
    s = StandIn(host.gateway)  # the bridge's address: the host end of the path
    yield s
    s.close()


@pytest.fixture
def relay(host: FakeHosts) -> Iterator[None]:
    proc = start_relay(host.netns("gw"), host.ip("gw"), RELAY_PORT, MGMT_PORT)
    yield
    proc.kill()
    proc.wait()


@pytest.fixture
def gateway(tmp_path: Path, host: FakeHosts, relay: None) -> Iterator[GatewayProc]:
    g = GatewayProc(
        tmp_path / "gw",
        http="0.0.0.0:80",
        https="0.0.0.0:443",
        management=f"127.0.0.1:{MGMT_PORT}",
        prefix=["ip", "netns", "exec", host.netns("gw")],
        mgmt_via=(host.ip("gw"), RELAY_PORT),
    ).start()
    yield g
    if g.proc is not None and g.proc.poll() is None:
        g.stop()


def _get(
    ip: str, host: str, path: str, port: int = 80, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(ip, port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host, **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _tls_get(ip: str, host: str, ca: Path, path: str = "/") -> tuple[int, bytes, Any]:
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((ip, 443), timeout=10) as raw, ctx.wrap_socket(raw, server_hostname=host) as s:
        peer = s.getpeercert()
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {GOOD}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body, peer


def _subject_cn(peer: Any) -> str:
    return str(next(value for rdn in peer["subject"] for key, value in rdn if key == "commonName"))


def test_sni_certificates_redirect_challenge_and_plain_http(
    gateway: GatewayProc, host: FakeHosts, stand_in: StandIn, tmp_path: Path
) -> None:
    ip = host.ip("gw")
    ca = PrivateCA(tmp_path)
    gateway.ok("PUT", "/api/config", {"server_url": stand_in.url, "secret": "s3cret"})
    gateway.ok("PUT", "/api/services/p/r", service_body("a.gw.test", auth=True))
    gateway.ok(
        "PUT",
        "/api/services/p/plain",
        {**service_body("plain.gw.test", https=False), "upstream_path": "/proxy/services/p/plain/"},
    )
    gateway.ok("PUT", "/api/services/p/b", {**service_body("b.gw.test"), "upstream_path": "/proxy/services/p/b/"})
    for name in ("a.gw.test", "b.gw.test"):
        chain, key, not_after = ca.issue(name)
        answer = gateway.ok("PUT", f"/api/certificates/{name}", {"fullchain_pem": chain, "key_pem": key})
        assert answer == {"not_after": not_after.strftime("%Y-%m-%dT%H:%M:%SZ")}

    # :443: each name gets its own certificate, checked against the test CA alone
    for name in ("a.gw.test", "b.gw.test"):
        status, body, peer = _tls_get(ip, name, ca.path, "/hello?x=1")
        assert _subject_cn(peer) == name
        assert status == 200
    assert stand_in.requests[-2]["path"] == "/proxy/services/p/r/hello?x=1"
    assert stand_in.requests[-2]["headers"]["X-Corral-Gateway"] == "s3cret"
    assert stand_in.requests[-2]["headers"]["Authorization"] == GOOD
    # the system's trust store does not know the test CA (negative control)
    with socket.create_connection((ip, 443), timeout=10) as raw, pytest.raises(ssl.SSLCertVerificationError):
        ssl.create_default_context().wrap_socket(raw, server_hostname="a.gw.test")
    # a name without a certificate (and no name at all) gets no handshake: there is no default certificate
    for name in ("unknown.gw.test", "plain.gw.test"):
        with socket.create_connection((ip, 443), timeout=10) as raw, pytest.raises(REFUSED):
            ssl.create_default_context(cafile=str(ca.path)).wrap_socket(raw, server_hostname=name)
    no_sni = ssl.create_default_context(cafile=str(ca.path))
    no_sni.check_hostname = False
    with socket.create_connection((ip, 443), timeout=10) as raw, pytest.raises(REFUSED):
        no_sni.wrap_socket(raw)

    # :80: https services are redirected, an https: false service is served, unknown hosts get 404
    status, headers, _ = _get(ip, "a.gw.test", "/path?q=1")
    assert (status, headers["location"]) == (301, "https://a.gw.test/path?q=1")
    status, _, body = _get(ip, "plain.gw.test", "/x")
    assert status == 200 and json.loads(body)["path"] == "/proxy/services/p/plain/x"
    assert _get(ip, "nobody.gw.test", "/")[0] == 404

    # ACME HTTP-01: a published challenge is served (to any host name), a withdrawn one is gone
    gateway.ok("PUT", "/api/challenges/tok-123_x", {"key_authorization": "tok-123_x.thumb"})
    status, headers, body = _get(ip, "c.gw.test", "/.well-known/acme-challenge/tok-123_x")
    assert (status, body) == (200, b"tok-123_x.thumb") and headers["content-type"].startswith("text/plain")
    gateway.ok("DELETE", "/api/challenges/tok-123_x")
    assert _get(ip, "c.gw.test", "/.well-known/acme-challenge/tok-123_x")[0] == 404


def test_a_restarted_gateway_serves_its_stored_certificate(
    gateway: GatewayProc, host: FakeHosts, stand_in: StandIn, tmp_path: Path
) -> None:
    ip = host.ip("gw")
    ca = PrivateCA(tmp_path)
    gateway.ok("PUT", "/api/config", {"server_url": stand_in.url, "secret": "s3cret"})
    gateway.ok("PUT", "/api/services/p/r", service_body("a.gw.test"))
    chain, key, _ = ca.issue("a.gw.test")
    gateway.ok("PUT", "/api/certificates/a.gw.test", {"fullchain_pem": chain, "key_pem": key})
    assert gateway.stop() == 0  # SIGTERM: a clean exit
    assert "stopped" in gateway.log.read_text()

    gateway.start()
    status, _, peer = _tls_get(ip, "a.gw.test", ca.path, "/again")
    assert (status, _subject_cn(peer)) == (200, "a.gw.test")
    assert stand_in.requests[-1]["path"] == "/proxy/services/p/r/again"
    assert gateway.ok("GET", "/api/services")["services"] == [
        {"project": "p", "run": "r", "host": "a.gw.test", "https": True}
    ]
    certs = gateway.ok("GET", "/api/certificates")["certificates"]
    assert [c["host"] for c in certs] == ["a.gw.test"]
    state = (gateway.directory / "state" / "certs" / "a.gw.test.key").stat()
    assert state.st_mode & 0o077 == 0, "the key is readable by its owner only"


def test_the_zipapp_needs_only_the_hosts_python(host: FakeHosts, tmp_path: Path) -> None:
    """On the host itself (its own root, no virtualenv), the zipapp runs under the host's ``python3 -I``."""
    pyz = GatewayProc(tmp_path / "gw", "0.0.0.0:80", "0.0.0.0:443", "127.0.0.1:8090").pyz
    out = host.exec("gw", "cat > /tmp/g.pyz && python3 -I /tmp/g.pyz serve --help", input=pyz.read_bytes())
    assert out.returncode == 0, out.stderr
    assert b"--management" in out.stdout and b"--state-dir" in out.stdout
