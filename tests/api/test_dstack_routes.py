"""dstack 0.22.5's REST routes that corral serves: every one of the 84 route decorators of dstack's
``src/dstack/_internal/server/routers/*.py`` but ``POST /api/sshproxy/get_upstream`` (used only by the separate
``dstack-sshproxy`` component, which corral's SSH endpoint replaces: docs/runs/attach.md). The list below is
this test's own copy of dstack's routers (tag 0.22.5), path parameters written ``{}``."""

from __future__ import annotations

import re

from corral.api.app import TABLES

_P = "/api/project/{}"
#: dstack 0.22.5's route decorators, router by router (``routers/<name>.py``).
DSTACK_ROUTES: dict[str, list[str]] = {
    "server": ["POST /api/server/get_info"],
    "auth": ["POST /api/auth/list_providers", "POST /api/auth/get_next_redirect"],
    "users": [f"POST /api/users/{x}" for x in ("list", "get_my_user", "get_user", "create", "update", "delete")]
    + [f"POST /api/users/{x}" for x in ("refresh_ssh_key", "refresh_token")]
    + [f"POST /api/users/public_keys/{x}" for x in ("list", "add", "delete")],
    "projects": [f"POST /api/projects/{x}" for x in ("list", "list_only_no_fleets", "create", "delete")]
    + [f"POST /api/projects/{{}}/{x}" for x in ("get", "set_members", "add_members", "remove_members", "update")],
    "backends": ["POST /api/backends/list_types"]
    + [
        f"POST {_P}/backends/{x}"
        for x in ("create", "update", "delete", "{}/config_info", "create_yaml", "update_yaml", "{}/get_yaml")
    ],
    "fleets": ["POST /api/fleets/list"]
    + [f"POST {_P}/fleets/{x}" for x in ("list", "get", "get_plan", "apply", "delete", "delete_instances")],
    "instances": ["POST /api/instances/list"]
    + [f"POST {_P}/instances/{x}" for x in ("get", "get_instance_health_checks")],
    "runs": ["POST /api/runs/list"] + [f"POST {_P}/runs/{x}" for x in ("get", "get_plan", "apply", "stop", "delete")],
    "gpus": [f"POST {_P}/gpus/list"],
    "repos": [f"POST {_P}/repos/{x}" for x in ("list", "get", "init", "delete", "upload_code")],
    "files": ["POST /api/files/upload_archive", "POST /api/files/get_archive_by_hash"],
    "secrets": [f"POST {_P}/secrets/{x}" for x in ("list", "get", "create_or_update", "delete")],
    "gateways": [
        f"POST {_P}/gateways/{x}"
        for x in ("list", "get", "get_plan", "apply", "create", "delete", "set_default", "set_wildcard_domain")
    ],
    "volumes": ["POST /api/volumes/list"] + [f"POST {_P}/volumes/{x}" for x in ("list", "get", "create", "delete")],
    "logs": [f"POST {_P}/logs/poll"],
    "metrics": [f"GET {_P}/metrics/job/{{}}"],
    "events": ["POST /api/events/list"],
    "exports": [f"POST {_P}/exports/{x}" for x in ("create", "update", "delete", "list")],
    "imports": [f"POST {_P}/imports/{x}" for x in ("list", "delete")],
    "templates": [f"POST {_P}/templates/list"],
    "sshproxy": ["POST /api/sshproxy/get_upstream"],
    "prometheus": ["GET /metrics"],
}
NOT_SERVED = {"POST /api/sshproxy/get_upstream"}


def served() -> set[str]:
    return {re.sub(r"\{[^}]*\}", "{}", f"{r.method} {r.path}") for table in TABLES for r in table.routes}


def test_corral_serves_83_of_dstacks_84_routes() -> None:
    every = [route for routes in DSTACK_ROUTES.values() for route in routes]
    assert len(every) == len(set(every)) == 84
    missing = [route for route in every if route not in served()]
    assert missing == sorted(NOT_SERVED), missing
    assert len(every) - len(missing) == 83


def test_every_gateway_route_is_served() -> None:
    assert set(DSTACK_ROUTES["gateways"]) <= served()
