"""Which fleets a job could ever run in, and the message it fails with at once when none: its project's
fleets and those exported to it, narrowed by ``fleets``, by ``instances`` selectors and by what it asks for
(``screen_gang``); ``refusal`` is the verdict ``runs/get_plan`` shows. What runs now is ``schedule``'s to decide
among the fleets screened here.

Pure; imports the domain and the scheduler's types, views and memo.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from corral.domain.resources import InstanceResources, Requirements, match_requirements
from corral.domain.selectors import FleetRef, InstanceIdentity, Selector, matches
from corral.scheduler.blocks import GPU_JOBS_ONLY, blocks_needed, takes_job, total_blocks_for
from corral.scheduler.fleet_view import WIRE_NAMES
from corral.scheduler.pass_memo import PassMemo
from corral.scheduler.types import FleetSlot, InstanceSlot, QueuedJob, Snapshot

# Starts as dstack's does: its clients (and dstack's server) show such a job's status as "no fleets".
NO_FLEETS_MESSAGE = (
    "No matching fleet found: no fleet of this project can run this job (there is none, or none has the "
    "resources it asks for). Apply a fleet first, e.g. `corral apply -f examples/fleet.dstack.yml` (one on "
    "this machine), then submit the run again; `corral fleet -v` shows the fleets there are."
)


SPECIFIED_FLEETS_MESSAGE = "Failed to use specified fleets"


_USABLE_STATUSES = frozenset({"pending", "provisioning", "idle", "busy"})


def _fleet_ref(text: str) -> FleetRef:
    project, _, name = text.rpartition("/")
    return FleetRef(name, project or None)


def candidate_fleets(job: QueuedJob, fleets: Iterable[FleetSlot], memo: PassMemo) -> list[FleetSlot]:
    """The job's project's fleets and those exported to it, narrowed by the ``fleets`` option."""

    def compute() -> list[FleetSlot]:
        visible = [f for f in fleets if f.project_id == job.project_id or job.project_id in f.importer_project_ids]
        visible = [memo.view(job, f) for f in visible]
        if job.fleet_names is None:
            return visible
        refs = [_fleet_ref(n) for n in job.fleet_names]
        return [f for f in visible if any(r.matches(f.name, f.project_name, job.project_name) for r in refs)]

    return memo.candidates(job, compute)


def _apply_selectors(job: QueuedJob, fleets: list[FleetSlot]) -> tuple[list[FleetSlot], list[Selector]]:
    """Fleets reduced to the instances the ``instances`` option allows (and no offers: nothing new is
    ever provisioned for such a job), and the selectors that match no instance at all."""
    assert job.selectors is not None
    unmatched: list[Selector] = []
    allowed: set[str] = set()
    for sel in job.selectors:
        hits = {
            i.id
            for f in fleets
            for i in f.instances
            if i.status != "terminated"
            and matches(
                sel, InstanceIdentity(i.name, i.instance_num, f.name, f.project_name, i.addresses), job.project_name
            )
        }
        if not hits:
            unmatched.append(sel)
        allowed |= hits
    reduced = []
    for f in fleets:
        insts = f.instances if not job.selectors else tuple(i for i in f.instances if i.id in allowed)
        reduced.append(replace(f, instances=insts, offers=()))
    return reduced, unmatched


def instance_usable(inst: InstanceSlot) -> bool:
    return inst.status in _USABLE_STATUSES and not inst.unreachable and inst.resources is not None


def _never_fits_reason(fleet: FleetSlot, job: QueuedJob, reuse_only: bool) -> str | None:  # noqa: C901
    """Why ``job`` can never run in ``fleet`` (None if it could, once capacity frees)."""
    if job.multinode and fleet.placement != "cluster":
        return "multi-node tasks need a fleet with `placement: cluster`"
    if fleet.nodes_max is not None and fleet.nodes_max < job.nodes:
        return f"the run needs {job.nodes} nodes but nodes.max is {fleet.nodes_max}"
    reasons: list[str] = []
    for inst in fleet.instances:
        if inst.status not in _USABLE_STATUSES:
            continue
        if inst.resources is None:  # a host being set up (SSH fleets): what it has is not known yet
            return None
        if blocks_needed(job.requirements, inst.resources, inst.total_blocks) is not None:
            return None
        reasons.append(_why(job.requirements, inst.resources))
    if not reuse_only and (fleet.nodes_max is None or fleet.nodes_max > 0):
        offer_reasons = []
        for offer in fleet.offers:
            if not takes_job(job.requirements, offer):
                offer_reasons.append(GPU_JOBS_ONLY)
                continue
            total = total_blocks_for(fleet.blocks, offer.resources)
            if blocks_needed(job.requirements, offer.resources, total) is not None:
                return None
            offer_reasons.append(_why(job.requirements, offer.resources))
        # offers of a host carved into blocks come smallest first: the largest one says what is missing
        reasons.extend(reversed(offer_reasons))
    if reuse_only and not fleet.instances:
        return "it has no instances and `creation_policy: reuse` allows no new ones"
    if not reasons and fleet.priced_out is not None and job.max_price is not None:
        return f"its offers cost ${fleet.priced_out:g}/h or more, above the run's `max_price` (${job.max_price:g}/h)"
    if not reasons and fleet.narrowed_by:
        names = " / ".join(f"`{n}`" for n in fleet.narrowed_by)
        where = f" (the volumes: {job.volumes_where})" if "volumes" in fleet.narrowed_by and job.volumes_where else ""
        return f"the run's {names} leave(s) none of its instances or offers{where}"
    if not reasons and fleet.unlisted_backends:
        names = ", ".join(sorted({WIRE_NAMES.get(b, b) for b in fleet.unlisted_backends if b}))
        return f"the run's `backends` does not list its backends ({names})"
    if not reasons and fleet.withheld_backends:
        names = ", ".join(sorted(fleet.withheld_backends))
        return (
            f"its {names} instances run jobs without a sandbox on this server, so only global admins' runs may"
            " use them (set an `image` to run in a container)"
        )
    if not reasons:
        return "it has no instances and cannot create any"
    return reasons[0]


def _why(req: Requirements, res: InstanceResources) -> str:
    """Why an instance (or offer) cannot hold the job: asked only where even all its blocks together (the whole
    of it: ``blocks.share`` of every block is the instance) fail the requirements, so there is a reason."""
    return match_requirements(req, res) or "does not match"


def _unknown_fleets_message(job: QueuedJob, fleets: Iterable[FleetSlot]) -> str:
    visible = sorted(
        f.name for f in fleets if f.project_id == job.project_id or job.project_id in f.importer_project_ids
    )
    names = ", ".join(f"'{n}'" for n in job.fleet_names or ())
    where = f" in project '{job.project_name}'" if job.project_name else ""
    known = f"its fleets: {', '.join(visible)}" if visible else "it has no fleets"
    return f"{SPECIFIED_FLEETS_MESSAGE}: no fleet named {names}{where} ({known})"


def screen_gang(
    head: QueuedJob, snapshot: Snapshot, memo: PassMemo, gang: Sequence[QueuedJob] = ()
) -> tuple[list[FleetSlot], bool] | str:
    """The fleets the gang headed by ``head`` could ever run in (and whether it may only reuse existing
    instances), or the message it fails with at once: no fleet, unknown ``fleets``, a selector matching
    nothing, or nothing it could ever fit in. The other jobs of a gang whose nodes differ (node
    ``groups``) must each fit the fleet too."""
    candidates = candidate_fleets(head, snapshot.fleets, memo)
    if not candidates and head.selectors:
        return "Failed to use specified instances: no instance matches " + "; ".join(str(x) for x in head.selectors)
    if not candidates:
        if head.fleet_names is not None:
            return _unknown_fleets_message(head, snapshot.fleets)
        return NO_FLEETS_MESSAGE
    reuse_only = head.creation_policy == "reuse" or head.selectors is not None
    if head.selectors is not None:
        candidates, unmatched = _apply_selectors(head, candidates)
        if unmatched:
            return "Failed to use specified instances: no instance matches " + "; ".join(str(u) for u in unmatched)
    feasible: list[FleetSlot] = []
    reasons: list[str] = []
    others = distinct_requirements(head, gang)

    def never_fits(fleet: FleetSlot, job: QueuedJob) -> str | None:
        return memo.never_fits(fleet, job, reuse_only, lambda: _never_fits_reason(fleet, job, reuse_only))

    for fleet in candidates:
        reason = never_fits(fleet, head)
        for job in others:
            if reason is None and (why := never_fits(fleet, job)) is not None:
                reason = f"job {job.job_num}: {why}"
        if reason is None:
            feasible.append(fleet)
        else:
            reasons.append(f"fleet '{fleet.name}': {reason}")
    if not feasible:
        return "No fleet can ever run this job: " + "; ".join(reasons)
    return feasible, reuse_only


def distinct_requirements(head: QueuedJob, gang: Sequence[QueuedJob]) -> list[QueuedJob]:
    """One job of the gang for each requirement other than the head's (in job order)."""
    seen = [head.requirements]
    out = []
    for job in gang:
        if job.requirements not in seen:
            seen.append(job.requirements)
            out.append(job)
    return out


def screen(job: QueuedJob, snapshot: Snapshot) -> tuple[list[FleetSlot], bool] | str:
    """The fleets a run whose first job is ``job`` could ever run in and whether it may only reuse existing
    instances (what ``schedule`` chooses among), or the message it fails with at once."""
    return screen_gang(job, snapshot, PassMemo())


def refusal(job: QueuedJob, snapshot: Snapshot) -> str | None:
    """Why a run whose first job is ``job`` would fail at once if submitted now (what ``schedule`` fails it
    with), or None if it can run now or once capacity frees. ``runs/get_plan`` shows it before ``apply``."""
    screened = screen_gang(job, snapshot, PassMemo())
    return screened if isinstance(screened, str) else None
