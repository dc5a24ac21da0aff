"""Applying a run: submit a new one (its jobs, its secrets' references, its events), update a service in
place, or keep an unchanged run as it is (dstack's ``runs/apply``). The plan and the checks it shares with
``runs/get_plan`` are in ``services.runs``.

``apply`` is three steps: ``admit`` (every check that refuses before anything is written; the quota is
read in the write that submits), ``replace_or_update`` (the run of that name, if any) and ``insert_new``
(the run, its jobs and their events), the last two in one write transaction."""

from __future__ import annotations

import logging
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

from corral import diskspace
from corral.config import run_spec
from corral.config.job_facts import derive as derive_facts
from corral.config.run_spec import RunSpec
from corral.context import Context
from corral.domain import job_facts
from corral.domain.events import job_target, run_target
from corral.domain.gateways import GatewayRec, publication
from corral.domain.names import random_words
from corral.domain.records import ProjectRec, UserRec
from corral.schemas.requests import RunPlanIn
from corral.services import (
    apply_policies,
    gateways,
    local_admission,
    quota_admission,
    repos,
    run_options,
    run_references,
    run_specs,
    serialize,
    service_runs,
    service_updates,
    slurm_admission,
    volumes,
)
from corral.services.errors import ServiceError, StorageFull
from corral.services.job_specs import JobSpecs
from corral.services.runs import SUPPORTED_TYPES, derive_job_specs
from corral.store import events, run_secrets
from corral.store import gateways as gateway_store
from corral.store import runs as store
from corral.store.db import Connection
from corral.store.errors import Conflict
from corral.store.fleets import dump

log = logging.getLogger("corral.runs")


def random_name() -> str:
    """``adjective-animal-N``; a collision with a live run is caught by the unique index and retried."""
    return f"{random_words()}-{random.randint(1, 999)}"


@dataclass(frozen=True)
class Admission:
    """A run spec that passed every check made before the write (the quota is checked in it)."""

    spec: RunSpec
    #: The first name tried: the run's own, or a generated one.
    name: str
    #: The job specs derived for it (the run's own name, when it has one).
    derived: JobSpecs
    #: The first job's spec, which the quota admits.
    planned: dict[str, Any] | None
    #: The submission time, at microseconds (the wire resolution, so keyset pages are exact).
    now: float
    #: The crons of a scheduled run (None: not scheduled).
    crons: list[str] | None
    #: The gateway a service is published on (None: the in-server proxy, or not a service).
    gateway: GatewayRec | None = None


async def apply(ctx: Context, project: ProjectRec, user: UserRec, plan: RunPlanIn, force: bool) -> dict[str, Any]:
    refuse_when_low(ctx)
    adm = await admit(ctx, project, user, plan)
    spec, conf, now, crons = adm.spec, adm.spec.conf, adm.now, adm.crons
    explicit = spec.run_name
    name, derived = adm.name, adm.derived
    for attempt in range(8):
        if attempt and not explicit:  # the name was taken meanwhile: another name, its own job specs
            name = random_name()
            derived = derive_job_specs(ctx, spec, name)
        try:
            async with ctx.db.write() as conn:
                # read with the submission, not in a transaction of its own (a refusal writes nothing)
                await quota_admission.check_in(conn, project, spec.nodes, adm.planned)
                if explicit:
                    kept = await replace_or_update(ctx, conn, project, user, plan, force, adm)
                    if kept is not None:
                        return kept
                run_values, job_values = await insert_new(
                    ctx, conn, project, user, spec, derived, name, crons, now, adm.gateway
                )
            # the response is built from what was written: no read-back inside the write lock
            pub = publication(adm.gateway) if adm.gateway is not None else None
            run = store.new_run_rec(run_values, job_values, project.name, user.name, pub)
            break
        except Conflict:
            if explicit:
                raise ServiceError(f"Run {explicit} already exists", code="resource_exists") from None
            continue
    else:
        raise ServiceError("Could not pick a unique run name; try again")
    ctx.wakeups.wake("scheduler" if crons is None else "triggers", *(("services",) if conf.type == "service" else ()))
    _log_submitted(name, project, user, len(job_values))
    return serialize.run(run_secrets.revealed(ctx.cipher, run))


