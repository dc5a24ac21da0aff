"""The scheduler's data types: a snapshot of fleets and instances, the queue, and the plan.

These are the only scheduler names ``corral.store`` imports: the store builds a ``Snapshot`` and
``plan_apply`` commits a ``Plan``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.domain.quotas import Limits
from corral.domain.resources import InstanceResources, Requirements
from corral.domain.selectors import Selector


@dataclass(frozen=True)
class Offer:
    """What a new instance of a fleet would be."""

    backend: str
    instance_type: str
    region: str
    price: float
    resources: InstanceResources
    #: Blocks of a shared host this instance would be carved out of (the ``local`` backend: this machine,
    #: split as an SSH host is split into blocks); 0 = it takes nothing from a host pool.
    host_blocks: int = 0
    #: ... of how many blocks that host has (an instance with fewer is a share of the host, not all of it).
    host_total_blocks: int = 0
    #: The availability zone it is (or must be) in; "" where the backend picks one (a catalogue offer).
    zone: str = ""
    #: A new instance of it takes only jobs that ask for GPUs (a Slurm GPU partition's node: dstack sends runs
    #: without GPUs to the CPU partitions).
    gpu_jobs_only: bool = False


@dataclass(frozen=True)
class InstanceSlot:
    id: str
    fleet_id: str
    name: str
    instance_num: int
    status: str
    resources: InstanceResources | None
    total_blocks: int
    busy_blocks: int
    unreachable: bool = False
    price: float = 0.0
    hostname: str | None = None
    #: Hostnames and IPs an ``instances`` hostname selector may name.
    addresses: tuple[str, ...] = ()
    #: Its backend, and the blocks of that backend's host it was carved out of (0: none).
    backend: str = ""
    host_blocks: int = 0
    #: What the instance is (its stored offer), for a plan's offers; None when not known yet.
    offer: Offer | None = None


@dataclass(frozen=True)
class FleetSlot:
    id: str
    project_id: str
    name: str
    nodes_min: int
    nodes_max: int | None
    blocks: int | None  # None = "auto"
    placement: str
    offers: tuple[Offer, ...]
    #: Every instance that counts against ``nodes.max``: all but terminated ones.
    instances: tuple[InstanceSlot, ...]
    backend_limit_key: str | None = None
    project_name: str = ""
    #: Projects this fleet is exported to (they may run on it too).
    importer_project_ids: frozenset[str] = frozenset()
    #: Backends whose instances and offers were taken out of this view of the fleet, for a job barred from
    #: them (``QueuedJob.barred_backends``).
    withheld_backends: frozenset[str] = frozenset()
    #: Backends whose instances and offers the job's own ``backends`` option left out of this view.
    unlisted_backends: frozenset[str] = frozenset()
    #: The lowest price of the offers the job's ``max_price`` left out of this view (None: none left out).
    priced_out: float | None = None
    #: The job's options (``regions``, ``instance_types``, ``spot_policy``) that left instances or offers
    #: out of this view.
    narrowed_by: tuple[str, ...] = ()
    #: The EC2 capacity reservation the fleet's new instances launch into (its ``reservation``), or None.
    reservation: str | None = None


@dataclass(frozen=True)
class WaitPolicy:
    """How long a job may wait for capacity (from its ``retry``; see docs/dev/architecture.md, queue semantics)."""

    may_wait: bool
    deadline: float | None = None


@dataclass(frozen=True)
class QueuedJob:
    id: str
    run_id: str
    project_id: str
    run_name: str
    job_num: int
    priority: int
    submitted_at: float
    requirements: Requirements
    fleet_names: tuple[str, ...] | None
    creation_policy: str
    wait: WaitPolicy
    nodes: int = 1
    multinode: bool = False
    status_message: str | None = None
    project_name: str = ""
    #: The ``instances`` allow-list (None = no restriction; empty = existing instances only).
    selectors: tuple[Selector, ...] | None = None
    #: Backends the job must not land on, whatever fleet it reaches them through (e.g. the local backend
    #: of a server without a job sandbox, for a run whose submitter is not a global admin).
    barred_backends: frozenset[str] = frozenset()
    #: The run's ``backends`` option as corral's backend names (None = any backend).
    backends: frozenset[str] | None = None
    #: The run's ``max_price`` (per hour): offers that cost more are not provisioned for it.
    max_price: float | None = None
    #: The run's ``regions`` and ``instance_types`` (None: any) and ``spot_policy`` (True: spot only,
    #: False: on-demand only, None: either), as ``offer_filters`` applies them.
    regions: frozenset[str] | None = None
    instance_types: frozenset[str] | None = None
    spot: bool | None = None
    #: The availability zones its network volumes are in (None: no volumes, any zone).
    zones: frozenset[str] | None = None
    #: Its network volumes and where each is (``data (us-east-1 us-east-1b), ...``), for its messages.
    volumes_where: str = ""
    #: The job's replica: each replica of a service is a gang of its own (a task has replica 0 only).
    replica_num: int = 0
    #: The run's own ``reservation`` (an EC2 capacity reservation its new instances launch into), or None,
    #: and where it is: ``(region, instance type)`` of the aws offers it can launch (None: not known yet).
    reservation: str | None = None
    reserved_places: frozenset[tuple[str, str]] | None = None


@dataclass(frozen=True)
class ProjectQuota:
    """A project's ``quota.max`` and what its provisioning, pulling, running and stopping jobs hold now
    (``corral.domain.quotas`` usage), with the instances they are on (an ``instances`` limit counts those)."""

    max: Limits
    used: Mapping[str, float] = field(default_factory=dict)
    instance_ids: frozenset[str] = frozenset()
    project_name: str = ""


@dataclass(frozen=True)
class FairShare:
    """A project's fair-share weight, nominal quota and what it holds now (``scheduler.fair_share``)."""

    weight: float = 1.0
    nominal: Limits = field(default_factory=Limits)
    used: Mapping[str, float] = field(default_factory=dict)
    #: The instances its holding jobs are on (``used["instances"]`` counts them): a placement on another
    #: one adds an instance to what it holds, one beside its own jobs does not.
    instance_ids: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Hold:
    """``blocks`` of instance ``instance_id`` that a preemption freed, kept for run ``run_id`` (its preemptor)
    until ``until``, while that run waits (``scheduler.holds``)."""

    instance_id: str
    run_id: str
    blocks: int
    until: float


