"""Exports and imports of fleets across projects."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store import direct
from corral.store.errors import Conflict
from corral.store.tables import export_importers, exported_fleets, exports, fleets, projects


@dataclass(frozen=True)
class ExportRec:
    id: str
    project_id: str
    project_name: str
    name: str
    is_global: bool
    importers: tuple[tuple[str, str, str], ...]  # (import id, project id, project name)
    fleets: tuple[tuple[str, str], ...]  # (fleet id, fleet name)


async def _load(conn: AsyncConnection, rows: Sequence[Any]) -> list[ExportRec]:
    ids = [r.id for r in rows]
    if not ids:
        return []
    imp: dict[str, list[tuple[str, str, str]]] = {i: [] for i in ids}
    q = (
        sa.select(export_importers.c.export_id, export_importers.c.id, projects.c.id.label("pid"), projects.c.name)
        .join(projects, projects.c.id == export_importers.c.project_id)
        .where(export_importers.c.export_id.in_(ids), projects.c.deleted == sa.false())
        .order_by(projects.c.name)
    )
    for r in await conn.execute(q):
        imp[r.export_id].append((r.id, r.pid, r.name))
    fl: dict[str, list[tuple[str, str]]] = {i: [] for i in ids}
    q2 = (
        sa.select(exported_fleets.c.export_id, fleets.c.id, fleets.c.name)
        .join(fleets, fleets.c.id == exported_fleets.c.fleet_id)
        .where(exported_fleets.c.export_id.in_(ids), fleets.c.deleted == sa.false())
        .order_by(fleets.c.name)
    )
    for f in await conn.execute(q2):
        fl[f.export_id].append((f.id, f.name))
    return [
        ExportRec(r.id, r.project_id, r.project_name, r.name, r.is_global, tuple(imp[r.id]), tuple(fl[r.id]))
        for r in rows
    ]


def _select() -> sa.Select[Any]:
    return sa.select(exports, projects.c.name.label("project_name")).join(
        projects, projects.c.id == exports.c.project_id
    )


async def list_exports(conn: AsyncConnection, project_id: str) -> list[ExportRec]:
    rows = (await conn.execute(_select().where(exports.c.project_id == project_id).order_by(exports.c.name))).all()
    return await _load(conn, rows)


async def get_export(conn: AsyncConnection, project_id: str, name: str) -> ExportRec | None:
    rows = (await conn.execute(_select().where(exports.c.project_id == project_id, exports.c.name == name))).all()
    found = await _load(conn, rows)
    return found[0] if found else None


async def exports_imported_by(conn: AsyncConnection, project_id: str) -> list[ExportRec]:
    """Exports of other projects that ``project_id`` imports (explicitly, or because they are global)."""
    explicit = sa.select(export_importers.c.export_id).where(export_importers.c.project_id == project_id)
    q = _select().where(
        exports.c.project_id != project_id,
        projects.c.deleted == sa.false(),
        sa.or_(exports.c.id.in_(explicit), exports.c.is_global.is_(True)),
    )
    return await _load(conn, (await conn.execute(q.order_by(exports.c.name))).all())


def fleets_imported_by(project_ids: Sequence[str]) -> sa.Select[Any]:
    """The ids of the fleets exported to any of ``project_ids`` (explicitly, or by a global export: to every
    project), as a subquery: what the global lists add with ``include_imported``. A caller with no project imports
    nothing (the lists do not ask then)."""
    explicit = sa.select(export_importers.c.export_id).where(export_importers.c.project_id.in_(list(project_ids)))
    return (
        sa.select(exported_fleets.c.fleet_id)
        .join(exports, exports.c.id == exported_fleets.c.export_id)
        .join(projects, projects.c.id == exports.c.project_id)
        .where(
            projects.c.deleted == sa.false(),
            sa.or_(exports.c.id.in_(explicit), exports.c.is_global.is_(True)),
        )
    )


async def insert_export(conn: AsyncConnection, values: dict[str, Any]) -> None:
    """A new export; :class:`~corral.store.errors.Conflict` if the project has one of that name already."""
    try:
        await conn.execute(sa.insert(exports).values(**values))
    except sa.exc.IntegrityError as e:
        raise Conflict(str(e.orig)) from e


async def update_export(conn: AsyncConnection, export_id: str, values: dict[str, Any]) -> None:
    await conn.execute(sa.update(exports).where(exports.c.id == export_id).values(**values))


async def add_importer(conn: AsyncConnection, import_id: str, export_id: str, project_id: str) -> None:
    exists = (
        await conn.execute(
            sa.select(export_importers.c.id).where(
                export_importers.c.export_id == export_id, export_importers.c.project_id == project_id
            )
        )
    ).first()
    if exists is None:
        await conn.execute(sa.insert(export_importers).values(id=import_id, export_id=export_id, project_id=project_id))


async def remove_importer(conn: AsyncConnection, export_id: str, project_id: str) -> None:
    await conn.execute(
        sa.delete(export_importers).where(
            export_importers.c.export_id == export_id, export_importers.c.project_id == project_id
        )
    )


async def add_fleet(conn: AsyncConnection, export_id: str, fleet_id: str) -> None:
    q = sa.select(exported_fleets.c.fleet_id).where(
        exported_fleets.c.export_id == export_id, exported_fleets.c.fleet_id == fleet_id
    )
    if (await conn.execute(q)).first() is None:
        await conn.execute(sa.insert(exported_fleets).values(export_id=export_id, fleet_id=fleet_id))


async def remove_fleet(conn: AsyncConnection, export_id: str, fleet_id: str) -> None:
    await conn.execute(
        sa.delete(exported_fleets).where(
            exported_fleets.c.export_id == export_id, exported_fleets.c.fleet_id == fleet_id
        )
    )


async def delete_export(conn: AsyncConnection, export_id: str) -> None:
    await conn.execute(sa.delete(exported_fleets).where(exported_fleets.c.export_id == export_id))
    await conn.execute(sa.delete(export_importers).where(export_importers.c.export_id == export_id))
    await conn.execute(sa.delete(exports).where(exports.c.id == export_id))


#: Every exported fleet with its export (built once: ``store/prebuilt.py`` says why).
_EXPORTED = sa.select(exported_fleets.c.fleet_id, exports.c.id, exports.c.is_global, exports.c.project_id).join(
    exports, exports.c.id == exported_fleets.c.export_id
)


async def fleet_importers(
    conn: AsyncConnection, owners: Collection[str] | None = None, importer: str | None = None
) -> dict[str, frozenset[str]]:
    """fleet id -> ids of the projects it is exported to (every other project for a global export).

    ``owners`` narrows it to fleets of those projects, ``importer`` to whether that one project imports them
    (a plan needs no more): neither then costs a query over every project or export on the server."""
    if owners is None:
        rows = (await direct.execute(conn, _EXPORTED)).all()
    else:
        rows = (await conn.execute(_EXPORTED.where(exports.c.project_id.in_(list(owners))))).all()
    if not rows:
        return {}
    importers: dict[str, set[str]] = {}
    iq = sa.select(export_importers.c.export_id, export_importers.c.project_id)
    if importer is not None:
        iq = iq.where(export_importers.c.project_id == importer)
    for imp in (await conn.execute(iq)).all():
        importers.setdefault(imp.export_id, set()).add(imp.project_id)
    everyone: set[str] | None = None
    out: dict[str, set[str]] = {}
    for row in rows:
        if row.is_global:
            if everyone is None:
                q = sa.select(projects.c.id).where(projects.c.deleted == sa.false())
                if importer is not None:
                    q = q.where(projects.c.id == importer)
                everyone = {p.id for p in await conn.execute(q)}
            out.setdefault(row.fleet_id, set()).update(everyone - {row.project_id})
        else:
            out.setdefault(row.fleet_id, set()).update(importers.get(row.id, set()))
    return {k: frozenset(v) for k, v in out.items()}
