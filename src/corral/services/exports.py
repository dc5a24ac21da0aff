"""Exports and imports (dstack's cross-project sharing of fleets).

As in dstack 0.22.5: only an admin of the exporting project (or a global admin) creates, changes or deletes
its exports (the routes' rule); a project becomes an importer only when the caller is also an admin of that
project (or a global admin); only global admins make an export global. A fleet exported to a project is one
its members may run on; no other project's members may.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from corral.context import Context
from corral.domain import access
from corral.domain.records import ProjectRec, UserRec
from corral.services import input_rules
from corral.services.errors import AccessDenied, ResourceExists, ResourceNotExists, ServiceError
from corral.store import accounts as account_store
from corral.store import exports as store
from corral.store import fleets as fleet_store
from corral.store import project_state
from corral.store.errors import Conflict
from corral.store.exports import ExportRec

if TYPE_CHECKING:
    from corral.schemas.exports import CreateExportBody, UpdateExportBody


def export_json(e: ExportRec) -> dict[str, Any]:
    return {
        "id": e.id,
        "name": e.name,
        "is_global": e.is_global,
        "imports": [{"id": i, "project_name": name} for i, _pid, name in e.importers],
        "exported_fleets": [{"id": fid, "name": name} for fid, name in e.fleets],
        "exported_gateways": [],
    }


async def _importer_ids(
    conn: Any, user: UserRec, own: ProjectRec, names: list[str], already: frozenset[str] = frozenset()
) -> list[str]:
    """The ids of the projects ``names`` that ``user`` may add as importers (dstack's
    ``add_importer_projects``: a global admin, or an admin of each of them), else the error dstack gives."""
    lowered = [n.lower() for n in names]
    if again := sorted(set(lowered) & already):
        raise ServiceError(f"Projects {_names(again)} are already importing this export")
    if own.name.lower() in lowered:
        raise ServiceError(f"Project {own.name!r} cannot import from itself")
    found: dict[str, ProjectRec] = {}
    roles: dict[str, str | None] = {}
    for name in lowered:
        project = await account_store.get_project(conn, name)
        if project is not None:
            found[name] = project
            roles[name] = await account_store.get_member_role(conn, project.id, user.id)
    denied = access.check_export_importers(user.global_role, names, roles)
    if denied is not None:
        raise (AccessDenied(denied.msg) if denied.status == 403 else ServiceError(denied.msg))
    return [found[n].id for n in lowered]


async def _importing_ids(conn: Any, found: ExportRec, names: list[str]) -> list[str]:
    """The ids of the projects ``names`` that import ``found`` now (dstack's ``remove_importer_projects``)."""
    if found.is_global:
        raise ServiceError("Cannot remove importers from a global export")
    lowered = [n.lower() for n in names]
    if len(lowered) != len(set(lowered)):
        raise ServiceError("Some importer projects are listed for removal more than once")
    importing = {name.lower(): pid for _i, pid, name in found.importers}
    if missing := sorted(set(lowered) - set(importing)):
        raise ServiceError(f"Projects {_names(missing)} are not importing export {found.name!r}")
    return [importing[n] for n in lowered]


def _names(names: list[str]) -> str:
    return "{" + ", ".join(repr(n) for n in names) + "}"


def _check_global(user: UserRec) -> None:
    denied = access.check_export_global(user.global_role)
    if denied is not None:
        raise AccessDenied(denied.msg)


async def _fleet_ids(conn: Any, project: ProjectRec, names: list[str]) -> list[str]:
    ids = []
    for name in names:
        fleet = await fleet_store.get_fleet(conn, project.id, name=name)
        if fleet is None:
            raise ResourceNotExists(f"Fleet {name} not found in project {project.name}")
        ids.append(fleet.id)
    return ids


async def create(ctx: Context, project: ProjectRec, user: UserRec, body: CreateExportBody) -> dict[str, Any]:
    """A new export of ``project``'s fleets (the route admits only its admins and global admins)."""
    if body.exported_gateways:
        raise ServiceError("Exporting gateways is not supported yet: a gateway publishes its own project's services")
    name = body.name
    input_rules.check_resource_name(name)
    if body.is_global:
        if body.importer_projects:
            raise ServiceError(
                "Do not specify any importer projects when creating a global export."
                " Global exports are automatically imported in all projects"
            )
        _check_global(user)
    async with ctx.db.write() as conn:
        if await store.get_export(conn, project.id, name) is not None:
            raise ResourceExists(f"Export {name} already exists")
        export_id = str(uuid.uuid4())
        importers = await _importer_ids(conn, user, project, list(body.importer_projects))
        fleet_ids = await _fleet_ids(conn, project, list(body.exported_fleets))
        try:
            await store.insert_export(
                conn,
                {
                    "id": export_id,
                    "project_id": project.id,
                    "name": name,
                    "is_global": body.is_global,
                    "created_at": time.time(),
                },
            )
        except Conflict:
            raise ResourceExists(f"Export {name} already exists") from None
        for pid in importers:
            await store.add_importer(conn, str(uuid.uuid4()), export_id, pid)
        for fid in fleet_ids:
            await store.add_fleet(conn, export_id, fid)
        found = await store.get_export(conn, project.id, name)
    ctx.wakeups.wake("scheduler")
    assert found is not None
    return export_json(found)


async def update(ctx: Context, project: ProjectRec, user: UserRec, body: UpdateExportBody) -> dict[str, Any]:  # noqa: C901
    """Changes to an export of ``project`` (the route admits only its admins and global admins), checked as
    dstack's ``update_export`` checks them."""
    if body.add_exported_gateways:
        raise ServiceError("Exporting gateways is not supported yet: a gateway publishes its own project's services")
    changes = (
        body.set_global,
        body.unset_global,
        body.add_importer_projects,
        body.remove_importer_projects,
        body.add_exported_fleets,
        body.remove_exported_fleets,
        body.add_exported_gateways,
        body.remove_exported_gateways,
    )
    adding = list(body.add_importer_projects)
    removing = list(body.remove_importer_projects)
    async with ctx.db.write() as conn:
        found = await store.get_export(conn, project.id, body.name)
        if found is None:
            raise ResourceNotExists(f"Export {body.name!r} not found in project {project.name!r}")
        if not any(changes):
            raise ServiceError("No changes specified")
        if body.set_global and body.unset_global:
            raise ServiceError("Cannot set and unset global at the same time")
        if (body.set_global or body.unset_global) and (adding or removing):
            raise ServiceError("Cannot change global status and add/remove importers at the same time")
        if both := sorted({n.lower() for n in adding} & {n.lower() for n in removing}):
            raise ServiceError(
                f"Projects {_names(both)} are listed for both addition and removal."
                " Cannot add and remove at the same time"
            )
        already = frozenset(name.lower() for _i, _pid, name in found.importers)
        add_ids = await _importer_ids(conn, user, project, adding, already)
        remove_ids = await _importing_ids(conn, found, removing) if removing else []
        if body.set_global:
            if found.is_global:
                raise ServiceError("The export is already global")
            _check_global(user)
            await store.update_export(conn, found.id, {"is_global": True})
        if body.unset_global:
            if not found.is_global:
                raise ServiceError("The export is already not global")
            await store.update_export(conn, found.id, {"is_global": False})
        for pid in add_ids:
            await store.add_importer(conn, str(uuid.uuid4()), found.id, pid)
        for pid in remove_ids:
            await store.remove_importer(conn, found.id, pid)
        for fid in await _fleet_ids(conn, project, list(body.add_exported_fleets)):
            await store.add_fleet(conn, found.id, fid)
        for fid in await _fleet_ids(conn, project, list(body.remove_exported_fleets)):
            await store.remove_fleet(conn, found.id, fid)
        updated = await store.get_export(conn, project.id, body.name)
    ctx.wakeups.wake("scheduler")
    assert updated is not None
    return export_json(updated)


async def delete(ctx: Context, project: ProjectRec, name: str) -> None:
    async with ctx.db.write() as conn:
        found = await store.get_export(conn, project.id, name)
        if found is None:
            raise ResourceNotExists(f"Export {name} not found")
        await store.delete_export(conn, found.id)
    ctx.wakeups.wake("scheduler")


async def list_exports(ctx: Context, project: ProjectRec) -> list[dict[str, Any]]:
    async with ctx.db.read() as conn:
        return [export_json(e) for e in await store.list_exports(conn, project.id)]


async def list_imports(ctx: Context, project: ProjectRec) -> list[dict[str, Any]]:
    async with ctx.db.read() as conn:
        found = await store.exports_imported_by(conn, project.id)
    out = []
    for e in found:
        import_id = next((i for i, pid, _n in e.importers if pid == project.id), e.id)
        out.append(
            {
                "id": import_id,
                "export": {
                    "id": e.id,
                    "name": e.name,
                    "project_name": e.project_name,
                    "exported_fleets": [{"id": fid, "name": n} for fid, n in e.fleets],
                    "exported_gateways": [],
                },
            }
        )
    return out


async def delete_import(ctx: Context, project: ProjectRec, export_name: str, export_project_name: str) -> None:
    async with ctx.db.write() as conn:
        owner = await account_store.get_project(conn, export_project_name)
        if owner is None:
            raise ResourceNotExists(f"Project {export_project_name} not found")
        found = await store.get_export(conn, owner.id, export_name)
        if found is None or not any(pid == project.id for _i, pid, _n in found.importers):
            raise ResourceNotExists(f"Import of {export_project_name}/{export_name} not found")
        await store.remove_importer(conn, found.id, project.id)
    ctx.wakeups.wake("scheduler")


async def imported_fleet_ids(ctx: Context, project: ProjectRec) -> list[tuple[str, str]]:
    """(project id, fleet id) of every fleet exported to ``project``."""
    async with ctx.db.read() as conn:
        return [(e.project_id, fid) for e in await store.exports_imported_by(conn, project.id) for fid, _n in e.fleets]


async def imported_by_member_project(ctx: Context, user: UserRec, project: ProjectRec, fleet_id: str | None) -> bool:
    """Whether fleet ``fleet_id`` of ``project`` is exported to a project ``user`` is a member of (dstack's
    ``check_can_access_fleet`` for a caller who is not a member of the fleet's own project)."""
    if fleet_id is None:
        return False
    async with ctx.db.read() as conn:
        importers = (await store.fleet_importers(conn)).get(fleet_id, frozenset())
        if not importers:
            return False
        mine = await project_state.member_project_ids(conn, user.id)
    return bool(importers & set(mine))
