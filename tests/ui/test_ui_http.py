"""The web UI without a browser: httpx against a real server. Sessions (HttpOnly, SameSite=Strict, stored
hashed, ended by logout and by a token refresh), the Origin and CSRF checks on every form, the security
headers, the JSON/text answers of /api, /proxy and /metrics, permissions as the API's (403 for what a
user may not see or do), bulk stop as one request's work, and the live streams."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from ui_rows import a_volume

from server_harness import RunningServer, fleet_body, make_settings, running_server, task_body, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")
PAGES = ["/runs", "/fleets", "/instances", "/volumes", "/offers", "/projects", "/projects/main", "/users", "/events"]
#: The tokens of the users the module's server was given (set by ``server``).
TOKENS: dict[str, str] = {}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningServer]:
    async with running_server(make_settings(tmp_path_factory.mktemp("ui"))) as s, s.client() as c:
        r = await c.post("/api/users/create", json={"username": "bob", "global_role": "user"})
        assert r.status_code == 200, r.text
        r = await c.post("/api/users/get_user", json={"username": "bob"})
        TOKENS["bob"] = r.json()["creds"]["token"]
        r = await c.post(
            "/api/projects/main/add_members", json={"members": [{"username": "bob", "project_role": "user"}]}
        )
        assert r.status_code == 200, r.text
        yield s


def browser(server: RunningServer) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.url, follow_redirects=False, timeout=30, headers={"Origin": server.url})


async def login(c: httpx.AsyncClient, token: str) -> str:
    r = await c.post("/login", data={"token": token, "next": "/runs"})
    assert r.status_code == 303 and r.headers["location"] == "/runs", r.text
    return str(c.cookies["corral_session"])


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert m, "no CSRF field in the page"
    return m.group(1)


async def test_login_sets_an_httponly_strict_cookie_stored_hashed(server: RunningServer) -> None:
    async with browser(server) as c:
        r = await c.get("/runs")
        assert r.status_code == 303 and r.headers["location"] == "/login?next=%2Fruns"
        r = await c.post("/login", data={"token": "wrong", "next": "/runs"})
        assert r.status_code == 401 and "Invalid token" in r.text and "set-cookie" not in r.headers
        for bad in ("/\t/evil.example", "//evil.example", "/\\evil.example"):
            r = await c.post("/login", data={"token": server.token, "next": bad})
            assert r.status_code == 303 and r.headers["location"] == "/runs", bad
            await c.post("/logout", data={"csrf": csrf_of((await c.get("/projects")).text)})
        r = await c.post("/login", data={"token": server.token, "next": "https://evil.example/"})
        assert r.status_code == 303 and r.headers["location"] == "/runs"  # only paths of this server
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie, cookie
        sid = str(c.cookies["corral_session"])
        assert len(sid) >= 40
        r = await c.get("/runs")
        assert r.status_code == 200 and "Runs" in r.text
    from corral.store.tables import ui_sessions

    async with server.ctx.db.read() as conn:
        stored = [row.id_hash for row in await conn.execute(ui_sessions.select())]
    assert sid not in stored and any(
        h == hashlib.sha256(b"corral-ui-session:" + sid.encode()).hexdigest() for h in stored
    )


async def test_every_page_renders_with_the_security_headers(server: RunningServer) -> None:
    async with browser(server) as c:
        await login(c, server.token)
        runs = (await c.get("/runs")).text  # an admin's user filter: every user
        assert "<option>admin</option>" in runs and "<option>bob</option>" in runs
        for path in [*PAGES, "/login", "/nope", "/ui/static/ui.js", "/ui/static/ui.css"]:
            r = await c.get(path)
            assert r.status_code == (404 if path == "/nope" else 303 if path == "/login" else 200), (path, r.text[:300])
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
            assert r.headers["x-content-type-options"] == "nosniff"
            if r.headers.get("content-type", "").startswith("text/html"):
                assert "<script>" not in r.text and "javascript:" not in r.text  # no inline script
                assert not re.search(r"<[^>]+\son[a-z]+=", r.text), path  # no inline event handlers


async def test_the_root_answers_itself_and_the_ui_can_be_turned_off(server: RunningServer) -> None:
    async with browser(server) as c:
        r = await c.get("/")  # dstack's CLI resolves a server's URL by following its redirects: none here
        assert r.status_code == 200 and 'name="token"' in r.text
        await login(c, server.token)
        r = await c.get("/")
        assert r.status_code == 200 and "<h1>Runs</h1>" in r.text
    from corral.api.app import create_app

    class NoWorkers:
        async def start(self) -> None: ...

        async def stop(self) -> None: ...

    ctx = dataclasses.replace(server.ctx, settings=dataclasses.replace(server.ctx.settings, ui=False))
    transport = httpx.ASGITransport(app=create_app(ctx, NoWorkers()))
    async with httpx.AsyncClient(transport=transport, base_url="http://corral") as c:
        for method, path in (("GET", "/"), ("GET", "/runs"), ("POST", "/login")):
            r = await c.request(method, path)
            assert (r.status_code, r.json()) == (404, {"detail": {"msg": "Not found", "code": None}}), path


async def test_api_proxy_and_metrics_never_answer_html(server: RunningServer) -> None:
    async with browser(server) as c:
        await login(c, server.token)
        for path in ["/api/nope", "/api/", "/proxy/nope", "/proxy/services/main/none/", "/metrics", "/healthcheck"]:
            r = await c.get(path)
            assert not r.headers.get("content-type", "").startswith("text/html"), (path, r.headers)


async def test_forms_need_this_origin_and_the_session_csrf_token(server: RunningServer) -> None:
    async with browser(server) as c:
        await login(c, server.token)
        page = (await c.get("/users")).text
        token = csrf_of(page)
        form = {"csrf": token, "username": "carol", "global_role": "user"}
        r = await c.post("/users/create", data=form, headers={"Origin": "http://evil.example"})
        assert r.status_code == 403 and "Origin" in r.text
        r = await c.post("/users/create", data={**form, "csrf": "0" * 64})
        assert r.status_code == 403 and "CSRF" in r.text
        r = await c.post("/users/create", data={k: v for k, v in form.items() if k != "csrf"})
        assert r.status_code == 403
        r = await c.post("/users/create", data={**form, "email": "x" * 70_000})
        assert r.status_code == 403 and "too large" in r.text
        r = await c.post("/users/create", data=form, headers={"Origin": "null"})  # a sandboxed page
        assert r.status_code == 403
        async with server.client() as api:
            r = await api.post("/api/users/list", json={})
            assert "carol" not in [u["username"] for u in r.json()]
        r = await c.post("/users/create", data=form)
        assert r.status_code == 303 and r.headers["location"] == "/users"
        async with server.client() as api:
            r = await api.post("/api/users/list", json={})
            assert "carol" in [u["username"] for u in r.json()]


async def test_a_member_sees_no_admin_page_and_gets_403(server: RunningServer) -> None:
    async with browser(server) as c:
        await login(c, TOKENS["bob"])
        runs = await c.get("/runs")
        assert runs.status_code == 200 and 'href="/users"' not in runs.text
        assert "<option>bob</option>" in runs.text and "<option>admin</option>" not in runs.text  # the user filter
        r = await c.get("/users")
        assert r.status_code == 403 and "Access denied" in r.text
        token = csrf_of(runs.text)
        r = await c.post("/users/create", data={"csrf": token, "username": "mallory", "global_role": "admin"})
        assert r.status_code == 403
        r = await c.post("/users/admin/refresh_token", data={"csrf": token})
        assert r.status_code == 403
        project = await c.get("/projects/main")
        assert project.status_code == 200 and "Add a member" not in project.text and "Remove" not in project.text
        r = await c.post("/projects/main/members/add", data={"csrf": token, "username": "carol", "role": "admin"})
        assert r.status_code == 403


async def test_secrets_on_the_project_page_by_name_only_for_those_who_may_manage_them(server: RunningServer) -> None:
    value = "s3cr3t-value-never-shown"
    async with browser(server) as c:
        await login(c, server.token)
        page = await c.get("/projects/main")
        assert 'id="secrets"' in page.text and "No secrets yet." in page.text
        token = csrf_of(page.text)
        r = await c.post("/projects/main/secrets/set", data={"csrf": token, "name": "HF_TOKEN", "value": value})
        assert r.status_code == 303 and r.headers["location"] == "/projects/main#secrets", r.text
        r = await c.post("/projects/main/secrets/set", data={"csrf": token, "name": "bad name", "value": "x"})
        assert r.status_code == 400 and "Secret name should match regex" in r.text
        page = await c.get("/projects/main")
        assert "<code>HF_TOKEN</code>" in page.text and value not in page.text
    async with server.client() as api:
        got = await api.post("/api/project/main/secrets/get", json={"name": "HF_TOKEN"})
        assert got.status_code == 200 and got.json()["value"] == value
    async with browser(server) as c:
        await login(c, TOKENS["bob"])
        page = await c.get("/projects/main")
        assert page.status_code == 200 and 'id="secrets"' not in page.text and "HF_TOKEN" not in page.text
        token = csrf_of(page.text)
        for path, data in (("set", {"name": "HF_TOKEN", "value": "overwritten"}), ("delete", {"name": "HF_TOKEN"})):
            r = await c.post(f"/projects/main/secrets/{path}", data={"csrf": token, **data})
            assert r.status_code == 403, (path, r.text)
    async with browser(server) as c:
        await login(c, server.token)
        token = csrf_of((await c.get("/projects/main")).text)
        r = await c.post("/projects/main/secrets/delete", data={"csrf": token, "name": "HF_TOKEN"})
        assert r.status_code == 303
    async with server.client() as api:
        assert (await api.post("/api/project/main/secrets/list")).json() == []


async def test_logout_and_a_refreshed_token_end_the_session(server: RunningServer) -> None:
    async with server.client() as api:
        r = await api.post("/api/users/create", json={"username": "dave", "global_role": "user"})
        assert r.status_code == 200, r.text
        dave = (await api.post("/api/users/get_user", json={"username": "dave"})).json()["creds"]["token"]
    async with browser(server) as c:
        await login(c, dave)
        page = (await c.get("/projects")).text
        r = await c.post("/logout", data={"csrf": csrf_of(page)})
        assert r.status_code == 303 and 'corral_session=""' in r.headers["set-cookie"]
    async with browser(server) as c:
        sid = await login(c, dave)
        assert (await c.get("/projects")).status_code == 200
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {dave}"}) as api:
            r = await api.post("/api/users/refresh_token", json={"username": "dave"})
            assert r.status_code == 200, r.text
        c.cookies.set("corral_session", sid)
        r = await c.get("/projects")
        assert r.status_code == 303 and r.headers["location"].startswith("/login")


async def _events(c: httpx.AsyncClient, url: str, want: Any, timeout: float = 30) -> list[tuple[str, str]]:
    """Read a stream's events until ``want(events)`` holds."""
    got: list[tuple[str, str]] = []

    async def read() -> None:
        async with c.stream("GET", url) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            name = ""
            async for line in r.aiter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    got.append((name, line[6:]))
                    if want(got):
                        return

    await asyncio.wait_for(read(), timeout)
    return got