def refuse_when_low(ctx: Context) -> None:
    """A new run is refused (507) while the state directory is below its free-space watermark: its output
    would have nowhere to go. Stops and deletes stay allowed."""
    watermark = ctx.settings.min_free_disk
    if watermark and diskspace.below_watermark(ctx.settings.server_dir, watermark) is not None:
        msg = diskspace.refusal(ctx.settings.server_dir, watermark)
        log.warning("run refused: %s", msg, extra={"event": "disk_low"})
        raise StorageFull(msg)


async def admit(ctx: Context, project: ProjectRec, user: UserRec, plan: RunPlanIn) -> Admission:
    """Normalize the plan's run spec, put it to the server's policies (which may refuse or rewrite it) and
    make every check that refuses before the write: the type, the service's, the options', the environment's,
    the volumes', the references', the local admission's and the code's (the quota is checked in the write,
    by ``apply``)."""
    spec = run_specs.normalize(plan.run_spec, ("plan", "run_spec"), user, ctx.settings)
    spec = await apply_policies.run(ctx, project, user, spec)
    conf, merged = spec.conf, spec.merged
    if conf.type not in SUPPORTED_TYPES:
        raise ServiceError(
            f"Runs of type `{conf.type}` are not supported yet: corral runs tasks, services and dev environments"
        )
    gateway = None
    if conf.type == "service":
        gateway = await gateways.for_service(ctx, project, conf.gateway, conf.https)
        service_runs.check_service(conf, on_gateway=gateway is not None)
    run_options.check(conf, merged, ctx.settings.metrics_running_ttl, ctx.settings.allow_docker_in_docker)
    unset = [k for k, v in conf.env.items() if not isinstance(v, str)]
    if unset:
        raise ServiceError(
            f"Environment variable(s) {', '.join(unset)} have no value: give one in `env` "
            "(KEY=VALUE) or export it before `apply` so that the CLI fills it in"
        )
    await volumes.check_run(ctx, project.id, spec.configuration)
    await run_references.check(ctx, project, spec.configuration)
    # the job specs name the run (job names, a dev environment's commands): derived once for the name tried
    name = spec.run_name or random_name()
    derived = derive_job_specs(ctx, spec, name)
    planned = derived.first
    await local_admission.check(ctx, project, user, spec, planned)
    await slurm_admission.check(ctx, project, spec, planned)
    await repos.check_run_code(ctx, project, user, spec.document)
    now = round(time.time(), 6)  # microseconds: the wire resolution, so keyset pages are exact
    crons = run_options.schedule_crons(conf, merged, now)
    return Admission(spec=spec, name=name, derived=derived, planned=planned, now=now, crons=crons, gateway=gateway)


async def replace_or_update(
    ctx: Context,
    conn: Connection,
    project: ProjectRec,
    user: UserRec,
    plan: RunPlanIn,
    force: bool,
    adm: Admission,
) -> dict[str, Any] | None:
    """On ``conn``, the run of the spec's own name, if there is one: an unfinished one is kept as it is
    (the same configuration) or updated in place (a service), and its wire answer returned, else refused;
    a finished one is marked deleted, to be replaced (None: insert the new run)."""
    spec = adm.spec
    explicit = spec.run_name
    assert explicit is not None
    existing = await store.get_run(conn, project.id, run_name=explicit)
    if existing is None:
        return None
    if existing.status not in store.FINISHED_RUN_STATUSES:
        stored = run_secrets.revealed(ctx.cipher, existing).run_spec
        if spec.same_configuration(stored):
            await store.update_run(conn, existing.id, {"last_processed_at": adm.now})
            updated = await store.get_run(conn, project.id, run_id=existing.id)
            assert updated is not None
            return serialize.run(run_secrets.revealed(ctx.cipher, updated))
        if spec.conf.type == "service" and run_spec.stored_type(stored) == "service":
            await service_updates.update(
                conn,
                ctx.cipher,
                existing,
                spec.named(explicit),
                adm.derived.templates,
                user,
                plan.current_resource,
                force,
            )
            # an in-place change of `gateway` (dstack's PR #4221): the service moves to its new gateway
            await store.update_run(conn, existing.id, {"gateway_id": await _published_on(conn, adm.gateway)})
            updated = await store.get_run(conn, project.id, run_id=existing.id)
            assert updated is not None
            ctx.wakeups.wake("services")
            return serialize.run(run_secrets.revealed(ctx.cipher, updated))
        if not force:
            raise ServiceError("Failed to apply plan. Resource has been changed. Try again or use force apply.")
        raise ServiceError(f"Cannot override active run {explicit}. Stop the run first.")
    await store.mark_runs_deleted(conn, [existing.id])
    await events.emit(conn, "Run deleted", user.id, [run_target(project.id, existing.id, existing.run_name)])
    return None


