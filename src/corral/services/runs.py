"""Runs: plan, list, get, stop, delete (applying one is ``services.run_apply``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from corral.config.run_spec import RunSpec
from corral.context import Context
from corral.domain.documents import json_default
from corral.domain.events import run_target
from corral.domain.records import ProjectRec, RunRec, UserRec
from corral.domain.resources import match_requirements
from corral.domain.statuses import FINISHED_RUN, RunStatus
from corral.domain.times import epoch_seconds
from corral.scheduler import offer_filters
from corral.scheduler.blocks import smallest_carves, takes_job
from corral.scheduler.types import Offer
from corral.services import (
    apply_policies,
    gateways,
    local_admission,
    quota_admission,
    run_options,
    run_references,
    run_specs,
    serialize,
    service_runs,
    service_updates,
    slurm_admission,
)
from corral.services.errors import ResourceNotExists, ServiceError
from corral.services.fleets import offer_json, price_sources
from corral.services.job_specs import JobSpecs, derive
from corral.services.plan_verdict import plan_screen
from corral.store import events, run_secrets
from corral.store import runs as store

if TYPE_CHECKING:
    from corral.config import AnyRunConfiguration, ProfileParams
    from corral.schemas.requests import ListRunsBody, RunPlanBody

log = logging.getLogger("corral.runs")
SUPPORTED_TYPES = ("task", "service", "dev-environment")


def fitting_offers(ctx: Context, conf: AnyRunConfiguration, merged: ProfileParams, project: ProjectRec) -> list[Offer]:
    """The project's offers (its backends', in their regions) that hold the run's resources and pass its
    options (``offer_filters``: the rule placement applies too), cheapest first."""
    req = conf.resources.to_requirements()
    f = offer_filters.run_filter(merged)
    fitting = (
        o
        for o in ctx.project_offers(project.backends)
        if match_requirements(req, o.resources) is None and takes_job(req, o) and offer_filters.passes(o, f)
    )
    return sorted(fitting, key=lambda o: o.price)


def gpu_offers(ctx: Context, project: ProjectRec, user: UserRec, run_spec: Mapping[str, Any]) -> list[Offer]:
    """``gpus/list``: the offers with GPUs that the run spec's resources and options allow."""
    spec = run_specs.normalize(run_specs.from_document(run_spec, ("run_spec",)), ("run_spec",), user, ctx.settings)
    return [o for o in fitting_offers(ctx, spec.conf, spec.merged, project) if o.resources.gpus]


def _offers(
    ctx: Context,
    conf: AnyRunConfiguration,
    merged: ProfileParams,
    project: ProjectRec,
    reserved: frozenset[Offer] | None = None,
) -> list[dict[str, Any]]:
    """The plan's new-instance offers; only those of ``reserved`` where a capacity reservation narrows them."""
    if merged.instances is not None or getattr(merged.creation_policy, "value", None) == "reuse":
        return []
    offers = fitting_offers(ctx, conf, merged, project)
    if reserved is not None:
        offers = [o for o in offers if o in reserved]
    sources = price_sources(ctx)
    return [offer_json(o, sources=sources) for o in smallest_carves(offers)]