async def test_runs_stream_logs_stream_and_bulk_stop(server: RunningServer) -> None:
    async with server.client() as api:
        r = await api.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..3"))
        assert r.status_code == 200, r.text
        body = task_body(["for i in $(seq 1 200); do echo tail-$i; sleep 0.03; done", "sleep 60"])
        names = []
        for n in ("ui-a", "ui-b"):
            body["plan"]["run_spec"]["configuration"]["name"] = n
            r = await api.post("/api/project/main/runs/apply", json=body)
            assert r.status_code == 200, r.text
            names.append(n)
        run = r.json()
    async with browser(server) as c:
        await login(c, server.token)
        got = await _events(c, "/ui/live/runs", lambda ev: sum(1 for n, _ in ev if n == "new") >= 2)
        assert sum(1 for n, d in got if n == "new" and "ui-b" in d) == 1

        async def running() -> bool:
            async with server.client() as api:
                r = await api.post("/api/project/main/runs/get", json={"run_name": "ui-b"})
                return bool(r.json()["status"] == "running")

        await wait_for(running, timeout=60)
        page = (await c.get(f"/projects/main/runs/{run['id']}")).text
        assert ">Stop</button>" in page and ">Abort</button>" in page
        job = run["jobs"][0]["job_submissions"][-1]["id"]
        url = f"/ui/live/logs?project=main&run={run['id']}&job={job}"
        got = await _events(c, url, lambda ev: any("tail-200" in d for n, d in ev if n == "lines"), timeout=60)
        text = "".join(d for n, d in got if n == "lines")
        seen = [int(x) for x in re.findall(r"tail-(\d+)", text)]
        assert seen == list(range(seen[0], 201)), "lines lost or repeated"
        assert sum(1 for n, _ in got if n == "lines") >= 2  # pushed as they were stored, not one page

        async def charted() -> bool:  # the job's metrics, drawn once it has two samples
            got = (await c.get(f"/projects/main/runs/{run['id']}")).text
            return 'aria-label="CPU use, now' in got and "<polyline points=" in got

        await wait_for(charted, timeout=40, interval=1.0)
        async with server.client() as api:
            r = await api.post("/api/projects/create", json={"project_name": "other"})
            assert r.status_code == 200, r.text
        async with browser(server) as bob:  # a run of a project bob is not in: nothing is stopped
            await login(bob, TOKENS["bob"])
            bob_csrf = csrf_of((await bob.get("/runs")).text)
            r = await bob.post("/runs/stop", data={"csrf": bob_csrf, "run": ["main/ui-a", "other/x"]})
            assert r.status_code == 403
            async with server.client() as api:
                r = await api.post("/api/project/main/runs/get", json={"run_name": "ui-a"})
                assert r.json()["status"] not in ("terminating", "terminated")
        r = await c.post("/runs/stop", data={"csrf": csrf_of(page), "run": [f"main/{n}" for n in names], "abort": "0"})
        assert r.status_code == 303, r.text

    async def stopped() -> bool:
        async with server.client() as api:
            for n in names:
                r = await api.post("/api/project/main/runs/get", json={"run_name": n})
                if r.json()["status"] not in ("terminating", "terminated"):
                    return False
        return True

    await wait_for(stopped, timeout=30)