async def insert_new(
    ctx: Context,
    conn: Connection,
    project: ProjectRec,
    user: UserRec,
    spec: RunSpec,
    derived: JobSpecs,
    name: str,
    crons: list[str] | None,
    now: float,
    gateway: GatewayRec | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """On ``conn``, write the run named ``name`` (published on ``gateway``, if given), its jobs (none yet for a
    scheduled run) and their events; returns the run's and the jobs' values as written."""
    run_values, job_values = _new_values(ctx, project, user, spec, derived, name, crons, now)
    if gateway is not None:
        run_values["gateway_id"] = await _published_on(conn, gateway)
    await store.insert_run(conn, run_values)
    if job_values:
        await store.insert_jobs(conn, job_values)
    await events.emit(
        conn,
        f"Run submitted. Status: {str(run_values['status']).upper()}",
        user.id,
        [run_target(project.id, run_values["id"], name)],
    )
    if gateway is not None:
        await events.emit(conn, "Service assigned to gateway", None, [run_target(project.id, run_values["id"], name)])
    for jv in job_values:
        await events.emit(
            conn,
            "Job created on run submission. Status: SUBMITTED",
            None,
            [job_target(project.id, jv["id"], jv["job_name"], run_values["id"])],
        )
    return run_values, job_values


async def _published_on(conn: Connection, gateway: GatewayRec | None) -> str | None:
    """The id of the gateway a service is written as published on, its row locked: its deletion waits for this
    write, or came first (then the gateway is refused, as dstack refuses one marked for deletion)."""
    if gateway is None:
        return None
    held = await gateway_store.locked(conn, gateway.id)
    if held is None or held.to_be_deleted:
        raise ServiceError(f"Gateway {gateway.name} is marked for deletion")
    return held.id


def _new_values(
    ctx: Context,
    project: ProjectRec,
    user: UserRec,
    spec: RunSpec,
    derived: JobSpecs,
    name: str,
    crons: list[str] | None,
    now: float,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The values of the run named ``name`` and of its jobs (none yet for a scheduled run), to insert."""
    conf = spec.conf
    named = spec.named(name)
    cipher = ctx.cipher()  # once per run, not once per job
    run_values: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "project_id": project.id,
        "user_id": user.id,
        "run_name": name,
        "submitted_at": now,
        "last_processed_at": now,
        # a scheduled run waits for its first trigger with no jobs (dstack 0.22.5)
        "status": "submitted" if crons is None else "pending",
        "status_message": None,
        "termination_reason": None,
        "run_spec": dump(run_secrets.sealed_run_spec(cipher, named.as_dict())),
        "priority": spec.priority,
        "fleet_id": None,
        "deployment_num": 0,
        "repo_id": named.document["repo_id"],
        "stop_on_master_done": getattr(spec.merged.stop_criteria, "value", None) == "master-done",
    }
    job_values: list[dict[str, Any]] = [
        {
            "id": str(uuid.uuid4()),
            "run_id": run_values["id"],
            "project_id": project.id,
            "run_name": name,
            "job_num": js["job_num"],
            "replica_num": js["replica_num"],
            "job_name": js["job_name"],
            "submission_num": 0,
            "deployment_num": 0,
            "submitted_at": now,
            "last_processed_at": now,
            "status": "submitted",
            "job_spec": dump(run_secrets.sealed_job_spec(cipher, js)),
            "scheduling_facts": job_facts.encode(derive_facts(named, js)),
            "priority": run_values["priority"],
            "blocks": 1,
            "ready": False if conf.type == "service" else None,
        }
        for js in derived.jobs
    ]
    if crons is not None:
        run_values.update(run_options.scheduled_run_values(crons, job_values, now))
        job_values = []
    elif conf.type == "service":
        run_values["service_templates"] = service_updates.templates_value(ctx.cipher, derived.templates, 0, named)
        if not job_values:
            run_values["status"] = "running"  # at zero replicas, waiting for requests
    return run_values, job_values


def _log_submitted(name: str, project: ProjectRec, user: UserRec, jobs: int) -> None:
    log.info(
        "run %s submitted to project %s by %s (%d job(s))",
        name,
        project.name,
        user.name,
        jobs,
        extra={"event": "run_submitted", "run_name": name, "project": project.name, "user": user.name},
    )
