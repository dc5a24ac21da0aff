"""The web UI in a real browser: Debian's chromium, headless, driven by Playwright against a real server
(one server and one browser for the module). Login (a wrong token refused, the cookie HttpOnly, nothing in
``localStorage``); runs that appear and change status without a reload; a running task's new log lines;
the Stop button (checked through the API); a member without rights; a service's page opened by a logged-in
admin that can act neither through the UI nor the API; axe-core on every page; a screenshot of every page
(under ``CORRAL_UI_SCREENSHOTS`` when set, else pytest's temporary directory)."""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
from browser_env import axe_script, chromium
from playwright.async_api import Browser, Page, async_playwright, expect
from ui_rows import a_volume

from corral.store.tables import jobs
from server_harness import (
    RunningServer,
    finished_run,
    fleet_body,
    free_port,
    get_run,
    make_settings,
    running_server,
    task_body,
    wait_for,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")
AXE_SOURCE = functools.cache(lambda: axe_script().read_text() + "\n;undefined")
SERVICE_APP = base64.b64encode((Path(__file__).parent / "service_page.py").read_bytes()).decode()
#: The model service of the playground's test: ``tests/proxy``'s replica, whose ``/v1/chat/completions``
#: streams ``hello from <$MODEL>`` in three SSE chunks.
MODEL_APP = base64.b64encode((Path(__file__).parent.parent / "proxy" / "replica_app.py").read_bytes()).decode()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningServer]:
    async with running_server(make_settings(tmp_path_factory.mktemp("ui-browser"))) as s, s.client() as c:
        r = await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..4"))
        assert r.status_code == 200, r.text
        r = await c.post("/api/users/create", json={"username": "bob", "global_role": "user"})
        assert r.status_code == 200, r.text
        r = await c.post(
            "/api/projects/main/add_members", json={"members": [{"username": "bob", "project_role": "user"}]}
        )
        assert r.status_code == 200, r.text
        yield s


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=chromium(), headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("CORRAL_UI_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


async def token_of(server: RunningServer, username: str) -> str:
    async with server.client() as c:
        r = await c.post("/api/users/get_user", json={"username": username})
        return str(r.json()["creds"]["token"])


async def logged_in(browser: Browser, server: RunningServer, token: str, **kw: Any) -> Page:
    context = await browser.new_context(base_url=server.url, **kw)
    page = await context.new_page()
    await page.goto("/login")
    await page.get_by_label("Token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url("**/runs")
    return page


async def audit(page: Page, name: str, shots: Path) -> None:
    """No serious or critical axe-core violation; a full-page screenshot."""
    # through the DevTools protocol: the page's Content-Security-Policy refuses any script tag not its own
    await page.evaluate(AXE_SOURCE())
    result = await page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    bad = [
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}"
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]
    await page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    assert not bad, f"{name}: {bad}"


async def test_login_refuses_a_wrong_token_and_keeps_nothing_in_storage(
    browser: Browser, server: RunningServer
) -> None:
    context = await browser.new_context(base_url=server.url)
    page = await context.new_page()
    await page.goto("/runs")
    await page.wait_for_url("**/login?next=%2Fruns")
    await page.get_by_label("Token").fill("not-a-token")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert")).to_contain_text("Invalid token")
    await page.get_by_label("Token").fill(server.token)
    await page.keyboard.press("Enter")  # by keyboard
    await page.wait_for_url("**/runs")
    cookie = next(c for c in await context.cookies() if c["name"] == "corral_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert await page.evaluate("document.cookie") == ""
    assert await page.evaluate("localStorage.length + sessionStorage.length") == 0
    await context.close()


async def test_runs_appear_change_status_tail_logs_and_stop(
    browser: Browser, server: RunningServer, shots: Path
) -> None:
    page = await logged_in(browser, server, server.token, viewport={"width": 1366, "height": 768})
    await expect(page.locator("[data-live-state]")).to_contain_text("Live")
    async with server.client() as c:
        body = task_body(["for i in $(seq 1 40); do echo line-$i; sleep 0.1; done", "sleep 120"], name="browser-run")
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 200, r.text
        run = r.json()
    row = page.locator(f'tr[data-run="{run["id"]}"]')
    await expect(row).to_be_visible(timeout=15_000)  # appeared without a reload
    await expect(row.locator(".status")).to_have_text("running", timeout=30_000)  # and changed status
    await audit(page, "runs", shots)

    await row.get_by_role("link", name="browser-run").click()
    await page.wait_for_url(f"**/projects/main/runs/{run['id']}")
    logs = page.locator("[data-log-lines]")
    await expect(logs).to_contain_text("line-40", timeout=30_000)  # new lines, no reload
    text = await logs.inner_text()
    assert [f"line-{i}" for i in range(1, 41)] == [w for w in text.split() if w.startswith("line-")]
    await audit(page, "run", shots)

    stop = page.get_by_role("button", name="Stop", exact=True)
    await stop.focus()
    await page.keyboard.press("Enter")
    await page.wait_for_url("**?notice=Stopping")

    async def stopped() -> bool:
        async with server.client() as c:
            return (await get_run(c, "browser-run"))["status"] in ("terminating", "terminated")

    await wait_for(stopped, timeout=30)
    await page.reload()  # a finished run's page: its log read back in full, no live tail
    await expect(page.locator("[data-log-lines]")).to_contain_text("line-40", timeout=15_000)
    await audit(page, "run-finished", shots)
    await page.context.close()


async def test_every_page_passes_axe_and_fits_a_phone(browser: Browser, server: RunningServer, shots: Path) -> None:
    page = await logged_in(browser, server, server.token, viewport={"width": 1366, "height": 768})
    async with server.client() as c:
        fleet = (await c.post("/api/project/main/fleets/get", json={"name": "fl"})).json()
    await a_volume(server, "main", "vol-shown")
    for name, path in [
        ("fleets", "/fleets"),
        ("fleet", f"/projects/main/fleets/{fleet['id']}"),
        ("instances", "/instances"),
        ("offers", "/offers"),
        ("volumes", "/volumes"),
        ("models-none", "/models"),
        ("new-run", "/runs/new"),
        ("projects", "/projects"),
        ("project", "/projects/main"),
        ("users", "/users"),
        ("events", "/events"),
        ("not-found", "/no-such-page"),
    ]:
        await page.goto(path)
        await audit(page, name, shots)
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.goto("/runs")
    wide = await page.evaluate("document.documentElement.scrollWidth")
    assert wide <= 390, f"the runs page is {wide}px wide on a phone"
    await audit(page, "runs-phone", shots)
    await page.goto("/projects")
    await page.keyboard.press("Tab")  # the skip link comes first, and shows its focus
    assert await page.evaluate("document.activeElement.className") == "skip"
    assert await page.evaluate("getComputedStyle(document.activeElement).outlineStyle") == "solid"
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.textContent") == "corral"
    await page.context.close()
    login = await (await browser.new_context(base_url=server.url)).new_page()
    await login.goto("/login")
    await audit(login, "login", shots)
    await login.context.close()


async def test_a_member_sees_no_admin_page_and_gets_403(browser: Browser, server: RunningServer, shots: Path) -> None:
    page = await logged_in(browser, server, await token_of(server, "bob"))
    nav = page.get_by_role("navigation", name="Main")
    await expect(nav.get_by_role("link", name="Runs")).to_be_visible()
    assert await nav.get_by_role("link", name="Users").count() == 0
    response = await page.goto("/users")
    assert response is not None and response.status == 403
    await expect(page.get_by_role("heading", name="Access denied")).to_be_visible()
    await audit(page, "forbidden", shots)
    await page.goto("/projects/main")
    assert await page.get_by_role("button", name="Add member").count() == 0
    await page.context.close()


async def test_a_service_page_cannot_act_with_the_admins_rights(browser: Browser, server: RunningServer) -> None:
    port = free_port()
    conf = {
        "type": "service",
        "name": "page-svc",
        "port": port,
        "auth": False,
        "commands": [f"echo {SERVICE_APP} | base64 -d > app.py", f"exec python3 app.py {port}"],
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
    }
    async with server.client() as c:
        r = await c.post(
            "/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {"configuration": conf}}}
        )
        assert r.status_code == 200, r.text

        async def ready() -> bool:
            run = await get_run(c, "page-svc")
            return any(j["job_submissions"][-1].get("corral_ready") for j in run["jobs"])

        await wait_for(ready, timeout=60, interval=0.2)
    page = await logged_in(browser, server, server.token)
    response = await page.goto("/proxy/services/main/page-svc/")
    assert response is not None and response.status == 200
    assert (await response.all_headers())["content-security-policy"].startswith("sandbox")
    await page.wait_for_selector("body[data-results]", timeout=15_000)
    results = json.loads(await page.get_attribute("body", "data-results") or "{}")
    assert results["cookie"].startswith("blocked") or results["cookie"] == "", results
    assert results["storage"].startswith("blocked"), results
    assert results["api"].startswith("blocked"), results  # cross-origin for an opaque origin: unreadable
    assert results["ui_page"].startswith("blocked"), results
    async with server.client() as c:
        users = [u["username"] for u in (await c.post("/api/users/list", json={})).json()]
        assert "evil" not in users  # the form post reached the UI without the session, and was refused
        r = await c.post("/api/project/main/runs/stop", json={"runs_names": ["page-svc"], "abort": True})
        assert r.status_code == 200
    await page.context.close()


async def test_the_list_and_a_runs_page_say_where_it_ran_and_what_it_cost(
    browser: Browser, server: RunningServer
) -> None:
    page = await logged_in(browser, server, server.token, viewport={"width": 1366, "height": 768})
    await expect(page.locator("[data-live-state]")).to_contain_text("Live")
    async with server.client() as c:
        r = await c.post("/api/project/main/runs/apply", json=task_body(["sleep 4"], name="priced-run"))
        assert r.status_code == 200, r.text
        run = r.json()
        row = page.locator(f'tr[data-run="{run["id"]}"]')
        await expect(row.locator(".status")).to_have_text("running", timeout=30_000)
        await expect(row.locator(f'[data-cost="{run["id"]}"]')).to_have_text("$0")  # a local host bills nothing
        # placed half an hour ago at $2.00 an hour, as a job on a cloud instance would have been: the run costs
        # $1 and a little more once it ends, and the open list shows it without a reload
        async with server.ctx.db.write() as conn:
            await conn.execute(
                sa.update(jobs).where(jobs.c.run_id == run["id"]).values(price=2.0, placed_at=time.time() - 1800)
            )
        ended = await finished_run(c, "priced-run", timeout=30)
    cost = f"${ended['cost']:.4f}".rstrip("0").rstrip(".")
    assert cost.startswith("$1.00"), ended["cost"]
    await expect(row.locator(".status")).to_have_text("done", timeout=15_000)
    await expect(row.locator(f'[data-cost="{run["id"]}"]')).to_have_text(cost)
    await expect(row.locator(f'[data-backend="{run["id"]}"]')).to_have_text("local")  # where it ran: this machine
    await row.get_by_role("link", name="priced-run").click()
    await page.wait_for_url(f"**/projects/main/runs/{run['id']}")
    await expect(page.locator(f'dd[data-cost="{run["id"]}"]')).to_have_text(cost)
    jobs_table = page.get_by_role("table", name="Jobs and their submissions, newest submission first")
    await expect(jobs_table.get_by_role("columnheader", name="Backend")).to_be_visible()
    await expect(jobs_table).to_contain_text("local")
    await page.context.close()


async def test_new_run_page_plans_then_applies_and_names_a_bad_field(
    browser: Browser, server: RunningServer, shots: Path
) -> None:
    page = await logged_in(browser, server, server.token, viewport={"width": 1366, "height": 768})
    await page.get_by_role("link", name="New run").click()
    await page.wait_for_url("**/runs/new")
    conf = page.get_by_label("Configuration (YAML, as in a .dstack.yml)")
    await conf.fill("type: task\nname: page-run\ncommands: [echo hi]\nresources:\n  cpu: lots\n")
    await page.get_by_role("button", name="Show plan").click()
    await expect(page.get_by_role("alert")).to_contain_text("configuration.")
    await expect(page.get_by_role("alert")).to_contain_text("cpu")
    await audit(page, "new-run-refused", shots)
    await conf.fill("type: task\nname: page-run\ncommands: [echo hi]\nresources:\n  cpu: 1..\n  memory: 0.1GB..\n")
    await page.get_by_role("button", name="Show plan").click()
    await expect(page.get_by_role("heading", name="Plan for page-run")).to_be_visible()
    await expect(page.locator("[data-plan-action]")).to_have_text("create")
    await audit(page, "new-run-plan", shots)
    async with server.client() as c:
        r = await c.post("/api/project/main/runs/get", json={"run_name": "page-run"})
        assert r.status_code == 400  # the plan submitted nothing
    await page.get_by_role("button", name="Apply").click()
    await page.wait_for_url("**/projects/main/runs/*")
    await expect(page.locator("h1")).to_contain_text("page-run")

    async def done() -> bool:
        async with server.client() as c:
            return bool((await get_run(c, "page-run"))["status"] == "done")

    await wait_for(done, timeout=60)
    await page.context.close()


async def test_models_page_and_a_playground_streaming_with_the_session(
    browser: Browser, server: RunningServer, shots: Path
) -> None:
    port = free_port()
    conf = {
        "type": "service",
        "name": "chat-svc",
        "port": port,
        "model": "org/chat",
        "env": {"MODEL": "org/chat"},
        "commands": [f"echo {MODEL_APP} | base64 -d > app.py", f"exec python3 app.py {port}"],
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
    }
    async with server.client() as c:
        r = await c.post(
            "/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {"configuration": conf}}}
        )
        assert r.status_code == 200, r.text

        async def ready() -> bool:
            got = await get_run(c, "chat-svc")
            return any(j["job_submissions"][-1].get("corral_ready") for j in got["jobs"])

        await wait_for(ready, timeout=60, interval=0.2)
        r = await c.post("/api/users/create", json={"username": "eve", "global_role": "user"})
        assert r.status_code == 200, r.text
    page = await logged_in(browser, server, await token_of(server, "bob"), viewport={"width": 1366, "height": 768})
    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Models").click()
    row = page.get_by_role("row").filter(has_text="org/chat")
    await expect(row).to_contain_text("chat-svc")
    await audit(page, "models", shots)
    await row.get_by_role("link", name="Chat with org/chat").click()
    await page.wait_for_url(re.compile(r"/projects/main/models/playground\?model=org(%2F|/)chat$"))
    requests: list[dict[str, Any]] = []
    page.on("request", lambda rq: requests.append({"url": rq.url, "headers": rq.headers, "body": rq.post_data}))
    await page.get_by_label("Message").fill("hi there")
    await page.get_by_role("button", name="Send").click()
    answer = page.locator(".chat-assistant p")
    await expect(answer).to_have_text("hello from org/chat", timeout=15_000)
    await expect(page.locator("[data-chat-state]")).to_have_text("Answered.")
    sent = next(rq for rq in requests if rq["url"].endswith("/proxy/models/main/chat/completions"))
    assert "authorization" not in sent["headers"]  # the session, not a token
    assert json.loads(sent["body"])["stream"] is True
    await audit(page, "playground", shots)
    # the endpoint with the session cookie alone (no CSRF token, or another origin) is refused
    cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
    csrf = await page.get_attribute("[data-playground]", "data-csrf")
    body = {"model": "org/chat", "messages": [{"role": "user", "content": "hi"}]}
    url = "/proxy/models/main/chat/completions"
    async with httpx.AsyncClient(base_url=server.url, cookies=cookies, timeout=30) as raw:
        r = await raw.post(url, json=body, headers={"Origin": server.url})
        assert r.status_code == 403, r.text
        r = await raw.post(url, json=body, headers={"Origin": "http://evil.example", "X-Corral-CSRF": csrf or ""})
        assert r.status_code == 403, r.text
        r = await raw.post(url, json=body, headers={"Origin": server.url, "X-Corral-CSRF": csrf or ""})
        assert r.status_code == 200 and r.json()["model"] == "org/chat", r.text
    await page.context.close()
    # a user of no project sees no model and may not open the playground
    eve = await logged_in(browser, server, await token_of(server, "eve"))
    await eve.goto("/models")
    await expect(eve.get_by_text("No models yet.")).to_be_visible()
    response = await eve.goto("/projects/main/models/playground?model=org%2Fchat")
    assert response is not None and response.status == 403
    await eve.context.close()
    async with server.client() as c:
        r = await c.post("/api/project/main/runs/stop", json={"runs_names": ["chat-svc"], "abort": True})
        assert r.status_code == 200