async def get_plan(ctx: Context, project: ProjectRec, user: UserRec, body: RunPlanBody) -> dict[str, Any]:
    given = run_specs.normalize(body.run_spec, ("run_spec",), user, ctx.settings)
    spec = await apply_policies.run(ctx, project, user, given)  # dstack's effective_run_spec
    conf, merged = spec.conf, spec.merged
    await run_references.check(ctx, project, spec.configuration)
    if conf.type == "service":
        on_gateway = await gateways.for_service(ctx, project, conf.gateway, conf.https) is not None
        service_runs.check_service(conf, on_gateway=on_gateway)
    current = None
    if spec.run_name:
        async with ctx.db.read() as conn:
            current = await store.get_run(conn, project.id, run_name=spec.run_name)
    max_offers = body.max_offers or 50
    derived = derive_job_specs(ctx, spec, spec.run_name or "run")
    specs = derived.jobs
    screened = await plan_screen(ctx, project, spec, specs[0]) if specs else None
    offers = _offers(ctx, conf, merged, project, screened.reserved if screened else None)
    verdict = screened.error if screened else None
    try:  # an option apply refuses: the plan says so
        run_options.check(conf, merged, ctx.settings.metrics_running_ttl, ctx.settings.allow_docker_in_docker)
        run_options.schedule_crons(conf, merged, time.time())
    except ServiceError as e:
        verdict = e.msg
    if verdict is None:
        try:  # what apply refuses outright the plan says too
            await local_admission.check(ctx, project, user, spec, specs[0] if specs else None)
            await slurm_admission.check(ctx, project, spec, specs[0] if specs else None)
            await quota_admission.check(ctx, project, spec.nodes, specs[0] if specs else None)
        except ServiceError as e:
            verdict = e.msg
    if screened is not None:
        # fleets other projects export here bring their own offers (the owner's backends, their instances)
        shown = [(o["corral_backend"], o["instance"], o["region"], o["price"]) for o in offers]
        for offer, availability in screened.imported_offers:
            extra = {**offer_json(offer), "availability": availability}
            key = (extra["corral_backend"], extra["instance"], extra["region"], extra["price"])
            if key not in shown:
                shown.append(key)
                offers.append(extra)
    if verdict is not None and not body.for_offers_only:
        offers = []  # what apply would refuse gets no offers: the official CLI warns before submitting
    plans = [
        {
            "job_spec": js,
            "offers": offers[:max_offers],
            "total_offers": len(offers),
            "max_price": max((o["price"] for o in offers), default=None),
        }
        for js in (service_runs.plan_specs(specs, derived.templates) if conf.type == "service" else specs)
    ]
    return {
        "project_name": project.name,
        "user": user.name,
        "run_spec": given.as_dict(),
        "effective_run_spec": spec.as_dict(),
        "job_plans": plans,
        "current_resource": serialize.run(run_secrets.revealed(ctx.cipher, current))
        if current and current.status not in store.FINISHED_RUN_STATUSES
        else None,
        "action": "update"
        if current and current.status not in store.FINISHED_RUN_STATUSES and updatable(ctx, current, spec)
        else "create",
        # corral: why the scheduler would fail this run at once if it were submitted now (None: it can run
        # now, or waits for capacity); ``corral apply`` shows it before asking
        "corral_plan_error": verdict,
    }


def updatable(ctx: Context, current: RunRec, spec: RunSpec) -> bool:
    """Whether re-applying ``spec`` over the active ``current`` is an update (a service: dstack's rule)."""
    if spec.conf.type != "service":
        return True
    stored = dict(run_secrets.revealed(ctx.cipher, current).run_spec)
    return service_updates.changed_fields(stored, spec.named(current.run_name).as_dict()) is not None


def derive_job_specs(ctx: Context, spec: RunSpec, run_name: str) -> JobSpecs:
    """The run's job specs (and a service's replica-group templates) with the server's defaults."""
    s = ctx.settings
    return derive(spec, run_name, s.default_image, s.ide_download_url, s.dind_image)


async def list_runs(ctx: Context, project_ids: list[str] | None, body: ListRunsBody, user_id: str | None) -> list[Any]:
    """A page of runs as rendered JSON (``orjson.Fragment``s). Finished runs never change, so their
    rendering is cached by (id, status, last change, shape); the page costs one narrow query plus the
    full rows of only the runs not cached yet."""
    after = None
    if body.prev_submitted_at is not None:
        after = (epoch_seconds(body.prev_submitted_at), str(body.prev_run_id or ""))
    include_jobs = body.include_jobs
    limit_subs = body.job_submissions_limit
    cache = ctx.rendered_runs
    async with ctx.db.read() as conn:
        keys = await store.list_run_keys(
            conn,
            project_ids,
            only_active=body.only_active,
            user_id=user_id,
            repo_id=body.repo_id,
            limit=body.limit,
            ascending=body.ascending,
            after=after,
        )
        shape = (include_jobs, limit_subs)
        missing = [k.id for k in keys if (k.id, k.status, k.last_processed_at, shape) not in cache]
        fresh = await store.runs_by_ids(conn, missing, include_jobs, limit_subs)
    out = []
    for k in keys:
        ck = (k.id, k.status, k.last_processed_at, shape)
        rendered = cache.get(ck)
        if rendered is None:
            rec = fresh.get(k.id)
            if rec is None:  # deleted between the two queries
                continue
            answer = serialize.run(run_secrets.revealed(ctx.cipher, rec))
            rendered = orjson.Fragment(orjson.dumps(answer, default=json_default))
            if k.status in store.FINISHED_RUN_STATUSES:
                cache.put(ck, rendered)
        out.append(rendered)
    return out


