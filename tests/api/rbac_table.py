"""Who may call what: dstack 0.22.5's answers for every corral route, as data (read by test_rbac_matrix.py).

Where each rule comes from (dstack 0.22.5, ``dstack/_internal/server/``):

- a route's ``rule`` is the permission dependency its router declares (``routers/<name>.py``), whose
  meaning is in ``security/permissions.py``:

  ============================  =====================================================================
  ``none``                      no dependency (``server/get_info``, ``backends/list_types``, healthcheck)
  ``authenticated``             ``Authenticated()``: any active user
  ``global_admin``              ``GlobalAdmin()``
  ``member``                    ``ProjectMember()``; also ``ProjectManagerOrSelfLeave()`` (any member)
  ``member_or_public``          ``ProjectMemberOrPublicAccess()``; ``check_can_access_gateway``
  ``manager``                   ``ProjectManager()``
  ``manager_or_public``         ``ProjectManagerOrPublicProject()``
  ``admin``                     ``ProjectAdmin()``
  ============================  =====================================================================

  A global admin passes every rule. Refusals: no token 401 ``{"detail": "Not authenticated"}``, a bad token
  403 ``{"detail": {"msg": "Invalid token"}}``, a rule not met 403 ``{"detail": {"msg": "Access denied"}}``
  (``error_forbidden()``).
- ``then`` is a second check the service makes after the route admitted the caller, refused with
  ``ForbiddenError`` (403 with the bare body ``{"msg": ..., "code": null}``): ``services/projects.py``
  (``delete_projects`` needs a project admin, ``add_project_members`` and ``remove_project_members`` a
  manager unless joining or leaving oneself), ``services/secrets.py`` (``_check_can_manage_secrets``: admins
  only, ``allow_managers_manage_secrets`` is off by default).
- ``ok`` is the answer a caller who passes both gets for the body given (a 400 where the body names
  something that does not exist, so that the matrix changes nothing); ``by_caller`` overrides it where the
  service answers by who asks (``services/users.py``: another user's ``get_user`` is "not found", their
  ``refresh_token``/``refresh_ssh_key`` is ``error_forbidden()``).

Bodies may use ``$members`` (the target project's members exactly as the fixture set them, so that a
manager's ``set_members`` changes no admin) and ``$uuid`` (a fresh id).
"""

from __future__ import annotations

from typing import Any

#: The roles a rule admits (a global admin always passes); ``public``: also any user when the project is public.
RULES: dict[str, dict[str, Any]] = {
    "member": {"roles": {"admin", "manager", "user"}, "public": False},  # ProjectMember
    "member_or_public": {"roles": {"admin", "manager", "user"}, "public": True},  # ProjectMemberOrPublicAccess
    "manager": {"roles": {"admin", "manager"}, "public": False},  # ProjectManager
    "manager_or_public": {"roles": {"admin", "manager"}, "public": True},  # ProjectManagerOrPublicProject
    "admin": {"roles": {"admin"}, "public": False},  # ProjectAdmin
}

P = "/api/project/{p}"
_FLEET_SPEC = {
    "configuration": {"type": "fleet", "name": "fl", "nodes": "0..2", "resources": {"cpu": "1.."}},
    "profile": {},
}
_TASK_SPEC = {"configuration": {"type": "task", "commands": ["true"]}}
_GATEWAY = {"type": "gateway", "name": "gw", "backend": "aws", "region": "eu-west-1", "domain": "example.com"}

