"""Exports and imports (dstack's cross-project sharing of fleets)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import sqlalchemy.exc

from corral.domain.records import ProjectRec, UserRec
from corral.services.errors import ResourceExists, ResourceNotExists, ServiceError
from corral.store import accounts as account_store
from corral.store import exports as store
from corral.store import fleets as fleet_store
from corral.store import project_state
from corral.store.exports import ExportRec
from corral.workers.context import Context


def export_json(e: ExportRec) -> dict[str, Any]:
    return {
        "id": e.id,
        "name": e.name,
        "is_global": e.is_global,
        "imports": [{"id": i, "project_name": name} for i, _pid, name in e.importers],
        "exported_fleets": [{"id": fid, "name": name} for fid, name in e.fleets],
        "exported_gateways": [],
    }


async def _project_ids(conn: Any, names: list[str], own: ProjectRec) -> list[str]:
    ids = []
    for name in names:
        if name == own.name:
            raise ServiceError(f"Project {name} cannot import its own export")
        project = await account_store.get_project(conn, name)
        if project is None:
            raise ResourceNotExists(f"Project {name} not found")
        ids.append(project.id)
    return ids


async def _fleet_ids(conn: Any, project: ProjectRec, names: list[str]) -> list[str]:
    ids = []
    for name in names:
        fleet = await fleet_store.get_fleet(conn, project.id, name=name)
        if fleet is None:
            raise ResourceNotExists(f"Fleet {name} not found in project {project.name}")
        ids.append(fleet.id)
    return ids


async def create(ctx: Context, project: ProjectRec, body: dict[str, Any]) -> dict[str, Any]:
    if body.get("exported_gateways"):
        raise ServiceError("Exporting gateways is not supported yet: corral has no gateways")
    name = body["name"]
    async with ctx.db.write() as conn:
        if await store.get_export(conn, project.id, name) is not None:
            raise ResourceExists(f"Export {name} already exists")
        export_id = str(uuid.uuid4())
        importers = await _project_ids(conn, list(body.get("importer_projects") or []), project)
        fleet_ids = await _fleet_ids(conn, project, list(body.get("exported_fleets") or []))
        try:
            await store.insert_export(
                conn,
                {
                    "id": export_id,
                    "project_id": project.id,
                    "name": name,
                    "is_global": bool(body.get("is_global")),
                    "created_at": time.time(),
                },
            )
        except sqlalchemy.exc.IntegrityError:
            raise ResourceExists(f"Export {name} already exists") from None
        for pid in importers:
            await store.add_importer(conn, str(uuid.uuid4()), export_id, pid)
        for fid in fleet_ids:
            await store.add_fleet(conn, export_id, fid)
        found = await store.get_export(conn, project.id, name)
    ctx.wakeups.wake("scheduler")
    assert found is not None
    return export_json(found)


async def update(ctx: Context, project: ProjectRec, body: dict[str, Any]) -> dict[str, Any]:
    if body.get("add_exported_gateways"):
        raise ServiceError("Exporting gateways is not supported yet: corral has no gateways")
    if body.get("set_global") and body.get("unset_global"):
        raise ServiceError("`set_global` and `unset_global` cannot both be set")
    async with ctx.db.write() as conn:
        found = await store.get_export(conn, project.id, body["name"])
        if found is None:
            raise ResourceNotExists(f"Export {body['name']} not found")
        if body.get("set_global") or body.get("unset_global"):
            await store.update_export(conn, found.id, {"is_global": bool(body.get("set_global"))})
        for pid in await _project_ids(conn, list(body.get("add_importer_projects") or []), project):
            await store.add_importer(conn, str(uuid.uuid4()), found.id, pid)
        for pid in await _project_ids(conn, list(body.get("remove_importer_projects") or []), project):
            await store.remove_importer(conn, found.id, pid)
        for fid in await _fleet_ids(conn, project, list(body.get("add_exported_fleets") or [])):
            await store.add_fleet(conn, found.id, fid)
        for fid in await _fleet_ids(conn, project, list(body.get("remove_exported_fleets") or [])):
            await store.remove_fleet(conn, found.id, fid)
        updated = await store.get_export(conn, project.id, body["name"])
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
