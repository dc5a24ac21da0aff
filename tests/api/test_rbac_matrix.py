"""The RBAC matrix: every route corral serves x {no token, bad token, non-member, non-member of a public
project, user, manager, project admin, global admin} x {own project, another project}, against one real
server per database (SQLite, Postgres), checked against dstack 0.22.5's answers (``rbac_table.py``)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from rbac_table import ROUTES, RULES

from server_harness import fleet_body, make_settings, running_server

USERS = ("outsider", "puser", "pmanager", "padmin", "bystander", "loner")
#: The fixture's members, project by project (the global admin ``admin`` made every project).
MEMBERS: dict[str, dict[str, str]] = {
    "alpha": {"padmin": "admin", "pmanager": "manager", "puser": "user", "bystander": "user"},
    "beta": {"admin": "admin", "bystander": "user"},
    "pub": {"admin": "admin", "bystander": "user"},
}
PUBLIC = {"pub"}
#: (who, caller, their "own" project): "another project" is always ``beta``, where none of them has a role.
CASES = (
    ("no token", "anon", "alpha"),
    ("bad token", "bad", "alpha"),
    ("non-member", "outsider", "alpha"),
    ("public non-member", "outsider", "pub"),
    ("user", "puser", "alpha"),
    ("manager", "pmanager", "alpha"),
    ("project admin", "padmin", "alpha"),
    ("global admin", "gadmin", "alpha"),
)
ANOTHER = "beta"


def _admits(rule: str, role: str | None, project: str) -> bool:
    spec = RULES[rule]
    return role in spec["roles"] or (spec["public"] and project in PUBLIC)


def expected(row: tuple[Any, ...], caller: str, project: str) -> str:
    _method, _path, rule, then, _body, ok, by_caller = row
    if rule == "none":
        return str(ok)
    if caller == "anon":
        return "401"
    if caller == "bad":
        return "403:invalid"
    if caller != "gadmin":  # a global admin passes every rule (security/permissions.py)
        role = MEMBERS[project].get(caller)
        if rule == "global_admin" or (rule in RULES and not _admits(rule, role, project)):
            return "403"
        if then is not None and not _admits(then, role, project="-"):
            return "403:bare"
    return str(by_caller.get(caller, ok))


def _body(template: Any, project: str) -> Any:
    if template == "$members":
        return [{"username": u, "project_role": r} for u, r in MEMBERS[project].items()]
    if template == "$uuid":
        return str(uuid.uuid4())
    if isinstance(template, str):
        return template.replace("{p}", project)
    if isinstance(template, dict):
        return {k: _body(v, project) for k, v in template.items()}
    if isinstance(template, list):
        return [_body(v, project) for v in template]
    return template


def _answer(r: httpx.Response) -> str:
    """The response in the table's terms: the status, and for a 403 which of dstack's bodies it is."""
    if r.status_code == 401:
        return "401" if r.json() == {"detail": "Not authenticated"} else f"401 {r.text}"
    if r.status_code != 403:
        return str(r.status_code)
    body = r.json()
    if body == {"detail": {"msg": "Invalid token", "code": None}}:
        return "403:invalid"
    if body == {"detail": {"msg": "Access denied", "code": None}}:
        return "403"
    if set(body) == {"msg", "code"} and str(body["msg"]).startswith("Access denied") and body["code"] is None:
        return "403:bare"
    return f"403 {r.text}"


async def _setup(c: httpx.AsyncClient) -> dict[str, str]:
    tokens = {}
    for name in USERS:
        r = await c.post("/api/users/create", json={"username": name, "global_role": "user"})
        assert r.status_code == 200, r.text
        tokens[name] = (await c.post("/api/users/get_user", json={"username": name})).json()["creds"]["token"]
    for project, members in MEMBERS.items():
        r = await c.post("/api/projects/create", json={"project_name": project, "is_public": project in PUBLIC})
        assert r.status_code == 200, r.text
        r = await c.post(f"/api/project/{project}/fleets/apply", json=fleet_body(name="fl"))
        assert r.status_code == 200, r.text
        body = {"members": [{"username": u, "project_role": role} for u, role in members.items()]}
        assert (await c.post(f"/api/projects/{project}/set_members", json=body)).status_code == 200
    return tokens


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
async def test_every_route_answers_every_caller_as_dstack_does(tmp_path: Path, database: str) -> None:
    settings = make_settings(tmp_path)
    if database == "postgres":
        from pg_harness import new_database_url

        settings = replace(settings, database_url=new_database_url())
    async with running_server(settings) as s:
        from corral.api.app import TABLES

        served = {(spec.method, spec.path) for table in TABLES for spec in table.routes}
        listed = {(m, p.split("?")[0].replace("{p}", "{project_name}")) for m, p, *_ in ROUTES}
        assert served - listed == set(), "routes missing from tests/api/rbac_table.py"
        assert listed - served == set(), "rows of tests/api/rbac_table.py that corral does not serve"

        async with s.client() as admin:
            tokens = await _setup(admin)
        tokens["gadmin"] = s.token
        tokens["bad"] = "not-a-token"
        mismatches = []
        checked = 0
        async with httpx.AsyncClient(base_url=s.url, timeout=30) as c:
            for row in ROUTES:
                method, path, _rule, _then, body, _ok, _by = row
                for who, caller, own in CASES:
                    for where, project in (("own project", own), ("another project", ANOTHER)):
                        headers = {} if caller == "anon" else {"Authorization": f"Bearer {tokens[caller]}"}
                        url = path.replace("{p}", project).replace("{run_name}", "no-such-run")
                        kw: dict[str, Any] = {"headers": headers}
                        if body is not None:
                            kw["json"] = _body(body, project)
                        r = await c.request(method, url, **kw)
                        got, want = _answer(r), expected(row, caller, project)
                        checked += 1
                        if got != want:
                            mismatches.append(
                                f"{method} {url} as {who} ({where}): got {got}, want {want}: {r.text[:200]}"
                            )
        assert checked == len(ROUTES) * len(CASES) * 2
        assert not mismatches, f"{len(mismatches)} of {checked} answers differ from dstack's:\n" + "\n".join(mismatches)