# (method, path, rule, then, body, ok, by_caller) -- one row per route corral serves.
ROUTES: list[tuple[str, str, str, str | None, Any, str, dict[str, str]]] = [
    # routers/server.py, routers/backends.py (root router), app.py's healthcheck
    ("GET", "/healthcheck", "none", None, None, "200", {}),
    # routers/prometheus.py: its own token (DSTACK_PROMETHEUS_AUTH_TOKEN), none of a user; off by default: 404
    ("GET", "/metrics", "none", None, None, "404", {}),
    ("POST", "/api/server/get_info", "none", None, None, "200", {}),
    ("POST", "/api/backends/list_types", "none", None, None, "200", {}),
    # routers/backends.py (project router): ProjectAdmin; the bodies name nothing that exists (400)
    ("POST", P + "/backends/create", "admin", None, {"type": "local"}, "400", {}),
    ("POST", P + "/backends/update", "admin", None, {"type": "aws", "creds": {"type": "default"}}, "400", {}),
    ("POST", P + "/backends/delete", "admin", None, {"backends_names": ["aws"]}, "400", {}),
    ("POST", P + "/backends/{backend_name}/config_info", "admin", None, None, "400", {}),
    ("POST", P + "/backends/create_yaml", "admin", None, {"config_yaml": "type: local"}, "400", {}),
    (
        "POST",
        P + "/backends/update_yaml",
        "admin",
        None,
        {"config_yaml": "{type: aws, creds: {type: default}}"},
        "400",
        {},
    ),
    ("POST", P + "/backends/{backend_name}/get_yaml", "admin", None, None, "400", {}),
    # routers/users.py
    ("POST", "/api/users/get_my_user", "authenticated", None, None, "200", {}),
    ("POST", "/api/users/get_user", "authenticated", None, {"username": "bystander"}, "400", {"gadmin": "200"}),
    ("POST", "/api/users/list", "authenticated", None, {}, "200", {}),
    (
        "POST",
        "/api/users/create",
        "global_admin",
        None,
        {"username": "bystander", "global_role": "user"},
        "400",  # resource_exists
        {},
    ),
    ("POST", "/api/users/update", "global_admin", None, {"username": "bystander", "global_role": "user"}, "200", {}),
    ("POST", "/api/users/refresh_token", "authenticated", None, {"username": "bystander"}, "403", {"gadmin": "200"}),
    ("POST", "/api/users/refresh_ssh_key", "authenticated", None, {"username": "bystander"}, "403", {"gadmin": "200"}),
    ("POST", "/api/users/delete", "global_admin", None, {"users": ["admin"]}, "400", {}),
    # routers/public_keys.py
    ("POST", "/api/users/public_keys/list", "authenticated", None, None, "200", {}),
    ("POST", "/api/users/public_keys/add", "authenticated", None, {"key": "not a key"}, "400", {}),
    ("POST", "/api/users/public_keys/delete", "authenticated", None, {"ids": ["$uuid"]}, "200", {}),
    # routers/projects.py
    ("POST", "/api/projects/list", "authenticated", None, {}, "200", {}),
    ("POST", "/api/projects/list_only_no_fleets", "authenticated", None, None, "200", {}),
    ("POST", "/api/projects/create", "authenticated", None, {"project_name": "alpha"}, "400", {}),
    # Authenticated(), then delete_projects: project admins only; every fixture project has a fleet, so an
    # admitted caller is told "Failed to delete project with active fleets" (400) and nothing is deleted.
    ("POST", "/api/projects/delete", "authenticated", "admin", {"projects_names": ["{p}"]}, "400", {}),
    ("POST", "/api/projects/{p}/get", "member_or_public", None, None, "200", {}),
    ("POST", "/api/projects/{p}/update", "admin", None, {}, "200", {}),
    ("POST", "/api/projects/{p}/set_members", "manager", None, {"members": "$members"}, "200", {}),
    (
        "POST",
        "/api/projects/{p}/add_members",
        "manager_or_public",
        "manager",  # not a self-join: add_project_members needs a manager
        {"members": [{"username": "bystander", "project_role": "user"}]},
        "200",
        {},
    ),
    (
        "POST",
        "/api/projects/{p}/remove_members",
        "member",  # ProjectManagerOrSelfLeave admits any member
        "manager",  # not a self-leave: remove_project_members needs a manager
        {"usernames": ["loner"]},
        "400",  # User is not a member of this project
        {},
    ),
    # routers/fleets.py
    ("POST", "/api/fleets/list", "authenticated", None, {}, "200", {}),
    ("POST", P + "/fleets/list", "member", None, {}, "200", {}),
    ("POST", P + "/fleets/get", "member", None, {"name": "fl"}, "200", {}),  # check_can_access_fleet
    ("POST", P + "/fleets/get_plan", "member", None, {"spec": _FLEET_SPEC}, "200", {}),
    ("POST", P + "/fleets/apply", "member", None, {"plan": {"spec": _FLEET_SPEC}, "force": True}, "200", {}),
    # delete_fleets does not complain about names or instances that do not exist
    ("POST", P + "/fleets/delete", "member", None, {"names": ["no-such-fleet"]}, "200", {}),
    ("POST", P + "/fleets/delete_instances", "member", None, {"name": "fl", "instance_nums": [99]}, "200", {}),
    # routers/instances.py
    ("POST", "/api/instances/list", "authenticated", None, {}, "200", {}),
    # Authenticated() + Project(), then check_can_access_instance: a member of the instance's project (or
    # of one its fleet is exported to); an instance that does not exist is "not found" for members only
    ("POST", P + "/instances/get", "member", None, {"id": "$uuid"}, "400", {}),
    (
        "POST",
        P + "/instances/get_instance_health_checks",
        "member",
        None,
        {"fleet_name": "f", "instance_num": 0},
        "400",  # fleet f has no instance 0 (nodes 0..2, nothing running)
        {},
    ),
    # routers/runs.py, logs.py, metrics.py
    ("POST", "/api/runs/list", "authenticated", None, {}, "200", {}),
    ("POST", P + "/runs/list", "member", None, {}, "200", {}),
    ("POST", P + "/runs/get", "member", None, {"run_name": "no-such-run"}, "400", {}),
    ("POST", P + "/runs/get_plan", "member", None, {"run_spec": _TASK_SPEC}, "200", {}),
    # a task with neither commands nor an image: refused (422) before anything is written
    (
        "POST",
        P + "/runs/apply",
        "member",
        None,
        {"plan": {"run_spec": {"configuration": {"type": "task"}}}, "force": False},
        "422",
        {},
    ),
    ("POST", P + "/runs/stop", "member", None, {"runs_names": ["no-such-run"]}, "200", {}),  # no error in dstack
    ("POST", P + "/runs/delete", "member", None, {"runs_names": ["no-such-run"]}, "400", {}),
    ("POST", P + "/logs/poll", "member", None, {"run_name": "no-such-run", "job_submission_id": "$uuid"}, "400", {}),
    ("GET", P + "/metrics/job/{run_name}", "member", None, None, "400", {}),
    # routers/gateways.py: reads admit public access, changes need ProjectAdmin
    ("POST", P + "/gateways/get_plan", "admin", None, {"spec": {"configuration": _GATEWAY}}, "400", {}),
    ("POST", P + "/gateways/apply", "admin", None, {"plan": {"spec": {"configuration": _GATEWAY}}}, "400", {}),
    ("POST", P + "/gateways/list", "member_or_public", None, {}, "200", {}),
    ("POST", P + "/gateways/get", "member_or_public", None, {"name": "gw"}, "400", {}),
    ("POST", P + "/gateways/delete", "admin", None, {"names": ["gw"]}, "200", {}),
    ("POST", P + "/gateways/create", "admin", None, {"configuration": _GATEWAY}, "400", {}),
    ("POST", P + "/gateways/set_default", "admin", None, {"name": "gw"}, "400", {}),
    (
        "POST",
        P + "/gateways/set_wildcard_domain",
        "admin",
        None,
        {"name": "gw", "wildcard_domain": "a.test"},
        "400",
        {},
    ),
    # routers/volumes.py: every project route is ProjectMember
    (
        "POST",
        P + "/volumes/create",
        "member",
        None,
        {"configuration": {"type": "volume", "name": "vol", "backend": "aws", "region": "eu-west-1", "size": 100}},
        "400",
        {},
    ),
    ("POST", P + "/volumes/list", "member", None, {}, "200", {}),
    ("POST", "/api/volumes/list", "authenticated", None, {}, "200", {}),
    ("POST", P + "/volumes/get", "member", None, {"name": "vol"}, "400", {}),
    ("POST", P + "/volumes/delete", "member", None, {"names": ["vol"]}, "200", {}),
    # routers/events.py, secrets.py, gpus.py
    ("POST", "/api/events/list", "authenticated", None, {}, "200", {}),
    # routers/secrets.py: ProjectManager, then _check_can_manage_secrets (admins; managers only with
    # default_permissions.allow_managers_manage_secrets, off here as in dstack)
    ("POST", P + "/secrets/list", "manager", "admin", {}, "200", {}),
    ("POST", P + "/secrets/get", "manager", "admin", {"name": "no-such-secret"}, "400", {}),
    ("POST", P + "/secrets/create_or_update", "manager", "admin", {"name": "not a name", "value": "v"}, "400", {}),
    ("POST", P + "/secrets/delete", "manager", "admin", {"secrets_names": ["no-such-secret"]}, "400", {}),
    ("POST", P + "/gpus/list", "member", None, {"run_spec": _TASK_SPEC}, "200", {}),
    # routers/templates.py (no templates repo: an empty list), auth.py (no OAuth2 providers)
    ("POST", P + "/templates/list", "member", None, None, "200", {}),
    ("POST", "/api/auth/list_providers", "none", None, None, "200", {}),
    ("POST", "/api/auth/get_next_redirect", "none", None, {"code": "c", "state": "not-a-state"}, "400", {}),
    # routers/exports.py, imports.py
    ("POST", P + "/exports/create", "admin", None, {"name": "no-such-export", "exported_fleets": ["nope"]}, "400", {}),
    ("POST", P + "/exports/update", "admin", None, {"name": "no-such-export"}, "400", {}),
    ("POST", P + "/exports/delete", "admin", None, {"name": "no-such-export"}, "400", {}),
    ("POST", P + "/exports/list", "member", None, {}, "200", {}),
    # corral's own: per-project quotas (a global admin sets them; any member reads them) and the queue
    ("POST", "/api/projects/{p}/quotas/set", "global_admin", None, {}, "200", {}),
    ("POST", "/api/projects/{p}/quotas/get", "member", None, None, "200", {}),
    ("POST", "/api/projects/{p}/quotas/usage", "member", None, None, "200", {}),
    ("POST", "/api/scheduling/queue", "authenticated", None, None, "200", {}),
    ("POST", P + "/imports/list", "member", None, {}, "200", {}),
    (
        "POST",
        P + "/imports/delete",
        "admin",
        None,
        {"export_name": "no-such-export", "export_project_name": "main"},
        "400",
        {},
    ),
    # routers/repos.py, files.py
    (
        "POST",
        P + "/repos/init",
        "member",
        None,
        {"repo_id": "rbac-repo", "repo_info": {"repo_type": "virtual"}},
        "200",
        {},
    ),
    ("POST", P + "/repos/list", "member", None, {}, "200", {}),
    ("POST", P + "/repos/get", "member", None, {"repo_id": "no-such-repo"}, "400", {}),
    ("POST", P + "/repos/delete", "member", None, {"repos_ids": ["no-such-repo"]}, "200", {}),
    ("POST", P + "/repos/upload_code?repo_id=no-such-repo", "member", None, {}, "400", {}),
    ("POST", "/api/files/upload_archive", "authenticated", None, {}, "400", {}),
    ("POST", "/api/files/get_archive_by_hash", "authenticated", None, {"hash": "0" * 64}, "400", {}),
]
