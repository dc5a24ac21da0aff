"""Response bodies of the REST API for runs, their logs and metrics, and GPUs: dstack 0.22.5's shapes, as
pydantic models for the OpenAPI document (see :mod:`corral.schemas.responses`, whose base model they share
and whose :func:`~corral.schemas.responses.model` finds them by name). Imports: ``domain`` and pydantic.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Optional
from uuid import UUID

from pydantic import Field, RootModel

from corral.domain.statuses import JobStatus, JobTerminationReason, RunStatus, RunTerminationReason
from corral.schemas.responses import AnyObject, Offer, Out

# --- runs and logs --------------------------------------------------------------------------------------


class JobSubmission(Out):
    id: UUID
    submission_num: int
    deployment_num: int
    submitted_at: Optional[datetime]
    last_processed_at: Optional[datetime]
    finished_at: Optional[datetime]
    status: JobStatus
    status_message: Optional[str]
    termination_reason: Optional[JobTerminationReason]
    termination_reason_message: Optional[str]
    exit_status: Optional[int]
    job_provisioning_data: Optional[AnyObject]
    job_runtime_data: Optional[AnyObject]


class Job(Out):
    job_spec: AnyObject
    job_submissions: list[JobSubmission]
    job_connection_info: Optional[AnyObject]


class RunFleet(Out):
    id: UUID
    name: str


class Run(Out):
    id: UUID
    project_name: str
    user: str
    fleet: Optional[RunFleet]
    submitted_at: Optional[datetime]
    last_processed_at: Optional[datetime]
    status: RunStatus
    status_message: Optional[str]
    termination_reason: Optional[RunTerminationReason]
    run_spec: AnyObject
    jobs: list[Job]
    latest_job_submission: Optional[JobSubmission]
    cost: float
    service: Optional[AnyObject]
    deployment_num: int
    deleted: Optional[bool]


class RunList(RootModel[list[Run]]):
    pass


class JobPlan(Out):
    job_spec: AnyObject
    offers: list[Offer]
    total_offers: int
    max_price: Optional[float]


class RunPlan(Out):
    project_name: str
    user: str
    run_spec: AnyObject
    effective_run_spec: AnyObject
    job_plans: list[JobPlan]
    current_resource: Optional[Run]
    action: Literal["create", "update"]


class LogEvent(Out):
    timestamp: datetime
    log_source: Literal["stdout", "stderr"]
    message: str = Field(description="base64 of the bytes the job wrote")


class JobLogs(Out):
    logs: list[LogEvent]
    external_url: Optional[str]
    next_token: Optional[str]


class PrometheusText(RootModel[str]):
    """``GET /metrics``: the Prometheus text exposition format (``text/plain; version=0.0.4``)."""


class Metric(Out):
    name: str
    timestamps: list[datetime]
    values: list[Any]


class JobMetrics(Out):
    metrics: list[Metric]


class GpuGroup(Out):
    name: str
    memory_mib: int
    vendor: Optional[str]
    availability: list[str]
    spot: list[str]
    count: AnyObject
    price: AnyObject
    backends: list[str]
    regions: list[Optional[str]]


class GpuList(Out):
    gpus: list[GpuGroup]
