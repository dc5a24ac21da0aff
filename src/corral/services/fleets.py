"""Fleets: plan, apply (create or update in place), list, get, delete, delete instances."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from corral import config  # lazy: the models load on first use, not at start-up
from corral.config.fleet_spec import CONFIGURATION, FleetSpec
from corral.context import Context
from corral.domain.access import backend_types, usable_computes
from corral.domain.events import fleet_target
from corral.domain.fleets import without_ssh_keys
from corral.domain.names import random_words
from corral.domain.records import FleetRec, InstanceQuery, InstanceRec, ProjectRec, UserRec
from corral.domain.resources import match_requirements
from corral.domain.statuses import ENDING_FLEET, ENDING_INSTANCE
from corral.scheduler import offer_filters
from corral.scheduler.blocks import smallest_carves
from corral.scheduler.codec import offer_to_json
from corral.scheduler.types import Offer
from corral.schemas import wire
from corral.schemas.requests import FleetPlanIn, FleetSpecIn
from corral.services import apply_policies, aws_fleets, input_rules, serialize, ssh_fleets
from corral.services.errors import ResourceExists, ResourceNotExists, ServiceError, validated
from corral.settings import Settings
from corral.store import events
from corral.store import fleets as store
from corral.store.encryption import cipher_for
from corral.store.errors import Conflict
from corral.store.fleets import dump

log = logging.getLogger("corral.fleets")


def random_name() -> str:
    return random_words()


def normalize_spec(raw: FleetSpecIn, loc: tuple[str | int, ...], settings: Settings) -> FleetSpec:
    """Validate a FleetSpec (422 naming the field; dstack's name rule; the server's caps) and return it
    typed, its ``document`` dstack's normalised form."""
    conf = validated(config.parse_fleet_configuration, raw.configuration, (*loc, CONFIGURATION))
    profile = validated(config.parse_profile, raw.profile, (*loc, "profile"))
    dumped = conf.model_dump(mode="json")
    input_rules.check_fleet_caps(dumped, settings, (*loc, CONFIGURATION))
    if conf.name is not None:
        input_rules.check_resource_name(conf.name)
    document = {
        CONFIGURATION: dumped,
        "configuration_path": raw.configuration_path,
        "profile": profile.model_dump(mode="json"),
        "autocreated": raw.autocreated,
    }
    return FleetSpec(conf=conf, profile=profile, document=document)


def price_sources(ctx: Context) -> dict[str, dict[str, Any]]:
    """Per backend that prices from a catalogue (aws), where its prices come from, for offers'
    ``backend_data``: the catalogue (``price_catalog``), its date (``price_date``) and what the prices leave
    out (``public_ipv4_hourly``: AWS's charge for an instance's public IPv4 address)."""
    out: dict[str, dict[str, Any]] = {}
    for name, compute in ctx.computes.items():
        info = getattr(compute, "catalog_info", None)
        if info is not None:
            from corral.backends.aws.catalog import PUBLIC_IPV4_HOURLY

            source = info()
            out[name] = {
                "price_catalog": source.source,
                "price_date": source.date,
                "public_ipv4_hourly": PUBLIC_IPV4_HOURLY,
            }
    return out


