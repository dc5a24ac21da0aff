"""Who may do what: dstack 0.22.5's permission rules, as pure functions of roles.

Two kinds of rule, as dstack has them:

- **Route rules** (dstack's FastAPI dependencies in ``server/security/permissions.py``): whether a caller
  with a global role, a role in the project (or none) and the project's visibility reaches a route at all.
  A refusal there is dstack's ``error_forbidden()``: 403 ``{"detail": {"msg": "Access denied"}}``.
- **Member rules** (``server/services/projects.py``: ``set_project_members``, ``add_project_members``,
  ``remove_project_members``): what a caller who reached the route may change about the members. A
  refusal there is dstack's ``ForbiddenError(msg)`` (403 ``{"msg": "Access denied: ...", "code": null}``)
  or a ``ServerClientError`` (400).

Also here: which backends a project may run code on (the local backend only where the project's stored
backends name it: the server's ``config.yml`` or the first-start ``main`` project, never an API-made one).

Imports nothing but the standard library.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Rule = Literal[
    "member",  # ProjectMember: global admin or any project role
    "member_or_public",  # ProjectMemberOrPublicAccess: ... or any authenticated user if the project is public
    "manager",  # ProjectManager: global admin, project admin or manager
    "manager_or_public",  # ProjectManagerOrPublicProject: ... or any authenticated user if public
    "admin",  # ProjectAdmin: global admin or project admin
]
RULES: tuple[Rule, ...] = ("member", "member_or_public", "manager", "manager_or_public", "admin")
PROJECT_ROLES = ("admin", "manager", "user")


def may_reach(rule: Rule, global_role: str, project_role: str | None, is_public: bool) -> bool:
    """Whether a caller passes the route rule ``rule`` for a project (dstack's dependency classes)."""
    if global_role == "admin":
        return True
    if rule == "member":
        return project_role is not None
    if rule == "member_or_public":
        return project_role is not None or is_public
    if rule == "manager":
        return project_role in ("admin", "manager")
    if rule == "manager_or_public":
        return project_role in ("admin", "manager") or is_public
    if rule == "admin":
        return project_role == "admin"
    raise ValueError(f"unknown access rule {rule!r}")


def reads_all_events(global_role: str) -> bool:
    """``events/list``: a global admin reads every event; anyone else those with a target in a project they
    are a member of (any role) or about their own user (dstack's ``list_events``)."""
    return global_role == "admin"


def can_manage_secrets(global_role: str, project_role: str | None, managers_may: bool = False) -> bool:
    """``get_member_permissions``: global and project admins, and project managers when the server's
    ``config.yml`` sets ``default_permissions.allow_managers_manage_secrets`` (``managers_may``; off by
    default, as in dstack)."""
    return global_role == "admin" or project_role == "admin" or (project_role == "manager" and managers_may)


@dataclass(frozen=True)
class Denied:
    """A member change refused: ``status`` 403 (``ForbiddenError``) or 400 (``ServerClientError``)."""

    status: int
    msg: str


def _duplicates(usernames: Sequence[str]) -> Denied | None:
    if len(set(usernames)) != len(usernames):
        return Denied(400, "Cannot add same user multiple times")
    return None


def check_set_members(
    global_role: str,
    caller_role: str | None,
    new: Sequence[tuple[str, str]],
    current: Sequence[tuple[str, str]],
) -> Denied | None:
    """``set_project_members``: ``new`` and ``current`` are ``(username, role)`` pairs. A manager (who is not
    a global admin) must leave the set of admins exactly as it is."""
    dup = _duplicates([name for name, _ in new])
    if dup is not None:
        return dup
    admins_change = {m for m in new if m[1] == "admin"} != {m for m in current if m[1] == "admin"}
    if global_role != "admin" and caller_role == "manager" and admins_change:
        return Denied(403, "Access denied: changing project admins")
    return None


def check_add_members(
    global_role: str,
    caller_name: str,
    caller_email: str | None,
    caller_role: str | None,
    is_public: bool,
    new: Sequence[tuple[str, str]],
) -> Denied | None:
    """``add_project_members``: managers and admins add members (only global admins add project admins...
    as dstack words it; a project admin may add admins, a manager may not); anyone may join a public project
    they are not in, alone and as ``user``."""
    dup = _duplicates([name for name, _ in new])
    if dup is not None:
        return dup
    self_join = len(new) == 1 and is_public and new[0][0] in (caller_name, caller_email) and caller_role is None
    if self_join:
        if new[0][1] != "user":
            return Denied(403, "Access denied: can only join public projects as user role")
        return None
    if global_role != "admin" and caller_role not in ("admin", "manager"):
        return Denied(403, "Access denied: insufficient permissions to add members")
    if global_role != "admin" and caller_role == "manager" and any(role == "admin" for _, role in new):
        return Denied(403, "Access denied: only global admins can add project admins")
    return None


def check_remove_members(
    global_role: str,
    caller_name: str,
    caller_email: str | None,
    caller_role: str | None,
    removing: Sequence[tuple[str, str | None]],
    admins_total: int,
) -> Denied | None:
    """``remove_project_members``: ``removing`` is ``(username as asked, role in the project or None when not a
    member; "?" when no such user)``. Any member may leave (but not the last admin); managers and admins
    remove others; only global admins remove project admins; the last admins are never all removed."""
    self_leave = len(removing) == 1 and removing[0][0] in (caller_name, caller_email) and caller_role is not None
    if not self_leave and global_role != "admin" and caller_role not in ("admin", "manager"):
        return Denied(403, "Access denied: insufficient permissions to remove members")
    admin_removals = 0
    for name, role in removing:
        if role == "?":
            return Denied(400, f"User not found: {name}")
        if role is None:
            return Denied(400, f"User is not a member of this project: {name}")
        if role == "admin":
            if self_leave:
                if admins_total <= 1:
                    return Denied(400, "Cannot leave project: you are the last admin")
            elif global_role != "admin":
                return Denied(403, f"Access denied: only global admins can remove project admins (user: {name})")
            admin_removals += 1
    if not self_leave and admin_removals >= admins_total:
        return Denied(400, "Cannot remove all project admins")
    return None


def backend_types(backends: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The backend types a project's stored backends name (``[{"type": "local"}, ...]``)."""
    return frozenset(str(b.get("type")) for b in backends if isinstance(b, Mapping) and b.get("type"))


def usable_computes(compute_names: Iterable[str], project_backends: frozenset[str]) -> list[str]:
    """The computes whose offers a project's (non-SSH) fleets and runs may use: those its backends name.
    An SSH fleet brings its own hosts and needs none."""
    return [name for name in compute_names if name in project_backends]


def check_export_importers(
    global_role: str, asked: Sequence[str], caller_roles: Mapping[str, str | None]
) -> Denied | None:
    """dstack's ``add_importer_projects``: a project becomes an importer of an export only if the caller is a
    global admin or an admin of that project (as of the exporting project, whose admin the route requires).
    ``caller_roles``: each existing project asked for (lower-cased name) -> the caller's role in it (None:
    not a member). A project missing there does not exist."""
    names = [n.lower() for n in asked]
    if len(names) != len(set(names)):
        return Denied(400, "Some importer projects are listed for addition more than once")
    allowed = {n for n in names if n in caller_roles and (global_role == "admin" or caller_roles[n] == "admin")}
    missing = [n for n in names if n not in allowed]
    if missing:
        return Denied(
            400,
            f"Projects {_set_repr(missing)} not found or you are not allowed to add them as importers."
            " Only project admins can add a project as importer",
        )
    return None


def check_export_global(global_role: str) -> Denied | None:
    """dstack's ``set_as_global``: only global admins make an export global (imported by every project)."""
    if global_role != "admin":
        return Denied(403, "Only global admins can make the export global")
    return None


def _set_repr(names: Sequence[str]) -> str:
    """A set of names as dstack's messages print one (Python's ``{'a', 'b'}``), in a stable order."""
    return "{" + ", ".join(repr(n) for n in sorted(set(names))) + "}"
