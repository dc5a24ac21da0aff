"""What a project holds and shows, beyond its members: its backends as the scheduler sees them, its active
runs and fleets (a project that has any is not deleted), the member projects with no active fleet (owned or
imported), and its visibility."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.access import backend_types
from corral.scheduler.offer_filters import project_regions
from corral.store import direct
from corral.store.tables import (
    ACTIVE_RUN_WHERE,
    export_importers,
    exported_fleets,
    fleets,
    instances,
    members,
    projects,
    runs,
)

#: Every live project's stored backends (built once: ``store/prebuilt.py`` says why), and those of ``:ids``.
_BACKENDS = sa.select(projects.c.id, projects.c.backends).where(projects.c.deleted == sa.false())
_BACKENDS_OF = _BACKENDS.where(projects.c.id.in_(sa.bindparam("ids", expanding=True)))


async def _stored_backends(conn: AsyncConnection, project_ids: Collection[str] | None) -> dict[str, Any]:
    if project_ids is None:
        rows = await direct.execute(conn, _BACKENDS)
    else:
        rows = await conn.execute(_BACKENDS_OF, {"ids": list(project_ids)})
    return {r.id: json.loads(r.backends or "[]") for r in rows}


async def backends_by_project(
    conn: AsyncConnection, project_ids: Collection[str] | None = None
) -> dict[str, frozenset[str]]:
    """Project id -> the backend types its stored backends name (every live project, or ``project_ids``)."""
    return {k: backend_types(v) for k, v in (await _stored_backends(conn, project_ids)).items()}


async def backend_regions_by_project(
    conn: AsyncConnection, project_ids: Collection[str] | None = None
) -> dict[str, dict[str, frozenset[str]]]:
    """Project id -> backend type -> the regions its stored backend names (types without ``regions``: absent)."""
    return {k: project_regions(v) for k, v in (await _stored_backends(conn, project_ids)).items()}


async def backends_and_regions(
    conn: AsyncConnection, project_ids: Collection[str] | None = None
) -> tuple[dict[str, frozenset[str]], dict[str, dict[str, frozenset[str]]]]:
    """:func:`backends_by_project` and :func:`backend_regions_by_project` from one read."""
    stored = await _stored_backends(conn, project_ids)
    return {k: backend_types(v) for k, v in stored.items()}, {k: project_regions(v) for k, v in stored.items()}


async def active_resources(conn: AsyncConnection, project_id: str) -> tuple[list[str], list[str]]:
    """(names of the project's runs that have not finished, names of its fleets not deleted)."""
    run_names = (
        await conn.execute(
            sa.select(runs.c.run_name).where(
                runs.c.project_id == project_id, runs.c.deleted == sa.false(), sa.text(ACTIVE_RUN_WHERE)
            )
        )
    ).scalars()
    fleet_names = (
        await conn.execute(
            sa.select(fleets.c.name).where(fleets.c.project_id == project_id, fleets.c.deleted == sa.false())
        )
    ).scalars()
    return list(run_names), list(fleet_names)


async def member_projects_without_fleets(conn: AsyncConnection, user_id: str) -> list[str]:
    """Ids of the live projects ``user_id`` is a member of that have no fleet not deleted, neither their own
    nor imported; oldest first (dstack's ``list_projects_with_no_active_fleets``)."""
    own = sa.select(fleets.c.id).where(fleets.c.project_id == projects.c.id, fleets.c.deleted == sa.false())
    imported = (
        sa.select(fleets.c.id)
        .join(exported_fleets, exported_fleets.c.fleet_id == fleets.c.id)
        .join(export_importers, export_importers.c.export_id == exported_fleets.c.export_id)
        .where(export_importers.c.project_id == projects.c.id, fleets.c.deleted == sa.false())
    )
    q = (
        sa.select(projects.c.id)
        .join(members, sa.and_(members.c.project_id == projects.c.id, members.c.user_id == user_id))
        .where(projects.c.deleted == sa.false(), ~sa.exists(own), ~sa.exists(imported))
        .order_by(projects.c.created_at, projects.c.id)
    )
    return list((await conn.execute(q)).scalars())


async def set_public(conn: AsyncConnection, project_id: str, is_public: bool) -> None:
    await conn.execute(sa.update(projects).where(projects.c.id == project_id).values(is_public=is_public))


async def member_project_ids(conn: AsyncConnection, user_id: str, names: Sequence[str] | None = None) -> list[str]:
    """Ids of the live projects ``user_id`` is a member of (optionally only those named)."""
    q = (
        sa.select(projects.c.id)
        .join(members, sa.and_(members.c.project_id == projects.c.id, members.c.user_id == user_id))
        .where(projects.c.deleted == sa.false())
    )
    if names is not None:
        q = q.where(projects.c.name.in_(list(names)))
    return list((await conn.execute(q)).scalars())


async def all_project_ids(conn: AsyncConnection, names: Sequence[str] | None = None) -> list[str]:
    q = sa.select(projects.c.id).where(projects.c.deleted == sa.false())
    if names is not None:
        q = q.where(projects.c.name.in_(list(names)))
    return list((await conn.execute(q)).scalars())


async def owned_project_count(conn: AsyncConnection, user_id: str) -> int:
    q = (
        sa.select(sa.func.count())
        .select_from(projects)
        .where(projects.c.owner_id == user_id, projects.c.deleted == sa.false())
    )
    return int((await conn.execute(q)).scalar_one())


async def names_naming_backend(conn: AsyncConnection, backend: str) -> list[str]:
    """The names of the live projects whose stored backends name ``backend`` (a text match on the stored JSON:
    a project it lists may still not configure that backend)."""
    q = sa.select(projects.c.name).where(projects.c.deleted == sa.false(), projects.c.backends.like(f'%"{backend}"%'))
    return list((await conn.execute(q)).scalars())


async def live_instances_on(conn: AsyncConnection, project_id: str, backend: str) -> int:
    """How many of the project's instances on ``backend`` are not terminated."""
    q = sa.select(sa.func.count()).where(
        instances.c.project_id == project_id, instances.c.backend == backend, instances.c.status != "terminated"
    )
    return int((await conn.execute(q)).scalar_one())