async def test_volumes_page_shows_a_members_projects_volumes_and_deletes_as_the_api(server: RunningServer) -> None:
    async with server.client() as api:
        r = await api.post("/api/projects/create", json={"project_name": "vols-elsewhere"})
        assert r.status_code == 200, r.text
    await a_volume(server, "main", "vol-main")
    await a_volume(server, "vols-elsewhere", "vol-hidden")
    async with browser(server) as c:
        await login(c, server.token)
        page = await c.get("/volumes")
        assert page.status_code == 200 and "vol-main" in page.text and "vol-hidden" in page.text
        assert "eu-west-1" in page.text and "100GB" in page.text
    async with browser(server) as c:
        await login(c, TOKENS["bob"])
        page = await c.get("/volumes")
        assert page.status_code == 200 and "vol-main" in page.text and "vol-hidden" not in page.text
        other = await c.get("/volumes?project=vols-elsewhere")
        assert other.status_code == 200 and "vol-hidden" not in other.text
        token = csrf_of(page.text)
        r = await c.post("/projects/vols-elsewhere/volumes/vol-hidden/delete", data={"csrf": token})
        assert r.status_code == 403
        r = await c.post("/projects/main/volumes/vol-main/delete", data={"csrf": "0" * 64})
        assert r.status_code == 403
        async with server.client() as api:
            got = await api.post("/api/project/vols-elsewhere/volumes/get", json={"name": "vol-hidden"})
            assert got.status_code == 200 and not got.json()["deleted"]
        r = await c.post("/projects/main/volumes/vol-main/delete", data={"csrf": token})
        assert r.status_code == 303 and r.headers["location"] == "/volumes", r.text
    from corral.store import accounts, volumes

    async with server.ctx.db.read() as conn:
        main = await accounts.get_project(conn, "main")
        assert main is not None
        found = await volumes.by_names(conn, main.id, ["vol-main"])
    assert not found or found[0].to_be_deleted or found[0].deleted


