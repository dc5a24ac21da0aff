"""The API's input edge: the caller is authenticated before a body is read, every route has a body-size
limit (413 before parsing), caps on what a body may hold (depth, lengths, 64-bit integers, ``nodes``,
``replicas``) are 422s naming the field, and the malformed values that used to be 500s are 4xx."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import pytest_asyncio

from corral.api.app import TABLES
from server_harness import RunningServer, make_settings, running_server, task_body

pytestmark = pytest.mark.asyncio(loop_scope="module")

HUGE = 200 * 2**20  # declared: 200 MB, of which the client sends nothing before it waits for the answer
SENT = 64 * 2**10
PUBLIC = {"/healthcheck", "/api/server/get_info", "/api/backends/list_types", "/metrics"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningServer]:
    settings = make_settings(tmp_path_factory.mktemp("edge"), background_processing=False)
    async with running_server(settings) as s:
        yield s


async def _raw(
    s: RunningServer, method: str, path: str, head: dict[str, str], chunks: list[bytes], closing: bool = True
) -> tuple[int, bytes, bool]:
    """Send a request's head and ``chunks`` of its body, then read the answer: (status, body, closed after).
    Without ``closing`` the connection is not waited on (the server keeps an answered one open)."""
    url = urlsplit(s.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {url.netloc}", *(f"{k}: {v}" for k, v in head.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        headers: dict[str, str] = {}
        while (line := await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), 10)
        closed = closing and await asyncio.wait_for(reader.read(1), 10) == b""
        return int(status_line.split()[1]), body, closed
    finally:
        writer.close()


def _path(spec: Any) -> str:
    path = spec.path.replace("{project_name}", "main").replace("{run_name}", "r")
    if spec.query_params:
        path += "?" + "&".join(f"{q}=x" for q in spec.query_params)
    return str(path)


async def test_every_route_authenticates_before_it_reads_a_body(server: RunningServer) -> None:
    """200 MB declared, none of it sent: each route answers at once (a route that read first would wait
    for the body, and time out here) and closes the connection rather than read it."""
    routes = [spec for table in TABLES for spec in table.routes]
    assert len(routes) > 60
    for spec in routes:
        head = {"Content-Type": "application/json", "Content-Length": str(HUGE)}
        status, body, closed = await _raw(server, spec.method, _path(spec), head, [])
        if spec.path in PUBLIC or spec.path.startswith("/api/auth/"):
            assert status < 500, (spec.path, status, body)
        else:
            assert (status, body) == (401, b'{"detail":"Not authenticated"}'), spec.path
        assert closed, f"{spec.path}: the connection stayed open to read the rest of the body"


async def test_an_oversized_body_is_a_413_before_it_is_read(server: RunningServer) -> None:
    auth = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
    started = time.monotonic()
    status, body, closed = await _raw(server, "POST", "/api/runs/list", {**auth, "Content-Length": str(HUGE)}, [])
    assert status == 413 and closed and time.monotonic() - started < 5
    detail = httpx.Response(413, content=body).json()["detail"]
    assert detail[0]["code"] == "error" and "CORRAL_SERVER_REQUEST_BODY_LIMIT" in detail[0]["msg"]
    # without a Content-Length, the server stops once the body streams past the limit (the client sends
    # just past it and no end: an answer proves the server stopped there)
    chunk = b"x" * SENT
    chunked = [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * (server.settings.request_body_limit // SENT + 1)
    status, body, closed = await _raw(
        server, "POST", "/api/runs/list", {**auth, "Transfer-Encoding": "chunked"}, chunked
    )
    assert status == 413 and closed
    # the routes that carry a configuration have the larger limit of their own
    commands = ["echo " + "x" * 150] * 9000  # about 1.4 MB: over the default limit, under the spec one
    async with server.client() as c:
        r = await c.post("/api/project/main/runs/get_plan", json={"run_spec": task_body(commands)["plan"]["run_spec"]})
        assert r.status_code == 200, r.text[:300]
        # a body a little over the limit is read to its end and dropped: the client gets the 413, and the
        # connection serves the next request
        r = await c.post("/api/project/main/runs/list", json={"project_name": "x" * 2**20})
        assert r.status_code == 413
        assert (await c.post("/api/project/main/runs/list", json={})).status_code == 200
    head = {**auth, "Content-Length": str(server.settings.spec_body_limit + 1)}
    status, body, closed = await _raw(server, "POST", "/api/project/main/runs/get_plan", head, [])
    assert status == 413 and closed and b"CORRAL_SERVER_SPEC_BODY_LIMIT" in body


def _loc(r: httpx.Response) -> list[Any]:
    assert r.status_code == 422, r.text[:300]
    return list(r.json()["detail"][0]["loc"])


def _plan(conf: dict[str, Any]) -> dict[str, Any]:
    return {"run_spec": {"configuration": conf}}


async def test_caps_are_422s_naming_the_field(server: RunningServer) -> None:
    async with server.client() as c:
        plan = "/api/project/main/runs/get_plan"
        started = time.monotonic()
        r = await c.post(plan, json=_plan({"type": "task", "commands": ["true"], "nodes": 100000}))
        assert _loc(r) == ["body", "run_spec", "configuration", "nodes"] and time.monotonic() - started < 2
        assert "CORRAL_MAX_NODES" in r.json()["detail"][0]["msg"]
        groups = [{"name": f"g{i}", "nodes": 600, "commands": ["true"]} for i in range(2)]
        r = await c.post(plan, json=_plan({"type": "task", "groups": groups}))
        assert _loc(r) == ["body", "run_spec", "configuration", "groups"]  # 1200 nodes in all
        service = {"type": "service", "port": 80, "commands": ["true"], "replicas": "0..5000", "scaling": {}}
        service["scaling"] = {"metric": "rps", "target": 10}
        r = await c.post(plan, json=_plan(service))
        assert _loc(r) == ["body", "run_spec", "configuration", "replicas"]
        assert "CORRAL_MAX_REPLICAS" in r.json()["detail"][0]["msg"]
        fleet = {"type": "fleet", "name": "big", "nodes": {"min": 0, "max": 1_000_000}}
        r = await c.post("/api/project/main/fleets/get_plan", json={"spec": {"configuration": fleet, "profile": {}}})
        assert _loc(r) == ["body", "spec", "configuration", "nodes", "max"]
        r = await c.post(plan, json=_plan({"type": "task", "commands": ["true"] * 10001}))
        assert _loc(r) == ["body", "run_spec", "configuration", "commands"] and "10000" in r.text
        r = await c.post(plan, json=_plan({"type": "task", "commands": ["x" * (256 * 1024 + 1)]}))
        assert _loc(r) == ["body", "run_spec", "configuration", "commands", 0]
        assert "CORRAL_MAX_STRING_LENGTH" in r.text
        deep: Any = "x"
        for _ in range(80):
            deep = {"a": deep}
        r = await c.post(plan, json=_plan({"type": "task", "commands": ["true"], "env": deep}))
        assert _loc(r)[:5] == ["body", "run_spec", "configuration", "env", "a"] and "CORRAL_MAX_JSON_DEPTH" in r.text


async def _job_submission(c: httpx.AsyncClient) -> tuple[str, str]:
    r = await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="poll-me"))
    assert r.status_code == 200, r.text
    run = r.json()
    return run["run_spec"]["run_name"], run["jobs"][0]["job_submissions"][0]["id"]


async def test_the_known_server_errors_are_4xx(server: RunningServer) -> None:
    async with server.client() as c:
        run_name, sub = await _job_submission(c)
        poll = "/api/project/main/logs/poll"
        # 1. a next_token that is not an integer (dstack's message)
        for token in ("abc", "-1", "1.5", "9" * 30, "\u0661"):
            r = await c.post(poll, json={"run_name": run_name, "job_submission_id": sub, "next_token": token})
            assert r.status_code == 400 and "Invalid next_token" in r.json()["detail"][0]["msg"], (token, r.text)
        r = await c.post(poll, json={"run_name": run_name, "job_submission_id": sub, "next_token": "0"})
        assert r.status_code == 200, r.text
        # 2. a start_time in year 1, in UTC and east of it (year 0 in UTC)
        for when in ("0001-01-01T00:00:00", "0001-01-01T00:00:00+05:00", "9999-12-31T23:00:00-05:00"):
            r = await c.post(poll, json={"run_name": run_name, "job_submission_id": sub, "start_time": when})
            assert r.status_code in (200, 422), (when, r.text)
            if r.status_code == 422:
                assert _loc(r) == ["body", "start_time"]
        # 3. a year-1 prev_created_at in fleets/list (and the other keyset pages)
        keysets = ("/api/fleets/list", "prev_created_at"), ("/api/instances/list", "prev_created_at")
        for path, key in (*keysets, ("/api/runs/list", "prev_submitted_at")):
            for when in ("0001-01-01T00:00:00", "0001-01-01T00:00:00+05:00"):
                r = await c.post(path, json={key: when})
                assert r.status_code in (200, 422), (path, when, r.text)
        # 4. a body nested 1,000 deep (and 2,000: past orjson's own limit)
        for depth in (1000, 2000):
            r = await c.post("/api/project/main/runs/get_plan", content=b"[" * depth + b"]" * depth)
            assert r.status_code == 422, r.text[:200]
            nested = b'{"run_spec": {"configuration": {"type": "task", "env": ' + b"[" * depth + b"]" * depth + b"}}}"
            r = await c.post("/api/project/main/runs/get_plan", content=nested)
            assert r.status_code == 422, r.text[:200]
        # 5. a lone surrogate in a string
        for path in ("/api/users/get_user", "/api/project/main/runs/get"):
            body = b'{"username": "\\ud800"}' if "users" in path else b'{"run_name": "\\udfff"}'
            r = await c.post(path, content=body)
            assert r.status_code == 422, r.text
        # 6. integers over 64 bits, anywhere
        for body in (
            b'{"limit": 18446744073709551615}',
            b'{"limit": 18446744073709551616}',
            b'{"limit": 340282366920938463463374607431768211456}',
        ):
            r = await c.post("/api/runs/list", content=body)
            assert r.status_code == 422 and _loc(r) == ["body", "limit"], r.text
        r = await c.post("/api/project/main/fleets/delete_instances", json={"name": "fl", "instance_nums": [2**63]})
        assert _loc(r) == ["body", "instance_nums", 0]


#: Malformed values for every field of every route's body (JSON text: the surrogate cannot be a str).
_BAD_VALUES = [
    "null",
    "-1",
    "9223372036854775808",
    "1e400",
    '"' + "x" * 5000 + '"',
    '"\\ud800"',
    "[]",
    '{"a": [[[[1]]]]}',
    '"0001-01-01T00:00:00+05:00"',
    '"9999-12-31T23:59:59-05:00"',
]
_CONF_FIELDS = ["name", "nodes", "replicas", "commands", "env", "resources", "ports", "retry", "max_duration"]


async def test_no_route_answers_a_server_error_to_malformed_values(server: RunningServer) -> None:
    """Each field of each route's body (and of a configuration's) set to each malformed value: never >= 500."""
    bodies_sent = 0
    async with server.client() as c:
        for spec in (spec for table in TABLES for spec in table.routes):
            texts = ["[]", "1", '"\\udfff"', "{" * 50]
            if spec.body is not None:
                spec.body.model_rebuild()
                texts += [f'{{"{field}": {bad}}}' for field in spec.body.model_fields for bad in _BAD_VALUES]
                if spec.path.endswith(("runs/get_plan", "fleets/get_plan")):
                    kind = "fleet" if "fleets" in spec.path else "task"
                    outer = "spec" if kind == "fleet" else "run_spec"
                    for field in _CONF_FIELDS:
                        for bad in _BAD_VALUES:
                            conf = f'{{"type": "{kind}", "commands": ["true"], "{field}": {bad}}}'
                            texts.append(f'{{"{outer}": {{"configuration": {conf}, "profile": {{}}}}}}')
            for text in texts:
                r = await c.request(spec.method, _path(spec), content=text.encode())
                bodies_sent += 1
                assert r.status_code < 500, (spec.path, text[:200], r.text[:300])
    assert bodies_sent > 1000


async def test_an_oversized_header_is_a_431_naming_it_and_the_body_is_never_read(server: RunningServer) -> None:
    """8 KiB per header (nginx's default line size): one byte more is refused on the API, the services
    proxy, the web UI and a WebSocket handshake alike; the declared 200 MB body is never read."""
    limit = 8 * 1024  # the documented default (docs/security.md)
    name = "X-Padding"
    at_limit = "v" * (limit - len(name))
    head = {"Content-Type": "application/json", "Content-Length": str(HUGE), "Authorization": f"Bearer {server.token}"}
    for path in ("/api/runs/list", "/proxy/services/main/some-run/", "/runs", "/metrics"):
        status, body, closed = await _raw(server, "POST", path, {**head, name: at_limit + "v"}, [])
        assert status == 431 and closed, (path, status, body)
        assert "'x-padding' is 8193 bytes long" in body.decode() and "CORRAL_MAX_HEADER_BYTES" in body.decode()
    status, body, _ = await _raw(
        server, "POST", "/api/runs/list", {name: at_limit, "Content-Length": "2"}, [b"{}"], closing=False
    )
    assert status != 431, body
    upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13"}
    upgrade["Sec-WebSocket-Key"] = "dGhlIHNhbXBsZSBub25jZQ=="
    status, _, _ = await _raw(
        server, "GET", "/proxy/services/main/some-run/ws", {**upgrade, name: at_limit + "v"}, [], closing=False
    )
    assert status == 403


async def test_a_client_version_of_any_length_is_a_400_that_repeats_at_most_40_characters(
    server: RunningServer,
) -> None:
    """``X-API-Version`` is parsed as major.minor.patch of at most 9 digits each (Python refuses to read
    an integer of more than 4,300 digits: that was a 500)."""
    async with server.client() as c:
        for value in ("9" * 5000, "1.2." + "9" * 5000, "0.19." + "9" * 5000 + "x", "x" * 8000, "1.2.3456789012"):
            r = await c.post("/api/runs/list", json={}, headers={"X-API-Version": value})
            assert r.status_code == 400, (value[:20], r.status_code, r.text[:200])
            msg = r.json()["detail"][0]["msg"]
            assert msg == "Invalid version: " + (value if len(value) <= 40 else f"{value[:40]}..."), msg
        for value in ("0.19.30", "0.19.0rc1", "0.20.0"):
            r = await c.post("/api/runs/list", json={}, headers={"X-API-Version": value})
            assert r.status_code == 200, (value, r.text)