@dataclass(frozen=True)
class Snapshot:
    fleets: tuple[FleetSlot, ...]
    queue: tuple[QueuedJob, ...]
    #: Backend-wide caps, e.g. the number of local instances: key -> (in use, maximum).
    backend_limits: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Hosts that new instances are carved out of, by backend: backend -> (blocks in use, blocks in all).
    #: An offer with ``host_blocks`` is reserved only while that many blocks of its backend's host are free.
    host_pools: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: A job that has waited this long holds the fleets it could use: nothing queued behind it takes
    #: capacity there until it fits (no starvation of large jobs). None disables holding.
    hold_after: float | None = None
    #: Projects with a ``quota.max``, by id: a gang that would take its project above it waits.
    quotas: Mapping[str, ProjectQuota] = field(default_factory=dict)
    #: Fair sharing between projects (by id; a project not named has weight 1, no nominal, holds nothing):
    #: empty, gangs go in queue order.
    shares: Mapping[str, FairShare] = field(default_factory=dict)
    #: Capacity freed by preemptions, kept for the runs that preempted (no other gang takes it meanwhile).
    holds: tuple[Hold, ...] = ()


@dataclass(frozen=True)
class Assign:
    job_id: str
    instance_id: str
    blocks: int


@dataclass(frozen=True)
class Reserve:
    """Reserve a new instance in ``fleet_id`` (for ``job_id``, or for ``nodes.min`` upkeep when None)."""

    fleet_id: str
    offer: Offer
    blocks: int
    total_blocks: int
    job_id: str | None = None
    #: Offers the backend may launch instead when ``offer`` cannot be (``scheduler.fallbacks``).
    fallbacks: tuple[Offer, ...] = ()


@dataclass(frozen=True)
class Reclaim:
    """Terminate an idle instance so that the blocks of the host it was carved out of can be carved anew
    for a waiting job (the local machine: idle instances must not hold it for ever)."""

    instance_id: str
    message: str


@dataclass(frozen=True)
class Fail:
    job_id: str
    message: str


@dataclass(frozen=True)
class Wait:
    job_id: str
    message: str


Decision = Assign | Reserve | Fail | Wait | Reclaim


@dataclass(frozen=True)
class Gang:
    """Decisions that commit together or not at all (the jobs of one run placed in one pass)."""

    run_id: str
    decisions: tuple[Decision, ...]
    #: The run's project (its ``quota.max`` is checked again at the commit point); "" for upkeep.
    project_id: str = ""


@dataclass(frozen=True)
class Plan:
    gangs: tuple[Gang, ...]

    def is_empty(self) -> bool:
        return not self.gangs
