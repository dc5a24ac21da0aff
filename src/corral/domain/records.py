"""Frozen records of the persistent entities, as the store hands them to the rest of corral.

Documents (specs, provisioning data) stay as JSON-compatible dicts: their schema belongs to the
configuration and wire models, not to the domain. Statuses are the enums of ``domain/statuses.py``, which
compare equal to (and print as) their string values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.domain.gateways import Publication
from corral.domain.statuses import FleetStatus, InstanceStatus, JobStatus, RunStatus


@dataclass(frozen=True)
class UserRec:
    id: str
    name: str
    #: As stored: sealed (``enc:v1:...``; in clear only in a row from before tokens were sealed). So is
    #: ``ssh_private_key``, here and in ``ProjectRec``: ``services/credentials.py`` opens them for an answer.
    token: str
    global_role: str
    email: str | None
    active: bool
    created_at: float
    ssh_private_key: str | None
    ssh_public_key: str | None


@dataclass(frozen=True)
class MemberRec:
    user: UserRec
    project_role: str


@dataclass(frozen=True)
class ProjectRec:
    id: str
    name: str
    owner: UserRec
    created_at: float
    is_public: bool
    backends: tuple[dict[str, Any], ...]
    ssh_public_key: str | None
    ssh_private_key: str | None


@dataclass(frozen=True)
class InstanceRec:
    id: str
    project_id: str
    project_name: str
    fleet_id: str | None
    fleet_name: str | None
    name: str
    instance_num: int
    status: InstanceStatus
    unreachable: bool
    backend: str
    region: str | None
    price: float | None
    offer: dict[str, Any] | None
    total_blocks: int | None
    busy_blocks: int
    hostname: str | None
    agent: dict[str, Any] | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    last_job_finished_at: float | None
    idle_duration: float | None
    termination_reason: str | None
    termination_reason_message: str | None
    job_name: str | None = None
    #: The gateway held on this instance (no job is placed on it meanwhile).
    gateway_id: str | None = None
    #: What its backend says of it while it lives (a Slurm allocation's node and time limit, why it pends).
    status_message: str | None = None


@dataclass(frozen=True)
class IdleClock:
    """What the instances worker reads of an idle instance to tell whether it has been idle too long: a few
    columns, no documents, since every idle instance is read on each of its passes."""

    id: str
    project_id: str
    fleet_id: str | None
    backend: str
    idle_duration: float | None
    #: When it last finished a job (None: never).
    last_job_finished_at: float | None
    #: Since when it has been idle: its last job's end, else its start, else its creation.
    since: float


@dataclass(frozen=True)
class InstanceQuery:
    """One ``instances/list`` request, resolved: the instances of ``project_ids`` (None: all) and, with
    ``include_imported``, of the fleets exported to them, of ``fleet_ids`` if given, only the idle and busy ones
    if ``only_active``, after the keyset ``after`` (``(created_at, id)`` of the previous page's last; its id may be
    None), at most ``limit``."""

    project_ids: Sequence[str] | None
    fleet_ids: Sequence[str] | None = None
    only_active: bool = False
    after: tuple[float, str | None] | None = None
    ascending: bool = False
    limit: int = 1000
    include_imported: bool = False


@dataclass(frozen=True)
class FleetRec:
    id: str
    project_id: str
    project_name: str
    name: str
    created_at: float
    status: FleetStatus
    status_message: str | None
    spec: dict[str, Any]
    deleted: bool
    instances: tuple[InstanceRec, ...] = ()


@dataclass(frozen=True)
class JobRec:
    id: str
    run_id: str
    project_id: str
    run_name: str
    job_num: int
    replica_num: int
    job_name: str
    submission_num: int
    deployment_num: int
    submitted_at: float
    last_processed_at: float
    finished_at: float | None
    status: JobStatus
    status_message: str | None
    termination_reason: str | None
    termination_reason_message: str | None
    exit_status: int | None
    job_spec: Mapping[str, Any]
    priority: int
    instance_id: str | None
    job_provisioning_data: dict[str, Any] | None
    job_runtime_data: dict[str, Any] | None
    stop_requested: str | None
    disconnected_at: float | None
    log_offset: int
    wait_deadline: float | None
    #: The job's blocks of its instance (1 until it is placed).
    blocks: int = 1
    #: When its SSH endpoint last saw a connection that counts (or when it started running).
    ssh_seen_at: float | None = None
    #: A service replica the proxy routes to now (None: not a service replica).
    ready: bool | None = None
    #: Its probes' streaks (``[{"success_streak", "failure_streak"}]``), as last recorded.
    probes: tuple[Mapping[str, int], ...] = ()
    #: The price ($/hour) of its instance when it was placed (0 on local and SSH hosts; None: not placed, or
    #: stored before prices were), and when it was placed: what its cost counts from (``domain/costs.py``).
    price: float | None = None
    placed_at: float | None = None


@dataclass(frozen=True)
class RunRec:
    id: str
    project_id: str
    project_name: str
    user_name: str
    run_name: str
    submitted_at: float
    last_processed_at: float
    status: RunStatus
    status_message: str | None
    termination_reason: str | None
    run_spec: Mapping[str, Any]
    priority: int
    fleet_id: str | None
    fleet_name: str | None
    deployment_num: int
    deleted: bool
    jobs: tuple[JobRec, ...] = ()
    #: ``schedule``: the trigger a pending run waits for (or the one that fired it); None: not scheduled.
    next_triggered_at: float | None = None
    #: The gateway a service is published on (None: the in-server proxy, or not a service).
    gateway: Publication | None = None


#: A stored log line's ``source``: 0 stdout and 1 stderr of the job, this one the agent's own lines about it
#: (dstack's runner log: ``logs/poll`` with ``diagnose``).
AGENT_LOG_SOURCE = 2


@dataclass(frozen=True)
class LogRec:
    id: int
    timestamp: float
    #: 0 stdout, 1 stderr, ``AGENT_LOG_SOURCE``.
    source: int
    message: bytes
