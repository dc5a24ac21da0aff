"""The gateway's data path and management API, with the zipapp running on loopback ports (no root needed) in
front of a stand-in corral server: rate limits, auth and its cache, streaming, websockets, body limits, the model
endpoint, stats, and the management API's authentication and validation."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gw_harness import GOOD, SLOW, TOKEN, GatewayProc, PrivateCA, StandIn, free_port, service_body


@pytest.fixture(scope="module")
def stand_in() -> Iterator[StandIn]:
    s = StandIn()
    yield s
    s.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, stand_in: StandIn) -> Iterator[GatewayProc]:
    g = GatewayProc(
        tmp_path_factory.mktemp("gw"),
        http=f"127.0.0.1:{free_port()}",
        https=f"127.0.0.1:{free_port()}",
        management=f"127.0.0.1:{free_port()}",
    ).start()
    g.ok("PUT", "/api/config", {"server_url": stand_in.url, "secret": "gw-secret"})
    yield g
    assert g.stop() == 0


def _port(g: GatewayProc) -> int:
    return int(g.http.rsplit(":", 1)[1])


def request(
    g: GatewayProc, host: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", _port(g), timeout=15)
    try:
        conn.request(method, path, body=body, headers={"Host": host, **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def stats_of(g: GatewayProc, run: str) -> dict[str, Any]:
    services = g.ok("GET", "/api/stats")["services"]
    found: dict[str, Any] = next(s["stats"] for s in services if s["run"] == run)
    return found


def put_service(g: GatewayProc, run: str, **fields: Any) -> str:
    host = f"{run}.gw.test"
    body = {**service_body(host, https=False), "upstream_path": f"/proxy/services/p/{run}/", **fields}
    g.ok("PUT", f"/api/services/p/{run}", body)
    return host


def test_forwarding_keeps_the_request_and_adds_the_gateway_secret(gateway: GatewayProc, stand_in: StandIn) -> None:
    host = put_service(gateway, "echo")
    status, body, _ = request(
        gateway, host, "POST", "/v1/x?a=b", b'{"k": 1}', {"X-Corral-Gateway": "forged", "Authorization": "Bearer t"}
    )
    seen = json.loads(body)
    assert status == 200
    assert seen["method"] == "POST" and seen["path"] == "/proxy/services/p/echo/v1/x?a=b" and seen["body"] == '{"k": 1}'
    assert seen["headers"]["X-Corral-Gateway"] == "gw-secret", "a client cannot forge the gateway's header"
    assert seen["headers"]["Authorization"] == "Bearer t" and seen["headers"]["X-Real-IP"] == "127.0.0.1"
    assert seen["headers"]["Host"] == host
    # keep-alive: two requests on one client connection
    conn = http.client.HTTPConnection("127.0.0.1", _port(gateway), timeout=15)
    for i in range(2):
        conn.request("GET", f"/k{i}", headers={"Host": host})
        assert json.loads(conn.getresponse().read())["path"] == f"/proxy/services/p/echo/k{i}"
    conn.close()
    # bodies larger than a read, with a length or chunked, arrive whole
    big = bytes(range(256)) * 8192  # 2 MiB
    status, body, _ = request(gateway, host, "PUT", "/big", big.hex().encode())
    assert status == 200 and json.loads(body)["body"] == big.hex()
    conn = http.client.HTTPConnection("127.0.0.1", _port(gateway), timeout=15)
    conn.request("POST", "/chunks", body=iter([b"a" * 70000, b"b" * 3, b"c" * 100000]), headers={"Host": host})
    assert json.loads(conn.getresponse().read())["body"] == "a" * 70000 + "bbb" + "c" * 100000
    conn.close()
    # a dot segment could climb out of the service's upstream path
    assert request(gateway, host, "GET", "/a/../../other/r/x")[0] == 400


def test_connections_to_the_server_are_kept_alive_and_renewed(gateway: GatewayProc, stand_in: StandIn) -> None:
    host = put_service(gateway, "pooled")
    peers = [json.loads(request(gateway, host, "GET", f"/{i}")[1])["peer"] for i in range(3)]
    assert peers[0] == peers[1] == peers[2], "one upstream connection for requests one after another"
    stand_in.drop_connections()  # the server closes its idle connections
    time.sleep(0.2)
    status, body, _ = request(gateway, host, "POST", "/after", b"body")
    assert status == 200 and json.loads(body)["body"] == "body" and json.loads(body)["peer"] != peers[0]
    stand_in.drop_connections()
    status, body, _ = request(gateway, host, "GET", "/again")  # however fast: a request without a body is resent
    assert status == 200


def raw_exchange(g: GatewayProc, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", _port(g)), timeout=5) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_malformed_requests_and_interim_answers(gateway: GatewayProc, stand_in: StandIn) -> None:
    host = put_service(gateway, "strict")
    before = len(stand_in.requests)
    for bad in (
        f"GET / HTTP/1.1\r\nHost: {host}\r\nX-A: a\nX-Injected: b\r\n\r\n",
        f"POST / HTTP/1.1\r\nHost: {host}\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        f"POST / HTTP/1.1\r\nHost: {host}\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        f"GET / HTTP/1.1\r\nHost: {host}\r\n Folded: x\r\n\r\n",
        "GET /\x00 HTTP/1.1\r\n\r\n",
        "NOT HTTP\r\n\r\n",
    ):
        assert raw_exchange(gateway, bad.encode()).startswith(b"HTTP/1.1 400"), bad
    assert len(stand_in.requests) == before, "nothing malformed reached the server"
    status, body, _ = request(gateway, host, "GET", "/early")
    assert (status, body) == (200, b"after hints")
    assert request(gateway, host, "GET", "/rogue-upgrade")[0] == 502


def test_auth_403_and_the_60s_cache(gateway: GatewayProc, stand_in: StandIn) -> None:
    host = put_service(gateway, "authed", auth=True)
    expected = b"Unauthenticated or unauthorized to access project p\n"
    checks = len(stand_in.token_checks)
    assert request(gateway, host, "GET", "/")[:2] == (403, expected)
    assert len(stand_in.token_checks) == checks, "no token: refused without asking the server"
    assert request(gateway, host, "GET", "/", headers={"Authorization": "Bearer bad"})[:2] == (403, expected)
    assert stand_in.token_checks[-1] == ("p", "Bearer bad")
    assert request(gateway, host, "GET", "/ok", headers={"Authorization": GOOD})[0] == 200
    asked = len(stand_in.token_checks)
    assert request(gateway, host, "GET", "/ok2", headers={"Authorization": GOOD})[0] == 200
    assert request(gateway, host, "GET", "/", headers={"Authorization": "Bearer bad"})[0] == 403
    assert len(stand_in.token_checks) == asked, "both answers came from the cache"
    assert stats_of(gateway, "authed")["30"]["requests"] == 2, "refusals are not hits"


def test_concurrent_requests_with_one_token_ask_the_server_once(gateway: GatewayProc, stand_in: StandIn) -> None:
    host = put_service(gateway, "herd", auth=True)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(
            pool.map(lambda i: request(gateway, host, "GET", f"/{i}", headers={"Authorization": SLOW})[0], range(8))
        )
    assert statuses == [403] * 8
    assert stand_in.token_checks.count(("p", SLOW)) == 1


def test_rate_limits_429_longest_prefix_and_not_counted(gateway: GatewayProc, stand_in: StandIn) -> None:
    # one request a minute (the lowest rate): the refusals below cannot depend on how fast the machine is; the
    # bucket's refill is unit-tested with the clock given (tests/gateway/core/test_ratelimit.py)
    rps = 1 / 60
    host = put_service(
        gateway,
        "limited",
        auth=True,
        rate_limits=[
            {"prefix": "/", "key": {"type": "ip_address"}, "rps": rps},
            {"prefix": "/burst", "key": {"type": "ip_address"}, "rps": rps, "burst": 3},
            {"prefix": "/hdr", "key": {"type": "header", "header": "X-User"}, "rps": rps},
        ],
    )
    good = {"Authorization": GOOD}
    assert request(gateway, host, "GET", "/a", headers=good)[0] == 200
    assert request(gateway, host, "GET", "/b", headers={"Authorization": "Bearer other"})[0] == 429
    assert ("p", "Bearer other") not in stand_in.token_checks, "the 429 came before any token check"
    assert [request(gateway, host, "GET", "/burst/x", headers=good)[0] for _ in range(5)] == [200] * 4 + [429]
    # a header key: each value has its own bucket; without the header, no limit applies
    assert request(gateway, host, "GET", "/hdr", headers={**good, "X-User": "u1"})[0] == 200
    assert request(gateway, host, "GET", "/hdr", headers={**good, "X-User": "u1"})[0] == 429
    assert request(gateway, host, "GET", "/hdr", headers={**good, "X-User": "u2"})[0] == 200
    assert request(gateway, host, "GET", "/hdr", headers=good)[0] == 200
    assert stats_of(gateway, "limited")["60"]["requests"] == 1 + 4 + 3, "429s are not hits"
    # a changed limit applies at once
    put_service(gateway, "limited", auth=True, rate_limits=[{"prefix": "/", "key": {"type": "ip_address"}, "rps": 100}])
    assert request(gateway, host, "GET", "/c", headers=good)[0] == 200


def test_server_sent_events_arrive_one_by_one(gateway: GatewayProc, stand_in: StandIn) -> None:
    host = put_service(gateway, "stream")
    stand_in.next_event.clear()
    with socket.create_connection(("127.0.0.1", _port(gateway)), timeout=5) as s:
        s.sendall(f"GET /sse HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        while b"data: one" not in data:  # the stand-in holds the second event until the test saw the first
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        assert b"data: two" not in data and b"transfer-encoding: chunked" in data.lower()
        stand_in.next_event.set()
        while not data.endswith(b"0\r\n\r\n"):
            data += s.recv(65536)
    assert b"data: two" in data


def test_websocket_upgrade_is_relayed_both_ways(gateway: GatewayProc) -> None:
    host = put_service(gateway, "ws")
    with socket.create_connection(("127.0.0.1", _port(gateway)), timeout=5) as s:
        s.sendall(
            f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(1)
        assert head.startswith(b"HTTP/1.1 101") and b"upgrade: websocket" in head.lower()
        for word in (b"hello", b"again"):
            s.sendall(word)
            got = b""
            while len(got) < len(word):
                got += s.recv(64)
            assert got == word.upper()


def test_client_max_body_size_and_read_timeout(gateway: GatewayProc, stand_in: StandIn) -> None:
    host = put_service(gateway, "small", client_max_body_size=10, read_timeout=1)
    before = len(stand_in.requests)
    assert request(gateway, host, "POST", "/up", b"x" * 11)[0] == 413
    assert request(gateway, host, "POST", "/up", b"x" * 10)[0] == 200
    with socket.create_connection(("127.0.0.1", _port(gateway)), timeout=5) as s:
        s.sendall(f"POST /up HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n".encode())
        s.sendall(b"8\r\n12345678\r\n0\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 413")
    assert len(stand_in.requests) - before in (1, 2), "the 11-byte body never left the gateway"
    started = time.monotonic()
    assert request(gateway, host, "GET", "/slow")[0] == 504  # the stand-in answers after 5 s
    assert time.monotonic() - started < 4


def test_model_endpoint_with_and_without_v1(gateway: GatewayProc, stand_in: StandIn) -> None:
    gateway.ok("PUT", "/api/entrypoints/gateway.gw.test", {"project": "p", "https": False})
    good = {"Authorization": GOOD}
    for path, upstream in (
        ("/models", "/proxy/models/p/models"),
        ("/v1/models", "/proxy/models/p/models"),
        ("/chat/completions", "/proxy/models/p/chat/completions"),
        ("/v1/chat/completions", "/proxy/models/p/chat/completions"),
    ):
        status, body, _ = request(gateway, "gateway.gw.test", "POST", path, b"{}", good)
        assert (status, json.loads(body)["path"]) == (200, upstream)
    assert request(gateway, "gateway.gw.test", "GET", "/models")[0] == 403, "a token is always required"
    assert request(gateway, "gateway.gw.test", "GET", "/other", headers=good)[0] == 404
    gateway.ok("DELETE", "/api/entrypoints/gateway.gw.test")
    assert request(gateway, "gateway.gw.test", "GET", "/models", headers=good)[0] == 404


def test_stats_count_forwarded_requests_in_every_window(gateway: GatewayProc) -> None:
    host = put_service(gateway, "counted")
    assert stats_of(gateway, "counted") == {w: {"requests": 0, "request_time": 0.0} for w in ("30", "60", "300")}
    for _ in range(3):
        request(gateway, host, "GET", "/")
    request(gateway, "nobody.gw.test", "GET", "/")
    stats = stats_of(gateway, "counted")
    assert {w: s["requests"] for w, s in stats.items()} == {"30": 3, "60": 3, "300": 3}
    assert 0 < stats["30"]["request_time"] < 1
    # one the server counted itself (held at zero replicas, it says so): not counted twice, the header kept back
    status, body, headers = request(gateway, host, "GET", "/held")
    assert (status, body) == (200, b"held") and "x-corral-counted" not in headers, headers
    assert stats_of(gateway, "counted")["30"]["requests"] == 3
    gateway.ok("DELETE", "/api/services/p/counted")
    assert all(s["run"] != "counted" for s in gateway.ok("GET", "/api/stats")["services"])


def test_management_api_needs_its_token(gateway: GatewayProc) -> None:
    for token in (None, "wrong"):
        status, body = gateway.mgmt("GET", "/api/health", token=token)
        assert status == 401 and "Bearer" in body["detail"]
    assert gateway.mgmt("PUT", "/api/config", {"server_url": "http://127.0.0.1:1", "secret": "x"}, token=None)[0] == 401
    health = gateway.ok("GET", "/api/health")
    assert set(health) == {"version", "started_at"}
    for method, path in (("GET", "/api/nothing"), ("DELETE", "/api/certificates/a.t"), ("GET", "/api/config")):
        assert gateway.mgmt(method, path)[0] == 404, (method, path)
    assert gateway.mgmt("PUT", "/api/", {})[0] == 404
    assert gateway.mgmt("GET", "/elsewhere")[0] == 404


@pytest.mark.parametrize(
    ("path", "body", "detail"),
    [
        ("/api/services/p/r", {"https": True, "auth": True, "upstream_path": "/x/"}, "service.host is required"),
        ("/api/services/p/r", service_body("a.t", extra=1), "unknown field 'extra'"),
        ("/api/services/p/r", service_body("bad host", https=True), "service.host 'bad host' is not a valid host"),
        ("/api/services/p/r", {**service_body("a.t"), "https": "yes"}, "service.https must be true or false"),
        (
            "/api/services/p/r",
            service_body("a.t", rate_limits=[{"prefix": "/{x}", "key": {"type": "ip_address"}, "rps": 1}]),
            "service.rate_limits[0].prefix",
        ),
        (
            "/api/services/p/r",
            service_body("a.t", rate_limits=[{"key": {"type": "cookie"}, "rps": 1}]),
            "service.rate_limits[0].key.type must be 'ip_address' or 'header'",
        ),
        ("/api/services/p/r", service_body("a.t", read_timeout=0), "service.read_timeout must be an integer >= 1"),
        ("/api/services/p/r", b"{not json", "the body is not JSON"),
        ("/api/services/p/r", [1], "service: the body must be a JSON object"),
        ("/api/config", {"server_url": "https://x", "secret": "s"}, "config.server_url 'https://x' must be http://"),
        ("/api/entrypoints/gateway.t", {"project": "p"}, "entrypoint.https is required"),
        ("/api/challenges/bad!token", {"key_authorization": "a.b"}, "challenge token 'bad!token'"),
        ("/api/certificates/a.t", {"fullchain_pem": "nothing", "key_pem": "x"}, "certificate.fullchain_pem holds no"),
    ],
)
def test_management_api_names_the_field_of_a_bad_body(gateway: GatewayProc, path: str, body: Any, detail: str) -> None:
    status, answer = gateway.mgmt("PUT", path, body)
    assert status == 400, answer
    assert detail in answer["detail"]


def test_certificates_are_checked_and_services_idempotent(gateway: GatewayProc, tmp_path: Path) -> None:
    ca = PrivateCA(tmp_path)
    chain, _, _ = ca.issue("cert.gw.test")
    _, other_key, _ = ca.issue("other.gw.test")
    status, answer = gateway.mgmt(
        "PUT", "/api/certificates/cert.gw.test", {"fullchain_pem": chain, "key_pem": other_key}
    )
    assert status == 400 and "certificate.key_pem does not match certificate.fullchain_pem" in answer["detail"]
    status, answer = gateway.mgmt("PUT", "/api/certificates/cert.gw.test", {"fullchain_pem": chain, "key_pem": "x"})
    assert status == 400 and "certificate.key_pem holds no" in answer["detail"]
    assert all(c["host"] != "cert.gw.test" for c in gateway.ok("GET", "/api/certificates")["certificates"])

    put_service(gateway, "same")
    state = gateway.directory / "state" / "state.json"
    mtime = state.stat().st_mtime_ns
    put_service(gateway, "same")
    assert state.stat().st_mtime_ns == mtime, "the same body twice changes nothing"
    status, answer = gateway.mgmt("PUT", "/api/services/q/other", service_body("same.gw.test"))
    assert status == 400 and "already used by the service p/same" in answer["detail"]
    assert gateway.ok("DELETE", "/api/services/p/never") == {}
    assert {"project": "p", "run": "same", "host": "same.gw.test", "https": False} in gateway.ok(
        "GET", "/api/services"
    )["services"]
    assert json.loads(state.read_text())["config"]["secret"] == "gw-secret"
    assert TOKEN not in state.read_text()


def test_sigterm_lets_an_open_stream_finish_and_refuses_new_connections(tmp_path: Path, stand_in: StandIn) -> None:
    g = GatewayProc(
        tmp_path / "gw",
        http=f"127.0.0.1:{free_port()}",
        https=f"127.0.0.1:{free_port()}",
        management=f"127.0.0.1:{free_port()}",
    ).start()
    try:
        g.ok("PUT", "/api/config", {"server_url": stand_in.url, "secret": "s"})
        host = put_service(g, "term")
        stand_in.next_event.clear()
        with socket.create_connection(("127.0.0.1", _port(g)), timeout=5) as s:
            s.sendall(f"GET /sse HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            data = b""
            while b"data: one" not in data:
                data += s.recv(65536)
            assert g.proc is not None
            g.proc.terminate()
            deadline = time.monotonic() + 5
            while True:  # the listeners close at once
                try:
                    socket.create_connection(("127.0.0.1", _port(g)), timeout=1).close()
                except ConnectionRefusedError:
                    break
                assert time.monotonic() < deadline, "still accepting after SIGTERM"
                time.sleep(0.05)
            stand_in.next_event.set()
            while not data.endswith(b"0\r\n\r\n"):
                chunk = s.recv(65536)
                assert chunk, data
                data += chunk
        assert b"data: two" in data
        assert g.stop() == 0
    finally:
        if g.proc is not None and g.proc.poll() is None:
            g.proc.kill()


def test_the_open_files_limit_is_raised_to_the_hard_one(tmp_path: Path) -> None:
    """Started with a soft limit of 256 open files (``prlimit``), the gateway lifts it to the hard limit."""
    g = GatewayProc(
        tmp_path / "gw",
        http=f"127.0.0.1:{free_port()}",
        https=f"127.0.0.1:{free_port()}",
        management=f"127.0.0.1:{free_port()}",
        prefix=["prlimit", "--nofile=256:4096", "--"],
    ).start()
    try:
        assert g.proc is not None
        limits = Path(f"/proc/{g.proc.pid}/limits").read_text()
        soft, hard = next(line.split()[3:5] for line in limits.splitlines() if line.startswith("Max open files"))
        assert (soft, hard) == ("4096", "4096")
        assert "corral gateway" in g.log.read_text() and "(Python 3." in g.log.read_text()
    finally:
        assert g.stop() == 0
