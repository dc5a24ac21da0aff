"""The scheduler's verdict on a run before it is submitted, for ``runs/get_plan``.

The plan and the queue must agree: a run that ``schedule`` would fail at once (no fleet, unknown
``fleets``, a multi-node task without a cluster fleet, requirements no fleet can ever meet, ``instances``
matching nothing) gets no offers in its plan and this message, computed by the same pure code
(``scheduler.screening.screen``) from the fleets as the scheduling worker would see them. The same view
gives the offers of the fleets other projects export to the run's project (``scheduler.plan_offers``):
a project with no backends of its own that imports a fleet sees that fleet's offers, as apply uses it.
Capacity reservations (the run's ``reservation`` or its fleets') are looked up first, with no transaction
open, so that the plan's offers are narrowed as placement narrows them (``reserved``).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.context import Context
from corral.domain.records import ProjectRec

if TYPE_CHECKING:
    from corral.config.run_spec import RunSpec
    from corral.scheduler.types import FleetSlot, Offer, QueuedJob
    from corral.workers.snapshot_builder import SnapshotBuilder

#: Each server's builder of the plans' snapshots, by the server's context: one per server, for what it keeps
#: (each fleet's parsed requirements and matched offers, where EC2 said the capacity reservations are).
_BUILDERS: weakref.WeakKeyDictionary[Context, SnapshotBuilder] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class PlanScreen:
    """What the scheduler would make of a run now: ``error``, the message it would fail with at once (None:
    it can run now, or waits for capacity); ``imported_offers``, ``(offer, availability)`` of the fleets
    other projects export to the run's project that it could run in; ``fleets``, every fleet it could
    run in (its own and imported)."""

    error: str | None
    imported_offers: tuple[tuple[Offer, str], ...]
    fleets: tuple[FleetSlot, ...]
    #: When a capacity reservation (the run's or a fleet's) narrows the new instances, the offers the run's
    #: fleets may launch for it (as each fleet is seen by the run); None: nothing narrowed.
    reserved: frozenset[Offer] | None = None


async def plan_screen(ctx: Context, project: ProjectRec, spec: RunSpec, job_spec: dict[str, Any]) -> PlanScreen:
    """The scheduler's view of the run whose first job is ``job_spec``, from the fleets as they are now."""
    from corral.scheduler.plan_offers import fleet_offers
    from corral.scheduler.screening import screen
    from corral.scheduler.types import Snapshot
    from corral.services.volumes import check_run
    from corral.workers.queued_jobs import queued_job
    from corral.workers.snapshot_builder import SnapshotBuilder

    # a run's network volumes must exist and be active (dstack: "Volume NAME not found"); placement follows them
    volumes = await check_run(ctx, project.id, spec.configuration)
    head = queued_job(
        spec,
        job_spec,
        id="plan",
        run_id="plan",
        project_id=project.id,
        project_name=project.name,
        run_name=spec.run_name or "run",
        job_num=0,
        priority=spec.priority,
        submitted_at=time.time(),
        max_queue_wait=None,
        volume_places={(project.id, v.name): v for v in volumes},
    )
    planner = _BUILDERS.get(ctx)
    if planner is None:
        planner = _BUILDERS[ctx] = SnapshotBuilder(ctx.computes)
    from corral.store import exports as export_store

    async with ctx.db.read() as conn:
        # the project's own fleets and those other projects export to it: all the run may use
        owners = {project.id, *(e.project_id for e in await export_store.exports_imported_by(conn, project.id))}
        loaded, facts = await planner.load_for(conn, sorted(owners), importer=project.id)
    await planner.reserved.resolve(loaded)  # EC2, with no transaction open
    (head,) = await planner.reserved.located([head])
    snapshot = Snapshot(fleets=tuple(planner.fleet_slot(f, facts) for f in loaded), queue=(head,))
    screened = screen(head, snapshot)
    if isinstance(screened, str):  # the listing (``for_offers_only``) still shows what the reservation allows
        named = [f for f in snapshot.fleets if head.fleet_names is None or f.name in head.fleet_names]
        return PlanScreen(screened, (), (), _reserved(head, named, head.reservation is not None))
    fleets, reuse_only = screened
    imported = [f for f in fleets if f.project_id != project.id]
    reserved = _reserved(head, fleets, head.reservation is not None or any(f.reservation for f in fleets))
    return PlanScreen(None, tuple(fleet_offers(head, imported, reuse_only)), tuple(fleets), reserved)


def _reserved(head: QueuedJob, fleets: Sequence[FleetSlot], narrowed: bool) -> frozenset[Offer] | None:
    """The new-instance offers of ``fleets`` as ``head`` sees them, where a reservation narrows them."""
    from corral.scheduler.fleet_view import as_job_sees_it

    return frozenset(o for f in fleets for o in as_job_sees_it(head, f).offers) if narrowed else None


async def plan_verdict(ctx: Context, project: ProjectRec, spec: RunSpec, job_spec: dict[str, Any]) -> str | None:
    """What the scheduler would fail the run with at once (no fleet, unknown ``fleets``, a multi-node task
    without a cluster fleet, requirements no fleet can ever meet, ...), from the fleets as they are now."""
    return (await plan_screen(ctx, project, spec, job_spec)).error
