"""Gateways, as dstack 0.22.5's ``gateways/*`` routes have them: list and get (project members, or anyone
for a public project), get_plan, apply, create (deprecated), delete, set_default and set_wildcard_domain
(project admins).

A gateway runs on an instance of an SSH or local fleet of its project: ``backend: remote``, ``region: <fleet
name>`` (an SSH host, or this server's own machine for a local fleet). It is created ``submitted`` and holds one
idle instance of that fleet from then on (``plan_apply.hold_for_gateway``:
the scheduler places no job there while the gateway exists); a fleet with no idle instance leaves it
``failed`` with a message naming the fleet. With ``backend: aws`` (the project has an aws backend) it runs on
a VM of its own, which the gateways worker brings up (``backends.aws.gateway_vm``). Its deployment and
operation are the gateways worker's (``workers/gateways.py``). A deletion marks it; the worker releases its
host (or terminates its VM) and removes it. A gateway that services are published on is not deleted: the
refusal names them (dstack deletes it anyway, and a service left on a deleted gateway broke a later gateway:
dstack issue #3131).

Imports ``config``, ``domain``, ``schemas``'s requests, ``store`` and the services' errors and policies.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Union

from pydantic import ValidationError

from corral import config  # lazy: the models load on first use, not at start-up
from corral.context import Context
from corral.domain import aws_tags
from corral.domain.access import backend_types
from corral.domain.gateways import (
    NO_IDLE_HOST,
    GatewayRec,
    GatewayService,
    apply_refusal,
    changed_fields,
    configuration_error,
    host_fleet_refusal,
    https_refusal,
    publish_refusal,
    updatable_in_place,
)
from corral.domain.records import FleetRec, ProjectRec, UserRec
from corral.domain.statuses import GatewayStatus
from corral.services import apply_policies, input_rules
from corral.services.errors import ResourceNotExists, ServiceError, validation_errors
from corral.services.fleets import random_name
from corral.services.serialize import iso
from corral.store import encryption, gateway_ops, plan_apply
from corral.store import fleets as fleet_store
from corral.store import gateways as store
from corral.store.errors import Conflict

if TYPE_CHECKING:
    from corral.config.common import EntityReference

#: A service's ``gateway``: a name, ``project/name`` (parsed), true (the default gateway), false (none) or omitted.
GatewayRef = Union[bool, "EntityReference", str, None]
CONFIGURATION = "configuration"
#: A gateway's replica status by the gateway's (dstack's ``GatewayReplicaStatus`` values).
_REPLICA_STATUS = {"submitted": "submitted", "provisioning": "provisioning", "running": "running"}


def wire(g: GatewayRec) -> dict[str, Any]:
    """dstack's ``Gateway`` (``configuration.default`` and ``.domain`` kept equal to ``default`` and
    ``wildcard_domain``; ``backend``, ``region``, ``ip_address``, ``instance_id``: null, as since dstack 0.21)."""
    replicas = []
    if g.instance_id is not None or (g.own_vm and g.hostname):
        status = "terminating" if g.to_be_deleted else _REPLICA_STATUS.get(g.status.value, "terminated")
        replicas.append(
            {
                "hostname": g.hostname, "replica_num": 0, "backend": g.backend, "region": g.fleet_name,
                "created_at": iso(g.created_at), "status": status,
                "status_message": g.status_message if g.status == GatewayStatus.FAILED else None,
            }
        )  # fmt: skip
    return {
        "id": g.id,
        "name": g.name,
        "project_name": g.project_name,
        CONFIGURATION: {**g.configuration, "default": g.is_default, "domain": g.wildcard_domain},
        "created_at": iso(g.created_at),
        "status": g.status.value,
        "status_message": g.status_message,
        "hostname": None,
        "wildcard_domain": g.wildcard_domain,
        "default": g.is_default,
        "replicas": replicas,
        "backend": None,
        "region": None,
        "ip_address": None,
        "instance_id": None,
    }


def parse_configuration(raw: Any, loc: tuple[str | int, ...]) -> dict[str, Any]:
    """The configuration as stored (dstack's wire dump, defaults filled in); a 422 naming the field, or a 400
    (dstack's name rule; a backend or option corral cannot host a gateway with)."""
    if isinstance(raw, dict) and "router" in raw and raw["router"] is None:
        raw = {k: v for k, v in raw.items() if k != "router"}  # dstack drops it (0.20.27-0.20.29 clients)
    try:
        conf = config.parse_gateway_configuration(raw if isinstance(raw, dict) else {})
    except ValidationError as e:
        raise validation_errors(e, loc) from None
    if conf.name is not None:
        input_rules.check_resource_name(conf.name)
    out: dict[str, Any] = json.loads(conf.model_dump_json())
    refusal = configuration_error(out)
    if refusal is not None:
        raise ServiceError(refusal)
    return out


async def _checked(
    ctx: Context, project: ProjectRec, user: UserRec, raw: Any, path: str | None, loc: tuple[str | int, ...]
) -> dict[str, Any]:
    """The configuration parsed, put to the server's policies (dstack's ``GatewaySpec``) and checked again."""
    conf = parse_configuration(raw, (*loc, CONFIGURATION))
    spec = {CONFIGURATION: conf, "configuration_path": path}
    answered = await apply_policies.ask(ctx, "gateway", project, user.name, spec)
    if answered is not None:
        got = answered.get(CONFIGURATION)
        conf = apply_policies.reparsed(
            ctx, "gateway", lambda: parse_configuration(got, (*apply_policies.ANSWER, CONFIGURATION))
        )
    await _host_fleet(ctx, project, conf)
    return conf


def _aws_backend(project: ProjectRec, conf: Mapping[str, Any]) -> None:
    """A 400 saying what to fix when the project's aws backend cannot host the gateway ``conf`` describes."""
    doc = next((b for b in project.backends if b.get("type") == "aws"), None)
    if doc is None:
        raise ServiceError(
            f"Project {project.name} has no aws backend: a gateway with `backend: aws` runs on a VM of the "
            "project's aws backend; configure the backend first, or use `backend: remote` on an SSH or local fleet"
        )
    region, regions = str(conf.get("region")), doc.get("regions")
    if regions and region not in regions:
        raise ServiceError(
            f"region: {region} is not among the aws backend's regions ({', '.join(regions)}): fix `region`"
        )
    problem = aws_tags.problem(dict(conf.get("tags") or {}), "tags")
    if problem is not None:
        raise ServiceError(problem)


async def _host_fleet(ctx: Context, project: ProjectRec, conf: Mapping[str, Any]) -> FleetRec | None:
    """Where the gateway runs: the SSH or local fleet ``region`` names (a 400 saying what to fix when the project
    has no such fleet of that name), or None for a gateway on a VM of its own (its backend checked)."""
    if conf.get("backend") == "aws":
        _aws_backend(project, conf)
        return None
    region = str(conf.get("region"))
    async with ctx.db.read() as conn:
        fleet = await fleet_store.get_fleet(conn, project.id, name=region)
    if fleet is None or fleet.deleted or fleet.status not in ("active", "submitted"):
        raise ServiceError(
            f"Fleet {region} not found in project {project.name}: a gateway with `backend: remote` runs on an "
            "instance of the SSH or local fleet `region` names; create the fleet first, or fix `region`"
        )
    fleet_conf = fleet.spec.get(CONFIGURATION) or {}
    backends = fleet_conf.get("backends")
    refusal = host_fleet_refusal(
        region,
        bool(fleet_conf.get("ssh_config")),
        [str(b) for b in backends] if isinstance(backends, list) else None,
        backend_types(project.backends),
    )
    if refusal is not None:
        raise ServiceError(refusal)
    return fleet


async def get_plan(ctx: Context, project: ProjectRec, user: UserRec, raw: Any, path: str | None) -> dict[str, Any]:
    """dstack's ``GatewayPlan``: ``create``, or ``update`` when a gateway of that name exists (its
    ``current_resource``), unless it cannot be updated in place (then ``create``)."""
    conf = await _checked(ctx, project, user, raw, path, ("spec",))
    current = None
    if conf.get("name") is not None:
        async with ctx.db.read() as conn:
            current = await store.by_name(conn, project.id, str(conf["name"]))
    action = "create"
    if current is not None:
        if current.to_be_deleted:
            raise ServiceError(f"Gateway '{current.name}' is being deleted. Try again later.")
        # a failed gateway is re-created (the CLI deletes it, then applies), never updated in place
        in_place = current.status != GatewayStatus.FAILED and updatable_in_place(current.configuration, conf)
        action = "update" if in_place else "create"
    given = parse_configuration(raw, ("spec", CONFIGURATION))  # the spec as asked; the effective one: policies'
    return {
        "project_name": project.name,
        "user": user.name,
        "spec": {CONFIGURATION: given, "configuration_path": path},
        "effective_spec": {CONFIGURATION: conf, "configuration_path": path},
        "current_resource": wire(current) if current is not None else None,
        "action": action,
    }


def _same_resource(g: GatewayRec, current: Mapping[str, Any] | None) -> bool:
    """Whether the ``current_resource`` a plan was made with is still the gateway (same id and configuration,
    ``default`` aside: it is the project's, not the configuration's)."""
    if current is None or str(current.get("id")) != g.id:
        return False
    theirs = current.get(CONFIGURATION)
    if not isinstance(theirs, dict):
        return False
    try:
        theirs = json.loads(config.parse_gateway_configuration(theirs).model_dump_json())
    except ValidationError:
        return False
    ours = wire(g)[CONFIGURATION]
    return {**theirs, "default": None} == {**ours, "default": None}


async def apply(
    ctx: Context,
    project: ProjectRec,
    user: UserRec,
    raw: Any,
    path: str | None,
    current: Mapping[str, Any] | None,
    force: bool,
) -> dict[str, Any]:
    """``gateways/apply``: create the gateway, or update the one of that name in place."""
    conf = await _checked(ctx, project, user, raw, path, ("plan", "spec"))
    name = conf.get("name")
    if name is None:
        return await create_checked(ctx, project, user, conf)
    async with ctx.db.read() as conn:
        existing = await store.by_name(conn, project.id, str(name))
    if existing is None:
        return await create_checked(ctx, project, user, conf)
    if not force and not _same_resource(existing, current):
        raise ServiceError("Failed to apply plan. Resource has been changed. Try again or use force apply.")
    refusal = apply_refusal(existing, conf)
    if refusal is not None:
        raise ServiceError(refusal)
    return await _update(ctx, project, user, existing, conf)


async def _update(
    ctx: Context, project: ProjectRec, user: UserRec, g: GatewayRec, conf: dict[str, Any]
) -> dict[str, Any]:
    changed = changed_fields(g.configuration, conf)
    async with ctx.db.write() as conn:
        now_ = await store.get(conn, g.id)
        if now_ is None:
            raise ResourceNotExists("Resource not found")
        if changed:
            kept = {**conf, "default": conf.get("default") if conf.get("default") is not None else now_.is_default}
            await store.update_configuration(conn, now_, kept, changed, user.id)
        if conf.get("default") is True:
            await store.set_default(conn, project.id, now_, user.id)
        elif conf.get("default") is False and now_.is_default:
            await store.set_default(conn, project.id, None, user.id)
        made = await store.get(conn, g.id)
    assert made is not None
    ctx.wakeups.wake("gateways")
    return wire(made)


async def create(ctx: Context, project: ProjectRec, user: UserRec, raw: Any) -> dict[str, Any]:
    """``gateways/create`` (deprecated in dstack): a new gateway, the name taken or refused."""
    conf = await _checked(ctx, project, user, raw, None, ())
    if conf.get("name") is not None:
        async with ctx.db.read() as conn:
            if await store.by_name(conn, project.id, str(conf["name"])) is not None:
                raise ServiceError("Gateway with this name already exists", code="resource_exists")
    return await create_checked(ctx, project, user, conf)


async def create_checked(ctx: Context, project: ProjectRec, user: UserRec, conf: dict[str, Any]) -> dict[str, Any]:
    """A new gateway of a checked configuration, held on an idle instance of its fleet (or ``failed``)."""
    fleet = await _host_fleet(ctx, project, conf)
    secret = secrets.token_urlsafe(32)
    sealed = encryption.seal(ctx.cipher(), secret)
    digest = hashlib.sha256(secret.encode()).hexdigest()
    for _ in range(5):
        now = time.time()
        async with ctx.db.write() as conn:
            name = conf.get("name")
            if name is None:
                taken = await store.names_in_use(conn, project.id)
                name = next(n for n in iter(random_name, None) if n not in taken)
            try:
                g = await store.create(
                    conn, project.id, str(name), {**conf, "name": name}, digest, sealed, now, user.id
                )
            except Conflict:
                if conf.get("name") is not None:
                    raise ServiceError("Gateway with this name already exists", code="resource_exists") from None
                continue
            if conf.get("default") is True or (
                conf.get("default") is None and await store.default_of(conn, project.id) is None
            ):
                await store.set_default(conn, project.id, g, user.id)
            if fleet is not None:
                await _hold(ctx, conn, fleet, g.id, now)
            made = await store.get(conn, g.id)
        assert made is not None
        ctx.wakeups.wake("gateways", "scheduler")
        return wire(made)
    raise ServiceError("could not pick a free gateway name; name the gateway")


async def _hold(ctx: Context, conn: Any, fleet: FleetRec, gateway_id: str, now: float) -> None:
    """Hold an idle host of ``fleet`` for the gateway (or fail it, naming the fleet)."""
    hosts = await store.hostnames_in_use(conn)
    host = await plan_apply.hold_for_gateway(ctx.db, conn, fleet.id, gateway_id, hosts, now)
    if host is None:
        await store.set_status(conn, gateway_id, GatewayStatus.FAILED, now, NO_IDLE_HOST.format(fleet=fleet.name))
    else:
        await store.set_host(conn, gateway_id, host.instance_id, host.hostname)


async def list_gateways(ctx: Context, project: ProjectRec) -> list[dict[str, Any]]:
    async with ctx.db.read() as conn:
        return [wire(g) for g in await store.of_project(conn, project.id)]


async def _named(ctx: Context, project: ProjectRec, name: str) -> GatewayRec:
    async with ctx.db.read() as conn:
        g = await store.by_name(conn, project.id, name)
    if g is None:
        raise ResourceNotExists("Resource not found")
    return g


async def get(ctx: Context, project: ProjectRec, name: str) -> dict[str, Any]:
    return wire(await _named(ctx, project, name))


async def delete(ctx: Context, project: ProjectRec, user: UserRec, names: list[str]) -> None:
    """Mark the named gateways for deletion (unknown names are ignored, as dstack does); a gateway that services
    are published on is refused, naming them."""
    async with ctx.db.write() as conn:
        found = [g for g in await store.by_names(conn, project.id, names) if await store.locked(conn, g.id)]
        for g in found:
            runs = await store.services_on(conn, g.id)
            if runs:
                raise ServiceError(
                    f"Gateway {g.name} publishes services {', '.join(runs)}: stop them, or move them to another "
                    "gateway (`gateway:` in their configuration), then delete the gateway"
                )
        await store.mark_to_be_deleted(conn, found, user.id)
    if found:
        ctx.wakeups.wake("gateways")


async def set_default(ctx: Context, project: ProjectRec, user: UserRec, name: str) -> None:
    async with ctx.db.write() as conn:
        g = await store.by_name(conn, project.id, name)
        if g is None:
            raise ResourceNotExists("Resource not found")
        if g.to_be_deleted:
            raise ServiceError("Cannot set gateway marked for deletion as default")
        await store.set_default(conn, project.id, g, user.id)


async def set_wildcard_domain(
    ctx: Context, project: ProjectRec, user: UserRec, name: str, domain: str | None
) -> dict[str, Any]:
    """``set_wildcard_domain`` (deprecated in dstack): the domain of an existing gateway, as an in-place apply."""
    g = await _named(ctx, project, name)
    conf = {**g.configuration, "domain": domain}
    refusal = configuration_error(conf)
    if refusal is not None:
        raise ServiceError(refusal)
    return await _update(ctx, project, user, g, {**conf, "default": None})


# --- services on a gateway ------------------------------------------------------------------------------


async def for_service(
    ctx: Context, project: ProjectRec, gateway: GatewayRef, https: bool | Literal["auto"] | None
) -> GatewayRec | None:
    """The gateway a service of ``project`` is published on, by its ``gateway`` (dstack's ``assign_service``):
    a name (or ``project/name``) → that gateway, ``false`` → none (the in-server proxy), omitted → the project's
    default gateway if it has one, ``true`` → the default gateway, which must exist. dstack's 400s when the
    gateway cannot take it (being deleted, no host, not running, no domain, HTTPS without a certificate)."""
    if gateway is False:
        return None
    async with ctx.db.read() as conn:
        if gateway is None or gateway is True:
            found = await store.default_of(conn, project.id)
            if found is None and gateway is True:
                raise ResourceNotExists(
                    "The service requires a gateway, but there is no default gateway in the project"
                )
        else:
            owner = gateway.project if not isinstance(gateway, str) else None
            name = gateway.name if not isinstance(gateway, str) else gateway
            if owner not in (None, project.name):
                raise ServiceError(
                    f"`gateway`: {owner}/{name} is a gateway of another project; corral does not import gateways "
                    "yet: name a gateway of this project"
                )
            found = await store.by_name(conn, project.id, name)
            if found is None:
                raise ResourceNotExists(f"Gateway {name} does not exist in project {project.name}")
    if found is None:
        return None
    refusal = publish_refusal(found) or https_refusal(https, found.has_certificate)
    if refusal is not None:
        raise ServiceError(refusal)
    return found


async def services_to_register(ctx: Context, gateway_id: str) -> list[GatewayService]:
    """The services that should be registered on the gateway ``gateway_id``: its unfinished service runs, each
    with its host, scheme, auth, rate limits, model and the in-server proxy's path the gateway forwards to (the
    one rule the gateways' operation applies too: ``store.gateway_ops.services_to_register``)."""
    async with ctx.db.read() as conn:
        g = await store.get(conn, gateway_id)
        return [] if g is None else await gateway_ops.services_to_register(conn, g)
