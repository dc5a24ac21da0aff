"""Response bodies of the REST API: dstack 0.22.5's shapes, as pydantic models, for the OpenAPI document.

The services build their answers as plain dicts (``corral.services.serialize`` and the services' own
builders: fast, and orjson writes them); each route names the model of its answer here (``response=`` in
:mod:`corral.api.routing`), and the document's response schemas are generated from these models. They
cannot drift unseen: the API tests check real answers against the document (``tests/api/test_openapi.py``
and the fuzzing run, ``tests/api/test_fuzz.py``).

Every model admits extra fields (corral's ``corral_*`` additions ride along, as dstack's client ignores
them); the fields listed are the ones corral always sends. Configurations, job specs and provisioning
data are dstack's large nested documents and are given as objects. Runs, logs, metrics and GPUs have a
module of their own (:mod:`corral.schemas.responses_runs`), as do volumes (``responses_volumes``), gateways
(``responses_gateways``) and the scheduling policies and queue (``responses_scheduling``); :func:`model`
finds a route's model by name in any of them. Imports: ``domain`` and pydantic only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Optional, Union
from uuid import UUID

from pydantic import BaseModel, ConfigDict, RootModel

from corral.domain.statuses import FleetStatus, InstanceStatus, InstanceTerminationReason

AnyObject = dict[str, Any]


class Out(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)


# --- errors: dstack's bodies, as corral answers them ----------------------------------------------------


class ErrorDetail(Out):
    msg: str
    code: Optional[str] = None


class BadRequest(Out):
    """400 (a service refusal, an incompatible client version) and 413 (a body over its size limit)."""

    detail: list[ErrorDetail]


class NotAuthenticated(Out):
    """401: no ``Authorization: Bearer`` header."""

    detail: Literal["Not authenticated"]


class DetailError(Out):
    """403 ``Invalid token`` / ``Access denied`` (the route's permission), 404 ``Not found`` (no such project)."""

    detail: ErrorDetail


class Forbidden(RootModel[Union[DetailError, ErrorDetail]]):
    """403: the route's permission (``{"detail": {...}}``) or a service's own check (the bare
    ``{"msg", "code"}`` of dstack's ``ForbiddenError``)."""


class ValidationIssue(Out):
    loc: list[Union[str, int]]
    msg: str
    type: str


class ValidationFailed(Out):
    """422: the body (or a query parameter) does not validate; each error names its field in ``loc``."""

    detail: list[ValidationIssue]


# --- server, users, projects ----------------------------------------------------------------------------


class Healthcheck(Out):
    status: Literal["running"]


class ServerInfo(Out):
    server_version: Optional[str]


class BackendTypes(RootModel[list[str]]):
    pass


class UserPermissions(Out):
    can_create_projects: bool


class User(Out):
    id: UUID
    username: str
    created_at: Optional[datetime]
    global_role: Literal["admin", "user"]
    email: Optional[str]
    active: bool
    permissions: UserPermissions
    ssh_public_key: Optional[str]


class UserTokenCreds(Out):
    token: str


class UserWithCreds(User):
    creds: UserTokenCreds
    ssh_private_key: Optional[str]


class UsersInfoList(Out):
    total_count: int
    users: list[User]


class UsersList(RootModel[Union[list[User], UsersInfoList]]):
    """A list, or ``{total_count, users}`` when ``return_total_count`` is set."""


class PublicKeyInfo(Out):
    id: UUID
    added_at: Optional[datetime]
    name: Optional[str]
    type: str
    fingerprint: str


class PublicKeyList(RootModel[list[PublicKeyInfo]]):
    pass


class BackendInfo(Out):
    name: str
    config: AnyObject


class MemberPermissions(Out):
    can_manage_ssh_fleets: bool
    can_manage_secrets: bool


class Member(Out):
    user: User
    project_role: Literal["admin", "manager", "user"]
    permissions: MemberPermissions


class Project(Out):
    project_id: UUID
    project_name: str
    owner: User
    created_at: Optional[datetime]
    backends: list[BackendInfo]
    members: list[Member]
    is_public: bool
    templates_repo: Optional[str]


class ProjectList(RootModel[list[Project]]):
    pass


class ProjectsInfoList(Out):
    total_count: int
    projects: list[Project]


class ProjectsList(RootModel[Union[list[Project], ProjectsInfoList]]):
    """A list, or ``{total_count, projects}`` when ``return_total_count`` is set."""


class OAuthProviderInfo(Out):
    name: str
    enabled: bool


class OAuthProviders(RootModel[list[OAuthProviderInfo]]):
    """Always empty: corral, like dstack's open-source server, has no OAuth2 providers."""


class NextRedirect(Out):
    redirect_url: Optional[str] = None


# --- instances and fleets -------------------------------------------------------------------------------


class Gpu(Out):
    name: str
    memory_mib: int
    vendor: Optional[str]


class Disk(Out):
    size_mib: int


class Resources(Out):
    cpus: int
    memory_mib: int
    gpus: list[Gpu]
    spot: bool
    disk: Disk
    cpu_arch: Optional[str]
    description: str


class InstanceType(Out):
    name: str
    resources: Resources


class Instance(Out):
    id: UUID
    project_name: str
    backend: Optional[str]
    instance_type: Optional[InstanceType]
    name: str
    fleet_id: Optional[UUID]
    fleet_name: Optional[str]
    instance_num: int
    job_name: Optional[str]
    hostname: Optional[str]
    status: InstanceStatus
    unreachable: bool
    health_status: Literal["healthy", "warning", "failure"]
    termination_reason: Optional[InstanceTerminationReason]
    termination_reason_message: Optional[str]
    created: Optional[datetime]
    finished_at: Optional[datetime]
    region: Optional[str]
    availability_zone: Optional[str]
    price: Optional[float]
    total_blocks: Optional[int]
    busy_blocks: int


class InstanceList(RootModel[list[Instance]]):
    pass


class HealthEvent(Out):
    timestamp: datetime
    status: Literal["healthy", "warning", "failure"]
    message: str


class HealthCheck(Out):
    collected_at: datetime
    status: Literal["healthy", "warning", "failure"]
    events: list[HealthEvent]


class InstanceHealthChecks(Out):
    health_checks: list[HealthCheck]


class Offer(Out):
    """dstack's ``InstanceOfferWithAvailability``."""

    backend: str
    instance: Optional[InstanceType]
    region: Optional[str]
    price: float
    availability: Literal["unknown", "available", "not_available", "no_quota", "no_balance", "idle", "busy"]
    blocks: int
    total_blocks: int


class Fleet(Out):
    id: UUID
    name: str
    project_name: str
    spec: AnyObject
    created_at: Optional[datetime]
    status: FleetStatus
    status_message: Optional[str]
    instances: list[Instance]


class FleetList(RootModel[list[Fleet]]):
    pass


class FleetPlan(Out):
    project_name: str
    user: str
    spec: AnyObject
    effective_spec: AnyObject
    current_resource: Optional[Fleet]
    offers: list[Offer]
    total_offers: int
    max_offer_price: Optional[float]
    action: Literal["create", "update"]


# --- exports, repos, files, and the always-empty lists --------------------------------------------------


class NamedRef(Out):
    id: UUID
    name: str


class ExportImporter(Out):
    id: UUID
    project_name: str


class Export(Out):
    id: UUID
    name: str
    is_global: bool
    imports: list[ExportImporter]
    exported_fleets: list[NamedRef]
    exported_gateways: list[NamedRef]


class ExportList(RootModel[list[Export]]):
    pass


class ImportedExport(Out):
    id: UUID
    name: str
    project_name: str
    exported_fleets: list[NamedRef]
    exported_gateways: list[NamedRef]


class Import(Out):
    id: UUID
    export: ImportedExport


class ImportList(RootModel[list[Import]]):
    pass


class RepoHead(Out):
    repo_id: str
    repo_info: AnyObject


class RepoHeadList(RootModel[list[RepoHead]]):
    pass


class RepoHeadWithCreds(RepoHead):
    repo_creds: Optional[AnyObject]


class FileArchive(Out):
    id: UUID
    hash: str


class Secret(Out):
    """A project's secret; ``value`` only where it is asked for (``secrets/get``, the one just set)."""

    id: UUID
    name: str
    value: Optional[str]


class SecretList(RootModel[list[Secret]]):
    """The project's secrets, without their values."""


class EventTarget(Out):
    type: str
    project_id: Optional[UUID]
    project_name: Optional[str]
    is_project_deleted: Optional[bool]
    id: UUID
    name: str


class Event(Out):
    """dstack's ``Event``: what happened, when, by whom, to which targets."""

    id: UUID
    message: str
    recorded_at: datetime
    actor_user_id: Optional[UUID]
    actor_user: Optional[str]
    is_actor_user_deleted: Optional[bool]
    targets: list[EventTarget]


class EventList(RootModel[list[Event]]):
    """A page of events, newest first unless ``ascending``."""


class EmptyList(RootModel[list[AnyObject]]):
    """Always empty: corral has none of these yet (templates)."""


class Null(RootModel[None]):
    """``null``: the action was done."""


class BackendConfig(Out):
    """A backend's configuration as answered: its credentials masked."""

    type: str


class BackendInfoYAML(Out):
    name: str
    config_yaml: str


#: The modules beside this one that hold answer models: ``responses_runs`` and so on.
SIBLINGS = ("runs", "volumes", "scheduling", "gateways")


def model(name: str) -> type[BaseModel]:
    """The answer model a route names (``response=``), from this module or one of its siblings
    (:data:`SIBLINGS`)."""
    import importlib

    found = globals().get(name)
    for sibling in SIBLINGS:
        found = found or getattr(importlib.import_module(f"{__name__}_{sibling}"), name, None)
    if not (isinstance(found, type) and issubclass(found, BaseModel)):
        raise KeyError(f"no response model named {name!r}")
    return found


def is_answer(m: type[BaseModel]) -> bool:
    """Whether ``m`` is one of the answer models (serialised by corral) rather than a request body."""
    return m.__module__ in (__name__, *(f"{__name__}_{s}" for s in SIBLINGS))
