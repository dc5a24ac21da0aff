"""The route table and the Starlette app: FastAPI's old edge behaviour (404/405/307, query parameters, 422
before authentication), the version check and dstack's 500 body, and the lazily built OpenAPI document."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.routing import BaseRoute, Match, Route

from corral.api.app import TABLES
from corral.api.deps import FastJSON, VersionCheck, error_handlers
from corral.api.routing import IndexedRouter, RouteTable, starlette_routes
from server_harness import RunningServer, make_settings, running_server

NOT_FOUND = {"detail": {"msg": "Not found", "code": None}}
NOT_ALLOWED = {"detail": {"msg": "Method Not Allowed", "code": None}}


@pytest.fixture
async def sqlite_server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with running_server(make_settings(tmp_path)) as s:
        yield s


async def test_unknown_paths_and_methods_answer_like_before(sqlite_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=sqlite_server.url) as c:
        # (every other path is the web UI's: tests/ui/test_ui_http.py)
        for method, path in [("POST", "/api/nope"), ("GET", "/api"), ("POST", "/api/project/a/b/runs/list")]:
            r = await c.request(method, path)
            assert (r.status_code, r.json()) == (404, NOT_FOUND), (method, path)
        # Exactly the declared method: no implicit HEAD on GET routes, no GET on POST routes.
        for method, path in [("GET", "/api/server/get_info"), ("HEAD", "/healthcheck"), ("PUT", "/api/runs/list")]:
            r = await c.request(method, path)
            assert r.status_code == 405, (method, path)
            if method != "HEAD":
                assert r.json() == NOT_ALLOWED
        r = await c.post("/api/server/get_info/")
        assert r.status_code == 307
        assert r.headers["location"].endswith("/api/server/get_info")
        # The version check runs before routing, also for unknown API paths, but not for the docs.
        r = await c.post("/api/nope", headers={"X-API-Version": "9.0.0"})
        assert r.status_code == 400
        assert "incompatible" in r.json()["detail"][0]["msg"]
        assert (await c.get("/api/docs", headers={"X-API-Version": "9.0.0"})).status_code == 200


async def test_required_query_parameter_is_checked_before_authentication(sqlite_server: RunningServer) -> None:
    missing = {"detail": [{"type": "missing", "loc": ["query", "repo_id"], "msg": "Field required", "input": None}]}
    async with httpx.AsyncClient(base_url=sqlite_server.url) as c:
        r = await c.post("/api/project/main/repos/upload_code")
        assert (r.status_code, r.json()) == (422, missing)
    async with sqlite_server.client() as c:
        r = await c.post("/api/project/main/repos/upload_code")
        assert (r.status_code, r.json()) == (422, missing)
        r = await c.post("/api/project/nope/repos/upload_code", params={"repo_id": "r"})
        assert (r.status_code, r.json()) == (404, NOT_FOUND)
        r = await c.post("/api/project/main/repos/upload_code", params={"repo_id": ""})
        assert r.status_code == 400
        assert "multipart/form-data" in r.json()["detail"][0]["msg"]


def _app(table: RouteTable) -> Starlette:
    return Starlette(
        routes=starlette_routes(table), middleware=[Middleware(VersionCheck)], exception_handlers=error_handlers()
    )


async def test_handlers_get_path_and_query_parameters_by_name() -> None:
    table = RouteTable()

    @table.post("/api/things/{project_name}/{thing}")
    async def both(request: Request, thing: str, project_name: str, color: str) -> FastJSON:
        return FastJSON({"p": project_name, "t": thing, "c": color, "m": request.method})

    @table.get("/plain")
    async def plain() -> FastJSON:
        return FastJSON("plain")

    transport = httpx.ASGITransport(app=_app(table))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post("/api/things/main/a%20b", params={"color": "red"})
        assert r.json() == {"p": "main", "t": "a b", "c": "red", "m": "POST"}
        assert (await c.get("/plain")).json() == "plain"
        r = await c.post("/api/things/main/x")
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["query", "color"]


def _first_full(routes: Sequence[BaseRoute], method: str, path: str) -> BaseRoute | None:
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    return next((route for route in routes if route.matches(scope)[0] == Match.FULL), None)


def test_the_indexed_router_takes_the_route_starlettes_scan_takes() -> None:
    """Every route of the API, paths that only a route ending with a parameter matches, and paths no route matches:
    the routes the indexed router tries for a path (by its last segment) hold the one Starlette's scan of them all
    takes first, and few others."""
    table = RouteTable()

    @table.post("/api/things/{rest:path}")
    async def anything() -> FastJSON:
        return FastJSON("anything")

    routes = [*starlette_routes(*TABLES), *starlette_routes(table)]
    router = IndexedRouter(routes)
    paths = [(spec.method, spec.path.replace("{project_name}", "main")) for t in TABLES for spec in t.routes]
    paths += [("POST", "/api/things/a/get"), ("POST", "/api/things/list"), ("GET", "/api/runs/list"), ("POST", "/x")]
    paths += [("POST", "/api/runs/list/"), ("POST", "/"), ("POST", "")]
    for method, path in paths:
        expected = _first_full(routes, method, path)
        assert _first_full(router.candidates(path.rpartition("/")[2]), method, path) is expected, (method, path)
    assert _first_full(routes, "POST", "/api/things/a/get") is routes[-1]
    assert len(router.candidates("get")) < len(routes) / 4  # those ending in ``get``, and the one in a parameter
    assert router.candidates("no-such-end") == [r for r in routes if isinstance(r, Route) and r.path.endswith("}")]


async def test_an_unhandled_error_is_dstacks_500_body_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    table = RouteTable()

    @table.post("/api/boom")
    async def boom() -> FastJSON:
        raise RuntimeError("kaboom")

    transport = httpx.ASGITransport(app=_app(table), raise_app_exceptions=False)
    with caplog.at_level(logging.ERROR, logger="corral.api"):
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            r = await c.post("/api/boom")
    assert r.status_code == 500
    assert r.json() == {"detail": [{"msg": "Internal server error", "code": "error"}]}
    assert any("unhandled error on /api/boom" in rec.getMessage() for rec in caplog.records)


async def test_openapi_document_is_served_as_built_from_the_route_tables(sqlite_server: RunningServer) -> None:
    from corral.api.openapi import build_openapi

    async with httpx.AsyncClient(base_url=sqlite_server.url) as c:
        r = await c.get("/api/openapi.json")
        assert r.status_code == 200
        doc = r.json()
        assert (await c.get("/api/openapi.json")).content == r.content  # built once, served as is
        docs = await c.get("/api/docs")
        assert docs.status_code == 200
        assert "'/api/openapi.json'" in docs.text
    assert doc == build_openapi(TABLES)  # what tests/api/test_openapi.py checks is what is served
    assert doc["info"]["title"] == "corral"
    schemas = doc["components"]["schemas"]
    upload = doc["paths"]["/api/project/{project_name}/repos/upload_code"]["post"]
    assert [(p["name"], p["in"]) for p in upload["parameters"]] == [("project_name", "path"), ("repo_id", "query")]
    apply_body = schemas["ApplyRunBody"]
    assert "plan" in apply_body["properties"]