async def test_new_run_page_shows_the_plan_first_then_applies_and_names_bad_fields(server: RunningServer) -> None:
    doc = "type: task\nname: from-the-page\ncommands:\n  - sleep 1\nresources:\n  cpu: 1..\n  memory: 0.1GB..\n"
    async with server.client() as api:
        r = await api.post("/api/projects/create", json={"project_name": "runs-elsewhere"})
        assert r.status_code == 200, r.text
        r = await api.post("/api/project/main/fleets/apply", json=fleet_body(name="runs-page", nodes="0..1"))
        assert r.status_code == 200, r.text
    async with browser(server) as c:
        await login(c, TOKENS["bob"])
        form = await c.get("/runs/new")
        assert form.status_code == 200 and '<option value="main"' in form.text
        assert "runs-elsewhere" not in form.text  # only the projects bob is in
        token = csrf_of(form.text)
        post = {"csrf": token, "project": "main", "step": "plan"}
        r = await c.post("/runs/new", data={**post, "configuration": "type: task\ncommands: [unclosed\n"})
        assert r.status_code == 400 and "configuration: not valid YAML at line" in r.text
        assert "commands: [unclosed" in r.text  # the document is kept as typed
        r = await c.post("/runs/new", data={**post, "configuration": "- a list"})
        assert r.status_code == 400 and "configuration: a mapping of fields" in r.text
        r = await c.post("/runs/new", data={**post, "configuration": "type: task\ncommands: [echo]\nnodes: lots\n"})
        assert r.status_code == 400 and re.search(r"<li>configuration(\.[a-z_-]+)*\.nodes: ", r.text), r.text
        r = await c.post("/runs/new", data={**post, "configuration": doc, "project": "runs-elsewhere"})
        assert r.status_code == 403
        r = await c.post("/runs/new", data={**post, "configuration": doc, "csrf": "0" * 64})
        assert r.status_code == 403
        # this server's local backend runs jobs unsandboxed: the plan says bob's run would be refused, and it is
        r = await c.post("/runs/new", data={**post, "configuration": doc})
        assert r.status_code == 200 and "Plan for from-the-page" in r.text, r.text
        assert "data-plan-error>It would fail at once: This server" in r.text, re.findall(
            r"data-plan-error>[^<]*", r.text
        )
        r = await c.post("/runs/new", data={**post, "configuration": doc, "step": "apply"})
        assert r.status_code == 400 and "only global admins may" in r.text
    async with browser(server) as c:
        await login(c, server.token)
        token = csrf_of((await c.get("/runs/new")).text)
        post = {"csrf": token, "project": "main", "configuration": doc}
        r = await c.post("/runs/new", data={**post, "step": "plan"})
        assert r.status_code == 200 and "data-plan-action>create<" in r.text and ">Apply</button>" in r.text
        assert "data-plan-error" not in r.text
        async with server.client() as api:
            got = await api.post("/api/project/main/runs/get", json={"run_name": "from-the-page"})
            assert got.status_code == 400  # a plan submits nothing
        r = await c.post("/runs/new", data={**post, "step": "apply"})
        assert r.status_code == 303 and r.headers["location"].startswith("/projects/main/runs/"), r.text
    async with server.client() as api:
        got = await api.post("/api/project/main/runs/get", json={"run_name": "from-the-page"})
        assert got.status_code == 200 and got.json()["user"] == "admin"
        assert r.headers["location"].split("?")[0].endswith(got.json()["id"])