async def get(ctx: Context, project: ProjectRec, run_name: str | None, run_id: str | None) -> dict[str, Any]:
    """The run as the API shows it; a waiting run also gets its queue position (computed now, never stored)."""
    position = None
    async with ctx.db.read() as conn:
        run = await store.get_run(conn, project.id, run_name=run_name, run_id=run_id)
        if run is None:
            raise ResourceNotExists("Run not found")
        waiting = [j for j in run.jobs if j.status == "submitted" and j.instance_id is None]
        if waiting:
            position = await store.queue_position(conn, min(waiting, key=lambda j: j.job_num))
    return serialize.run(run_secrets.revealed(ctx.cipher, run), queue_position=position)


#: The statuses a user's stop moves a run out of (a run that finished meanwhile is left as it is).
_UNFINISHED_RUN = tuple(s.value for s in RunStatus if s not in FINISHED_RUN)


async def stop(ctx: Context, project: ProjectRec, names: list[str], abort: bool, user: UserRec | None = None) -> None:
    now = time.time()
    actor = user.id if user else None
    how = "abort" if abort else "stop"
    reason = "aborted_by_user" if abort else "stopped_by_user"
    job_reason = "aborted_by_user" if abort else "terminated_by_user"
    async with ctx.db.write() as conn:
        for name in names:
            run = await store.get_run(conn, project.id, run_name=name)
            if run is None or run.status in store.FINISHED_RUN_STATUSES:
                continue
            stopping = await store.update_run(
                conn,
                run.id,
                {"status": "terminating", "termination_reason": reason, "last_processed_at": now},
                expect_status=_UNFINISHED_RUN,
                actor_id=actor,
            )
            if not stopping:
                continue  # it finished since it was read (the runs worker, on Postgres): nothing left to stop
            for job in run.jobs:
                if job.status == "submitted" and job.instance_id is None:
                    await store.update_job(
                        conn,
                        job.id,
                        {
                            "status": "aborted" if abort else "terminated",
                            "termination_reason": job_reason,
                            "finished_at": now,
                            "last_processed_at": now,
                        },
                        expect_status=("submitted",),
                        actor_id=actor,
                    )
                elif job.status not in store.FINISHED_JOB_STATUSES:
                    await store.update_job(conn, job.id, {"stop_requested": how})
    ctx.wakeups.wake("jobs", "runs", "scheduler")


async def delete(ctx: Context, project: ProjectRec, names: list[str], user: UserRec | None = None) -> None:
    async with ctx.db.write() as conn:
        found = []
        for name in names:
            run = await store.get_run(conn, project.id, run_name=name)
            if run is None:
                raise ResourceNotExists(f"Run {name} not found")
            found.append(run)
        active = [r.run_name for r in found if r.status not in store.FINISHED_RUN_STATUSES]
        if active:
            raise ServiceError(
                f"Cannot delete active run{'s' if len(active) > 1 else ''} {', '.join(active)}: stop "
                f"{'them' if len(active) > 1 else 'it'} first"
            )
        await store.mark_runs_deleted(conn, [r.id for r in found])
        for r in found:
            await events.emit(
                conn, "Run deleted", user.id if user else None, [run_target(project.id, r.id, r.run_name)]
            )
