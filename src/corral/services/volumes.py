"""Network volumes, as dstack 0.22.5's ``volumes/create|list|get|delete`` have them: project members
create, list, get and delete (``ProjectMember``); the global list shows the caller's projects' volumes.

A created volume is ``submitted``; the volumes worker (:mod:`corral.workers.volumes`) makes it in the
cloud (or finds the one ``volume_id`` names) and turns it ``active`` or ``failed``. A deletion marks it
(``to_be_deleted``) and the worker deletes it in the cloud (never an external one); a volume attached to
an instance is refused, naming it. Volumes exist on the ``aws`` backend (EBS): another backend is refused
as dstack refuses a backend without volume support.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import ValidationError

from corral import config  # lazy: the models load on first use, not at start-up
from corral.context import Context
from corral.domain.records import ProjectRec, UserRec
from corral.domain.volumes import ACTIVE, VolumeRec, mount_points, placements, refuse_delete
from corral.services import apply_policies, input_rules, serialize
from corral.services.errors import ResourceExists, ResourceNotExists, ServiceError, validation_errors
from corral.services.fleets import random_name
from corral.store import project_state
from corral.store import volumes as store
from corral.store.errors import Conflict

#: The field of dstack's ``Volume`` (and of ``volumes/create``'s body) that holds the configuration.
CONFIGURATION = "configuration"
#: The backends corral makes volumes on.
VOLUME_BACKENDS = ("aws",)
_MONTH = 30 * 24 * 3600.0  # clouds charge volumes by 30-day months


def wire(v: VolumeRec, now: float | None = None) -> dict[str, Any]:
    """dstack's ``Volume``."""
    pd = v.provisioning
    end = v.deleted_at or (v.last_processed_at if v.status == "failed" else (now or time.time()))
    cost = (end - v.created_at) * float(pd["price"]) / _MONTH if pd and pd.get("price") else 0.0
    attachments = []
    if v.instance_id is not None:
        a = v.attachment or {}
        attachments.append(
            {
                "instance": {"name": a.get("instance_name") or "", "fleet_name": a.get("fleet_name"),
                             "instance_num": int(a.get("instance_num") or 0), "instance_id": a.get("ec2_id")},
                "attachment_data": {"device_name": a.get("device_name")},
            }
        )  # fmt: skip
    return {
        "id": v.id,
        "name": v.name,
        "user": v.user_name,
        "project_name": v.project_name,
        CONFIGURATION: v.configuration,
        "external": v.external,
        "created_at": serialize.iso(v.created_at),
        "last_processed_at": serialize.iso(v.last_processed_at),
        "status": v.status,
        "status_message": v.status_message,
        "deleted": v.deleted,
        "deleted_at": serialize.iso(v.deleted_at),
        "volume_id": v.volume_id,
        "provisioning_data": pd,
        "cost": cost,
        "attachments": attachments,
        "attachment_data": None,
    }


def parse_configuration(raw: Any, loc: tuple[str, ...] = (CONFIGURATION,)) -> dict[str, Any]:
    """The configuration as stored (dstack's document, defaults filled in); a 422 naming the field, or
    dstack's 400s (neither ``size`` nor ``volume_id``; a backend without volumes; a bad name)."""
    try:
        conf = config.parse_volume_configuration(raw if isinstance(raw, dict) else {})
    except ValidationError as e:
        raise validation_errors(e, loc) from None
    backend = str(getattr(conf.backend, "value", conf.backend))
    if backend not in VOLUME_BACKENDS:
        raise ServiceError(
            f"Volumes are not supported for {backend} backend. "
            f"Available backends with volumes support: {list(VOLUME_BACKENDS)}."
        )
    if getattr(conf, "size", None) is None and conf.external_volume_id is None:
        raise ServiceError("Volume must specify either existing identifier or size")
    if conf.name is not None:
        input_rules.check_resource_name(conf.name)
    acd = conf.auto_cleanup_duration
    if conf.external_volume_id is not None and acd is not None and str(acd) not in ("off", "-1"):
        raise ServiceError(
            "External volumes do not support auto_cleanup_duration. "
            "Auto-cleanup only works for volumes created and managed by dstack."
        )
    if acd is not None and str(acd) not in ("off", "-1"):
        raise ServiceError(
            "`auto_cleanup_duration` (deleting a volume some time after its last use) is not supported yet: "
            "remove it or set it to `off`, and delete the volume when done (`dstack volume delete`)"
        )
    out: dict[str, Any] = json.loads(conf.model_dump_json())
    return out


