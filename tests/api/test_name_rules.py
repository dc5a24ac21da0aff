"""dstack 0.22.5's name rules, with its messages, at every entry point: runs, fleets, exports, volumes and
gateways (``^[a-z][a-z0-9-]{1,40}$``), usernames (``^[a-zA-Z0-9-_]{1,60}$``), projects
(``^[a-zA-Z0-9-_]{1,50}$``); and the names corral generates follow them too."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from corral.domain import names
from corral.services import fleets, run_apply
from server_harness import RunningServer, make_settings, running_server

pytestmark = pytest.mark.asyncio(loop_scope="module")

RESOURCE_MSG = "Resource name should match regex '^[a-z][a-z0-9-]{1,40}$'"
BAD_RESOURCE = [
    "",
    "a",
    "\x00name",
    "x" * 10_000,
    "../etc",
    "a/b",
    "name\n",
    "Name",
    "1name",
    "a_b",
    "a" * 42,
    "é-name",
]
BAD_USER = ["", "a b", "x" * 61, "é", "a.b", "name\n", "a/b", "\x00", "x" * 10_000]
BAD_PROJECT = ["", "a b", "x" * 51, "é", "name\n", "../p", "\x00"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningServer]:
    settings = make_settings(tmp_path_factory.mktemp("names"), background_processing=False)
    async with running_server(settings) as s:
        yield s


def _refused(r: httpx.Response, msg: str) -> None:
    assert r.status_code == 400, r.text[:300]
    assert r.json()["detail"] == [{"msg": msg, "code": "error"}]


def _task(name: str | None = None, run_name: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"type": "task", "commands": ["true"]}
    if name is not None:
        conf["name"] = name
    return {"run_name": run_name, "configuration": conf}


def _fleet(name: str) -> dict[str, Any]:
    return {"configuration": {"type": "fleet", "name": name, "nodes": "0..1"}, "profile": {}}


async def test_resource_names(server: RunningServer) -> None:
    p = "/api/project/main"
    async with server.client() as c:
        for bad in BAD_RESOURCE:
            if bad:  # an empty run_name is "no name" (one is generated)
                _refused(await c.post(f"{p}/runs/get_plan", json={"run_spec": _task(run_name=bad)}), RESOURCE_MSG)
            _refused(await c.post(f"{p}/runs/get_plan", json={"run_spec": _task(name=bad)}), RESOURCE_MSG)
            _refused(
                await c.post(f"{p}/runs/apply", json={"plan": {"run_spec": _task(name=bad)}, "force": False}),
                RESOURCE_MSG,
            )
            if bad:
                body = {"plan": {"run_spec": _task(run_name=bad)}, "force": False}
                _refused(await c.post(f"{p}/runs/apply", json=body), RESOURCE_MSG)
            _refused(await c.post(f"{p}/fleets/get_plan", json={"spec": _fleet(bad)}), RESOURCE_MSG)
            body = {"plan": {"spec": _fleet(bad)}, "force": False}
            _refused(await c.post(f"{p}/fleets/apply", json=body), RESOURCE_MSG)
            body = {"name": bad, "importer_projects": [], "exported_fleets": []}
            _refused(await c.post(f"{p}/exports/create", json=body), RESOURCE_MSG)
            volume = {"type": "volume", "backend": "aws", "region": "us-east-1", "size": "10GB", "name": bad}
            _refused(await c.post(f"{p}/volumes/create", json={"configuration": volume}), RESOURCE_MSG)
            gateway = {"type": "gateway", "backend": "aws", "region": "us-east-1", "name": bad}
            _refused(await c.post(f"{p}/gateways/get_plan", json={"spec": {"configuration": gateway}}), RESOURCE_MSG)
        # the rule's own edges pass: 2 and 41 characters, digits and hyphens after the first letter
        for good in ("ab", "a" + "b" * 40, "a1-", "x-9-y"):
            r = await c.post(f"{p}/runs/get_plan", json={"run_spec": _task(name=good)})
            assert r.status_code == 200, (good, r.text[:300])
            r = await c.post(f"{p}/fleets/get_plan", json={"spec": _fleet(good)})
            assert r.status_code == 200, (good, r.text[:300])


async def test_usernames_and_project_names(server: RunningServer) -> None:
    async with server.client() as c:
        for bad in BAD_USER:
            r = await c.post("/api/users/create", json={"username": bad, "global_role": "user"})
            _refused(r, "Username should match regex '^[a-zA-Z0-9-_]{1,60}$'")
        for bad in BAD_PROJECT:
            r = await c.post("/api/projects/create", json={"project_name": bad})
            _refused(r, "Project name should match regex '^[a-zA-Z0-9-_]{1,50}$'")
        # longer still, the caps on strings and bodies refuse it before the rule runs (a 10 MB one is
        # refused from its Content-Length alone, and its connection closed: see test_input_edge)
        r = await c.post("/api/users/create", json={"username": "x" * 300_000, "global_role": "user"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "username"]
        r = await c.post("/api/users/create", json={"username": "x" * 1_500_000, "global_role": "user"})
        assert r.status_code == 413
        r = await c.post("/api/users/create", json={"username": "Mixed_Case-1" + "x" * 48, "global_role": "user"})
        assert r.status_code == 200, r.text
        assert (await c.post("/api/projects/create", json={"project_name": "Team_B-" + "p" * 43})).status_code == 200


async def test_generated_names_follow_the_rule() -> None:
    parts = itertools.product(names.ADJECTIVES, names.NOUNS)
    assert all(names.resource_name_error(f"{a}-{n}-999") is None for a, n in parts)
    assert all(names.resource_name_error(fleets.random_name()) is None for _ in range(200))
    assert all(names.resource_name_error(run_apply.random_name()) is None for _ in range(200))