async def test_new_run_page_updates_a_service_it_planned_against(server: RunningServer) -> None:
    service = {"type": "service", "name": "page-svc", "port": 8000, "commands": ["sleep 600"]}
    async with server.client() as api:
        r = await api.post("/api/project/main/fleets/apply", json=fleet_body(name="page-svc-fleet", nodes="0..1"))
        assert r.status_code == 200, r.text
        r = await api.post("/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {
            "configuration": {**service, "env": {"V": "1"}}}}})  # fmt: skip
        assert r.status_code == 200, r.text
    doc = "type: service\nname: page-svc\nport: 8000\ncommands: [sleep 600]\nenv:\n  V: '2'\n"
    async with browser(server) as c:
        await login(c, server.token)
        post = {"csrf": csrf_of((await c.get("/runs/new")).text), "project": "main", "configuration": doc}
        plan = await c.post("/runs/new", data={**post, "step": "plan"})
        assert plan.status_code == 200 and "data-plan-action>update<" in plan.text, plan.text
        current = dict(re.findall(r'name="(current_id|current_deployment)" value="([^"]*)"', plan.text))
        assert current["current_id"] and current["current_deployment"] == "0", current
        r = await c.post("/runs/new", data={**post, **current, "step": "apply"})
        assert r.status_code == 303, r.text
        # applied again against the same, now older, deployment: refused as the API refuses it
        r = await c.post(
            "/runs/new", data={**post, **current, "configuration": doc.replace("'2'", "'3'"), "step": "apply"}
        )
        assert r.status_code == 400 and "Resource has been changed" in r.text, r.text
    async with server.client() as api:
        got = (await api.post("/api/project/main/runs/get", json={"run_name": "page-svc"})).json()
        assert got["deployment_num"] == 1 and got["run_spec"]["configuration"]["env"]["V"] == "2"
        r = await api.post("/api/project/main/runs/stop", json={"runs_names": ["page-svc"], "abort": True})
        assert r.status_code == 200