async def create(ctx: Context, project: ProjectRec, user: UserRec, raw: Any) -> dict[str, Any]:
    conf = await with_policies(ctx, project, user, parse_configuration(raw))
    backend = str(conf["backend"])
    async with ctx.db.read() as conn:
        have = (await project_state.backends_by_project(conn, [project.id])).get(project.id, frozenset())
    if backend not in have or backend not in ctx.computes:
        raise ServiceError(
            f"Backend {backend} not available: add a `type: {backend}` backend to project {project.name}"
        )
    for _ in range(5):
        async with ctx.db.write() as conn:
            name = conf.get("name")
            if name is None:
                taken = await store.names_in_use(conn, project.id)
                name = next(n for n in iter(random_name, None) if n not in taken)
            elif await store.by_names(conn, project.id, [name]):
                raise ResourceExists("Resource exists")
            try:
                vid = await store.create(conn, project.id, user.id, name, {**conf, "name": name}, time.time())
            except Conflict:  # made meanwhile by another request
                if conf.get("name") is not None:
                    raise ResourceExists("Resource exists") from None
                continue
            made = await store.get(conn, vid)
        ctx.wakeups.wake("volumes")
        assert made is not None
        return wire(made)
    raise ServiceError("could not pick a free volume name; name the volume")


async def with_policies(ctx: Context, project: ProjectRec, user: UserRec, conf: dict[str, Any]) -> dict[str, Any]:
    """The configuration as the server's policies answer it: dstack asks them with a ``VolumeSpec`` made of the
    configuration (``volumes.create_volume`` in dstack 0.22.5) and applies the configuration that comes back."""
    spec = {CONFIGURATION: conf, "configuration_path": None}
    answered = await apply_policies.ask(ctx, "volume", project, user.name, spec)
    if answered is None:
        return conf
    loc = (*apply_policies.ANSWER, CONFIGURATION)
    return apply_policies.reparsed(ctx, "volume", lambda: parse_configuration(answered.get(CONFIGURATION), loc))


async def list_volumes(
    ctx: Context, project_ids: list[str] | None, only_active: bool = False, ascending: bool = False, limit: int = 0
) -> list[dict[str, Any]]:
    async with ctx.db.read() as conn:
        found = await store.list_volumes(conn, project_ids, only_active=only_active, ascending=ascending, limit=limit)
    now = time.time()
    return [wire(v, now) for v in found]


async def get(ctx: Context, project: ProjectRec, name: str) -> dict[str, Any]:
    async with ctx.db.read() as conn:
        found = await store.by_names(conn, project.id, [name])
    if not found:
        raise ResourceNotExists("Volume not found")
    return wire(found[0])


async def delete(ctx: Context, project: ProjectRec, names: list[str]) -> None:
    async with ctx.db.write() as conn:
        found = await store.by_names(conn, project.id, names)
        refused = refuse_delete(found)
        if refused is not None:
            raise ServiceError(refused)
        await store.mark_to_be_deleted(conn, [v.id for v in found])
    if found:
        ctx.wakeups.wake("volumes")


async def for_run(ctx: Context, project_id: str, names: list[str]) -> list[VolumeRec]:
    """The volumes a run mounts, by name: each must exist, be active and not be marked for deletion (a
    400 naming the one that is not)."""
    async with ctx.db.read() as conn:
        found = {v.name: v for v in await store.by_names(conn, project_id, names)}
    for n in names:
        v = found.get(n)
        if v is None or v.to_be_deleted:
            raise ServiceError(f"Volume {n} not found: create it first (`type: volume`), or fix `volumes`")
        if v.status != ACTIVE:
            raise ServiceError(f"Volume {n} is {v.status}, not active: wait until it is, or fix `volumes`")
    return [found[n] for n in names]


async def check_run(ctx: Context, project_id: str, conf: dict[str, Any]) -> list[VolumeRec]:
    """A run's network volumes (``volumes: [name:/path]``, or ``name: [a, b]`` alternatives) exist, are
    active, and some availability zone has one of each mount point; they are returned (none: the run names
    no network volume)."""
    points = [names for names, _path in mount_points(conf)]
    if not points:
        return []
    found = {v.name: v for v in await for_run(ctx, project_id, [n for names in points for n in names])}
    try:
        placements([[found[n] for n in names] for names in points])
    except ValueError as e:
        raise ServiceError(f"{e}: a job mounts volumes of one availability zone (volumes)") from None
    return list(found.values())