def offer_json(offer: Offer, blocks: int = 1, sources: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """dstack's ``InstanceOfferWithAvailability`` for a backend offer (``sources``: ``price_sources``, for
    ``backend_data``)."""
    return {
        "backend": serialize.WIRE_BACKEND.get(offer.backend, offer.backend),
        "corral_backend": offer.backend,
        "instance": wire.instance_type(offer_to_json(offer)),
        "region": offer.region,
        "price": offer.price,
        "backend_data": dict((sources or {}).get(offer.backend) or {}),
        "availability": "available",
        "availability_zones": None,
        "instance_runtime": "shim",
        "blocks": blocks,
        "total_blocks": blocks,
    }


def fleet_offers(ctx: Context, spec: FleetSpec, project: ProjectRec) -> list[Offer]:
    from corral.config import ResourcesSpec

    if spec.is_ssh:
        return []
    req = (spec.conf.resources or ResourcesSpec()).to_requirements()
    f = offer_filters.from_conf(spec.configuration)
    return smallest_carves(
        o
        for o in ctx.project_offers(project.backends)
        if match_requirements(req, o.resources) is None and offer_filters.passes(o, f)
    )


def check_backends(ctx: Context, project: ProjectRec, spec: FleetSpec) -> None:
    """A cloud fleet whose ``backends`` name none the project has on this server could never get an
    instance: refused, naming the backends configured (``local`` goes on the wire as ``remote``)."""
    wanted = [b.value for b in spec.conf.backends or []]
    if not wanted or spec.is_ssh:
        return
    usable = usable_computes(ctx.computes, backend_types(project.backends))
    configured = sorted({serialize.WIRE_BACKEND.get(n, n) for n in usable if ctx.computes[n].offers()})
    if any(b in configured or b == "local" for b in wanted):
        return
    names = ", ".join(wanted)
    have = ", ".join(f"`{b}`" + (" (this machine)" if b == "remote" else "") for b in configured) or "none"
    raise ServiceError(
        f"The fleet's `backends` ({names}) {'is' if len(wanted) == 1 else 'are'} not configured for project "
        f"{project.name} on this server; the backends configured: {have}. Remove `backends` or list one of those"
    )


def _check_options(project: ProjectRec, spec: FleetSpec) -> None:
    """A fleet's options that corral applies only in part, or not: a ``resources.shm_size`` (a job's shared memory
    is its run's ``shm_size``; dstack only folds the fleet's into the offers' requirements, which never filter on
    it) is refused, naming it; then the cloud fleet's options (:func:`_check_aws`)."""
    resources = spec.conf.resources
    if resources is not None and resources.shm_size is not None:
        raise ServiceError(
            "A fleet's `resources.shm_size` has no effect: a job's shared memory is set by its run's "
            "`resources.shm_size`. Remove `shm_size` from the fleet's `resources`"
        )
    _check_aws(project, spec)


def _check_aws(project: ProjectRec, spec: FleetSpec) -> None:
    """A cloud fleet's ``availability_zones`` and ``tags``, as the project's aws backend applies them, and the
    options of a cloud fleet corral does not apply yet (``retry``, ``backend_options``, a ``nodes.target`` above
    ``nodes.min``): refused, naming them."""
    if spec.is_ssh:
        return  # an SSH fleet's cloud-only options are refused by ssh_fleets.check
    aws_fleets.check(project.backends, spec.conf.regions, spec.conf.availability_zones, spec.conf.tags)
    if spec.conf.retry is not None and spec.conf.retry is not False:
        raise ServiceError(
            "A fleet's `retry` (how long to retry provisioning its instances) is not supported yet; "
            "remove `retry` from the fleet"
        )
    if spec.conf.backend_options:
        raise ServiceError(
            "A fleet's `backend_options` (Vast.ai offer options) is not supported yet: corral has no vastai "
            "backend; remove `backend_options` from the fleet"
        )
    nodes = spec.conf.nodes
    if nodes is not None and nodes.target != nodes.min:
        raise ServiceError(
            f"A fleet's `nodes.target` ({nodes.target} instances made at apply, above `nodes.min` {nodes.min}) is "
            "not supported yet: corral makes `nodes.min` instances at apply and more as runs need them, up to "
            "`nodes.max`. Remove `target` or set it to `min`"
        )


async def with_policies(ctx: Context, project: ProjectRec, user: str, spec: FleetSpec) -> FleetSpec:
    """``spec`` as the server's policies answer it (``spec`` itself when there are none or they keep it). An SSH
    fleet's private keys never leave the server: its ``ssh_config`` is sent without them and kept as given."""
    answered = await apply_policies.ask(ctx, "fleet", project, user, without_ssh_keys(spec.as_dict()))
    if answered is None:
        return spec
    ssh_config = spec.document[CONFIGURATION].get("ssh_config")
    conf = answered.get(CONFIGURATION)
    if ssh_config is not None and isinstance(conf, dict):
        answered = {**answered, CONFIGURATION: {**conf, "ssh_config": ssh_config}}

    def parse() -> FleetSpec:  # with the checks that refuse a fleet's spec, so that a refusal names the policy
        raw = validated(FleetSpecIn.model_validate, _known(answered), apply_policies.ANSWER)
        out = normalize_spec(raw, apply_policies.ANSWER, ctx.settings)
        check_backends(ctx, project, out)
        _check_options(project, out)
        if out.is_ssh:
            ssh_fleets.check(out.configuration)
        return out

    return apply_policies.reparsed(ctx, "fleet", parse)


def _known(document: Mapping[str, object]) -> dict[str, object]:
    """The fields of a FleetSpec document that corral reads (dstack's model may carry more, e.g.
    ``merged_profile``)."""
    return {k: v for k, v in document.items() if k in FleetSpecIn.model_fields}


async def get_plan(ctx: Context, project: ProjectRec, user: UserRec, spec: FleetSpecIn) -> dict[str, Any]:
    given = normalize_spec(spec, ("spec",), ctx.settings)
    normalized = await with_policies(ctx, project, user.name, given)  # dstack's effective_spec
    check_backends(ctx, project, normalized)
    _check_options(project, normalized)
    name = normalized.name
    async with ctx.db.read() as conn:
        current = await store.get_fleet(conn, project.id, name=name) if name else None
        await ssh_fleets.prepare(conn, normalized, current)
    offers = await _reserved(ctx, project, normalized, fleet_offers(ctx, normalized, project))
    document = normalized.as_dict()
    return {
        "project_name": project.name,
        "user": user.name,
        "spec": given.as_dict(),
        "effective_spec": without_ssh_keys(document),
        "current_resource": serialize.fleet(current) if current else None,
        "offers": [offer_json(o, sources=price_sources(ctx)) for o in offers],
        "total_offers": len(offers),
        "max_offer_price": max((o.price for o in offers), default=None),
        "action": ssh_fleets.plan_action(current, normalized),
    }


async def _reserved(ctx: Context, project: ProjectRec, spec: FleetSpec, offers: list[Offer]) -> list[Offer]:
    """``offers`` narrowed to the fleet's capacity reservation (its type in its region), as placement narrows
    them; as they are when EC2 cannot be asked now."""
    compute: Any = ctx.computes.get("aws")
    reservation = spec.conf.reservation
    if not reservation or compute is None or spec.is_ssh:
        return offers
    from corral.backends.aws import reservations

    try:
        return reservations.narrowed(offers, await compute.find_reservation(project.name, reservation))
    except Exception as e:  # the plan still lists what the fleet's other options allow
        log.warning("could not look capacity reservation %s up: %s", reservation, e)
        return offers


def _spec_changed(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.get(CONFIGURATION) != b.get(CONFIGURATION)


async def apply(
    ctx: Context, project: ProjectRec, plan: FleetPlanIn, force: bool, user: UserRec | None = None
) -> dict[str, Any]:
    normalized = normalize_spec(plan.spec, ("plan", "spec"), ctx.settings)
    normalized = await with_policies(ctx, project, user.name if user else project.owner.name, normalized)
    check_backends(ctx, project, normalized)
    _check_options(project, normalized)
    name = normalized.name or random_name()
    normalized = normalized.named(name)
    current_resource = plan.current_resource
    now = round(time.time(), 6)  # microseconds: the wire resolution, so keyset pages are exact
    cipher = cipher_for(ctx.settings)
    actor = user.id if user else None
    stored = dump(ssh_fleets.stored_spec(cipher, normalized.as_dict()))  # private keys sealed, before the write lock
    async with ctx.db.write() as conn:
        existing = await store.get_fleet(conn, project.id, name=name)
        ssh_hosts = await ssh_fleets.prepare(conn, normalized, existing)
        if existing is not None:
            if not force and (
                current_resource is None
                or current_resource.get("id") != existing.id
                or _spec_changed((current_resource.get("spec") or {}), without_ssh_keys(existing.spec))
            ):
                raise ServiceError("Failed to apply plan. Resource has been changed. Try again or use force apply.")
            if existing.status != "active":
                raise ServiceError(f"Fleet {name} is being deleted; wait until it is gone")
            ssh_change = ssh_hosts is not None or ssh_fleets.is_ssh(existing.spec)
            if ssh_change and (problem := ssh_fleets.update_problem(existing.spec, normalized.as_dict())):
                raise ServiceError(problem)
            if not ssh_fleets.same_spec(existing.spec, normalized.as_dict()):
                await store.update_fleet(conn, existing.id, {"spec": stored, "last_processed_at": now})
                await events.emit(conn, "Fleet updated", actor, [fleet_target(project.id, existing.id, name)])
            fleet_id = existing.id
        else:
            fleet_id = str(uuid.uuid4())
            try:
                await store.insert_fleet(
                    conn,
                    {
                        "id": fleet_id,
                        "project_id": project.id,
                        "name": name,
                        "created_at": now,
                        "last_processed_at": now,
                        "status": "active",
                        "status_message": None,
                        "spec": stored,
                    },
                )
            except Conflict:
                raise ResourceExists(f"Fleet {name} already exists") from None
            await events.emit(conn, "Fleet created. Status: ACTIVE", actor, [fleet_target(project.id, fleet_id, name)])
        fleet = await store.get_fleet(conn, project.id, fleet_id=fleet_id)
        if (
            fleet is not None
            and ssh_hosts is not None
            and await ssh_fleets.sync_hosts(conn, fleet, ssh_hosts, now, cipher, actor)
        ):
            fleet = await store.get_fleet(conn, project.id, fleet_id=fleet_id)
    ctx.wakeups.wake("scheduler", "instances")
    assert fleet is not None
    return serialize.fleet(fleet)


async def list_fleets(ctx: Context, project_ids: list[str] | None, **kw: Any) -> list[FleetRec]:
    async with ctx.db.read() as conn:
        return await store.list_fleets(conn, project_ids, **kw)


async def get(ctx: Context, project: ProjectRec, name: str | None, fleet_id: str | None) -> FleetRec:
    async with ctx.db.read() as conn:
        fleet = await store.get_fleet(conn, project.id, name=name, fleet_id=fleet_id)
    if fleet is None:
        raise ResourceNotExists("Fleet not found")
    return fleet


async def delete(ctx: Context, project: ProjectRec, names: list[str], user: UserRec | None = None) -> None:
    actor = user.id if user else None
    async with ctx.db.write() as conn:
        for name in names:
            fleet = await store.get_fleet(conn, project.id, name=name)
            if fleet is None or fleet.status in ENDING_FLEET:
                continue
            if await store.fleet_live_job_count(conn, fleet.id):
                raise ServiceError(f"Failed to delete fleet {name}: it is used by active runs; stop them first")
            held = [i.hostname or i.name for i in fleet.instances if i.gateway_id and i.status not in ENDING_INSTANCE]
            if held:
                raise ServiceError(
                    f"Failed to delete fleet {name}: its host {held[0]} holds a gateway; delete the gateway first"
                )
            await store.update_fleet(conn, fleet.id, {"status": "terminating"}, actor)
            for inst in fleet.instances:
                if inst.status not in ENDING_INSTANCE:
                    await store.update_instance(
                        conn,
                        inst.id,
                        {"status": "terminating", "termination_reason": "terminated_by_user"},
                        actor_id=actor,
                    )
    ctx.wakeups.wake("instances", "scheduler")


async def delete_instances(
    ctx: Context, project: ProjectRec, name: str, nums: list[int], user: UserRec | None = None
) -> None:
    async with ctx.db.write() as conn:
        fleet = await store.get_fleet(conn, project.id, name=name)
        if fleet is None:
            raise ResourceNotExists("Fleet not found")
        for inst in fleet.instances:
            if inst.instance_num not in nums or inst.status in ENDING_INSTANCE:
                continue
            if inst.status == "busy" or inst.busy_blocks:
                raise ServiceError(f"Instance {inst.name} is busy; stop its runs first")
            await store.update_instance(
                conn,
                inst.id,
                {"status": "terminating", "termination_reason": "terminated_by_user"},
                actor_id=user.id if user else None,
            )
    ctx.wakeups.wake("instances", "scheduler")


async def list_instances(ctx: Context, query: InstanceQuery) -> list[InstanceRec]:
    """dstack's ``instances/list``: a page of the live instances (``store.instance_page`` says which)."""
    async with ctx.db.read() as conn:
        return await store.instance_page(conn, query)


async def imported_fleets(ctx: Context, project: ProjectRec) -> list[FleetRec]:
    """Fleets other projects export to ``project`` (listed with ``include_imported``)."""
    from corral.services.exports import imported_fleet_ids

    out = []
    async with ctx.db.read() as conn:
        for owner_id, fleet_id in await imported_fleet_ids(ctx, project):
            fleet = await store.get_fleet(conn, owner_id, fleet_id=fleet_id)
            if fleet is not None and not fleet.deleted:
                out.append(fleet)
    return out


async def get_instance(ctx: Context, project: ProjectRec, instance_id: str) -> InstanceRec:
    """dstack's ``instances/get``: the project's instance by id, deleted or not (400 when there is none)."""
    async with ctx.db.read() as conn:
        found = await store.get_instance(conn, instance_id)
    if found is None or found.project_id != project.id:
        raise ResourceNotExists("Resource not found")
    return found


async def instance_health_checks(ctx: Context, project: ProjectRec, fleet_name: str, instance_num: int) -> list[Any]:
    """dstack's ``instances/get_instance_health_checks`` for the live instance ``instance_num`` of fleet
    ``fleet_name`` (400 when there is none). corral's agents report no DCGM health checks, so the history
    is empty; the instance's ``health_status`` is always ``healthy``, as dstack's is without checks."""
    async with ctx.db.read() as conn:
        found = await store.list_instances(conn, project_ids=[project.id])
    if not any(i.fleet_name == fleet_name and i.instance_num == instance_num for i in found):
        raise ResourceNotExists("Resource not found")
    return []
