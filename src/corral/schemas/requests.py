"""Request bodies of the REST API, with dstack's field names and defaults. Unknown fields are 422s.

Configurations inside specs are kept as dicts here and validated by ``corral.config`` in the service,
which reports errors with their full path from the request body.

The models build on first use (``defer_build``), or all at once in :func:`warm_up` (called in a thread
right after the server starts), so that importing them costs start-up little.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Union
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from corral.domain.events import TARGET_TYPES


def _in_range(value: datetime) -> datetime:
    """A time the server can compute with: naive is UTC, and it must lie within years 1..9999 in UTC too
    (``0001-01-01T00:00:00+05:00`` is in year 0 in UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    try:
        value.astimezone(timezone.utc)
        value.timestamp()
    except (OverflowError, ValueError, OSError):
        raise ValueError("Datetime is out of range: it must lie between years 1 and 9999 in UTC") from None
    return value


#: A datetime of a request body (pagination keys, log windows): always timezone-aware and in range.
WireTime = Annotated[datetime, AfterValidator(_in_range)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class NoBody(BaseModel):
    """A route that reads no body (as in dstack): whatever is sent, or nothing, is ignored."""

    model_config = ConfigDict(extra="allow", defer_build=True, title="NoBody")


class UsernameBody(Body):
    username: str


class ListUsersBody(Body):
    return_total_count: bool = False
    name_pattern: str | None = None
    prev_created_at: WireTime | None = None
    prev_id: UUID | None = None
    limit: int = Field(2000, ge=0, le=2000)
    ascending: bool = False


class CreateUserBody(Body):
    username: str
    global_role: Literal["admin", "user"]
    email: str | None = None
    active: bool = True


class DeleteUsersBody(Body):
    users: list[str]


class ListProjectsBody(Body):
    include_not_joined: bool = True
    return_total_count: bool = False
    name_pattern: str | None = None
    prev_created_at: WireTime | None = None
    prev_id: UUID | None = None
    limit: int = Field(2000, ge=0, le=2000)
    ascending: bool = False


class CreateProjectBody(Body):
    project_name: str
    is_public: bool = False
    templates_repo: str | None = None


class UpdateProjectBody(Body):
    is_public: bool | None = None
    templates_repo: str | None = None
    reset_templates_repo: bool = False


class AddPublicKeyBody(Body):
    key: str
    name: str | None = None


class DeletePublicKeysBody(Body):
    ids: list[UUID]


class DeleteProjectsBody(Body):
    projects_names: list[str]


class MemberSetting(Body):
    username: str
    project_role: Literal["admin", "manager", "user"]


class SetMembersBody(Body):
    members: list[MemberSetting]


class RemoveMembersBody(Body):
    usernames: list[str]


class FleetSpecIn(Body):
    configuration: dict[str, Any]
    configuration_path: str | None = None
    profile: dict[str, Any]
    autocreated: bool = False


class FleetPlanBody(Body):
    spec: FleetSpecIn


class FleetPlanIn(Body):
    spec: FleetSpecIn
    current_resource: dict[str, Any] | None = None


class ApplyFleetBody(Body):
    plan: FleetPlanIn
    force: bool


class ListFleetsBody(Body):
    project_name: str | None = None
    only_active: bool = False
    include_imported: bool = False
    prev_created_at: WireTime | None = None
    prev_id: UUID | None = None
    limit: int = Field(100, ge=0, le=100)
    ascending: bool = False


class ProjectFleetsBody(Body):
    include_imported: bool = False


class GetByNameOrId(Body):
    name: str | None = None
    id: UUID | None = None


class NamesBody(Body):
    names: list[str]


class DeleteInstancesBody(Body):
    name: str
    instance_nums: list[int]


class ListInstancesBody(Body):
    project_names: list[str] | None = None
    fleet_ids: list[UUID] | None = None
    only_active: bool = False
    include_imported: bool = False
    prev_created_at: WireTime | None = None
    prev_id: UUID | None = None
    limit: int = Field(1000, ge=0, le=1000)
    ascending: bool = False


class RunSpecIn(Body):
    run_name: str | None = None
    repo_id: str | None = None
    repo_data: dict[str, Any] | None = None
    repo_code_hash: str | None = None
    repo_dir: str | None = None
    file_archives: list[dict[str, Any]] = []
    working_dir: str | None = None
    configuration_path: str | None = None
    configuration: dict[str, Any]
    profile: dict[str, Any] | None = None
    ssh_key_pub: str | None = None


class RunPlanBody(Body):
    run_spec: RunSpecIn
    max_offers: int | None = Field(None, ge=1, le=10000)
    reverse_offers: bool = False
    full_offers: bool = False
    unallocated_resources: bool = False
    for_offers_only: bool = False


class RunPlanIn(Body):
    run_spec: RunSpecIn
    current_resource: dict[str, Any] | None = None


class ApplyRunBody(Body):
    plan: RunPlanIn
    force: bool


class ListRunsBody(Body):
    project_name: str | None = None
    repo_id: str | None = None
    username: str | None = None
    only_active: bool = False
    include_jobs: bool = True
    job_submissions_limit: int | None = Field(None, ge=0, le=10)
    prev_submitted_at: WireTime | None = None
    prev_run_id: UUID | None = None
    limit: int = Field(100, ge=0, le=100)
    ascending: bool = False


class GetRunBody(Body):
    run_name: str | None = None
    id: UUID | None = None


class StopRunsBody(Body):
    runs_names: list[str]
    abort: bool = False


class DeleteRunsBody(Body):
    runs_names: list[str]


class PollLogsBody(Body):
    run_name: str
    job_submission_id: UUID
    start_time: WireTime | None = None
    end_time: WireTime | None = None
    descending: bool = False
    next_token: str | None = None
    limit: int = Field(100, ge=0, le=1000)
    diagnose: bool = False


class _RepoInfoBase(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)  # older clients sent more fields here


class RemoteRepoInfo(_RepoInfoBase):
    repo_type: Literal["remote"]
    repo_name: str


class LocalRepoInfo(_RepoInfoBase):
    repo_type: Literal["local"]
    repo_dir: str


class VirtualRepoInfo(_RepoInfoBase):
    repo_type: Literal["virtual"]


RepoInfo = Annotated[Union[RemoteRepoInfo, LocalRepoInfo, VirtualRepoInfo], Field(discriminator="repo_type")]
RepoId = Annotated[str, Field(min_length=1, max_length=200)]


class RepoCreds(Body):
    clone_url: str = Field(min_length=1)
    private_key: str | None = None
    oauth_token: str | None = None


class ReposInitBody(Body):
    repo_id: RepoId
    repo_info: RepoInfo
    repo_creds: RepoCreds | None = None


class GetRepoBody(Body):
    repo_id: str
    include_creds: bool = False


class DeleteReposBody(Body):
    repos_ids: list[str]


class ArchiveByHashBody(Body):
    hash: str


class GatewaySpecIn(Body):
    configuration: dict[str, Any]
    configuration_path: str | None = None


class GatewayPlanBody(Body):
    spec: GatewaySpecIn


class GatewayPlanIn(Body):
    spec: GatewaySpecIn
    current_resource: dict[str, Any] | None = None


class GatewayApplyBody(Body):
    plan: GatewayPlanIn
    force: bool = False


class GatewayCreateBody(Body):
    configuration: dict[str, Any]


class GatewaySetDefaultBody(Body):
    name: str
    gateway_project: str | None = None


class GatewaySetWildcardDomainBody(Body):
    name: str
    wildcard_domain: str


class QuotaSetBody(Body):
    """A project's scheduling policy (``config.quotas.ProjectPolicy`` checks it field by field)."""

    name: Union[str, None] = None
    weight: Union[float, None] = None
    quota: Union[dict[str, Any], None] = None
    preemptible_max_priority: Union[int, None] = None
    preemptible_run_types: Union[list[str], None] = None


class VolumeCreateBody(Body):
    configuration: dict[str, Any]


class NameBody(Body):
    name: str


class ListGatewaysBody(Body):
    include_imported: bool = False


class ListVolumesBody(Body):
    project_name: str | None = None
    only_active: bool = False
    prev_created_at: datetime | None = None
    prev_id: UUID | None = None
    limit: int = Field(100, ge=0, le=100)
    ascending: bool = False


#: dstack's bounds on every list of an ``events/list`` filter (``MIN_FILTER_ITEMS``, ``MAX_FILTER_ITEMS``).
_FILTER = Field(None, min_length=1, max_length=16)
EventTargetType = Literal[TARGET_TYPES]  # type: ignore[valid-type]


class ListEventsBody(Body):
    """``events/list``: at most one ``target_*`` and one ``within_*`` filter (dstack's 422s), keyset paging."""

    target_projects: list[UUID] | None = _FILTER
    target_users: list[UUID] | None = _FILTER
    target_fleets: list[UUID] | None = _FILTER
    target_instances: list[UUID] | None = _FILTER
    target_runs: list[UUID] | None = _FILTER
    target_jobs: list[UUID] | None = _FILTER
    target_volumes: list[UUID] | None = _FILTER
    target_gateways: list[UUID] | None = _FILTER
    target_gateway_replicas: list[UUID] | None = _FILTER
    target_secrets: list[UUID] | None = _FILTER
    target_presets: list[UUID] | None = _FILTER
    within_projects: list[UUID] | None = _FILTER
    within_fleets: list[UUID] | None = _FILTER
    within_runs: list[UUID] | None = _FILTER
    within_gateways: list[UUID] | None = _FILTER
    include_target_types: list[EventTargetType] | None = _FILTER
    actors: list[UUID | None] | None = _FILTER
    prev_recorded_at: WireTime | None = None
    prev_id: UUID | None = None
    limit: int = Field(100, ge=1, le=100)
    ascending: bool = False

    def _set(self, prefix: str) -> list[str]:
        return [n for n in type(self).model_fields if n.startswith(prefix) and getattr(self, n) is not None]

    @model_validator(mode="after")
    def _one_target_one_within(self) -> ListEventsBody:
        for prefix in ("target_", "within_"):
            chosen = self._set(prefix)
            if len(chosen) > 1:
                raise ValueError(f"At most one {prefix}* filter can be set at a time. Got {', '.join(chosen)}")
        return self

    def target(self) -> tuple[str, list[str]] | None:
        """The ``target_*`` filter as (target type, ids)."""
        for name in self._set("target_"):
            kind = name.removeprefix("target_").removesuffix("s").replace("_", "-")
            return kind, [str(i) for i in getattr(self, name)]
        return None

    def within(self) -> tuple[str, list[str]] | None:
        """The ``within_*`` filter as (``project``, ``fleet``, ``run`` or ``gateway``, ids)."""
        for name in self._set("within_"):
            return name.removeprefix("within_").removesuffix("s"), [str(i) for i in getattr(self, name)]
        return None


class ListGpusBody(Body):
    run_spec: dict[str, Any]  # dstack's RunSpec, as every version of its client sends it; not read
    group_by: list[Literal["backend", "region", "count"]] | None = None
    reverse: bool = False
    full_offers: bool = False
    unallocated_resources: bool = False


class GetInstanceBody(Body):
    id: UUID


class InstanceHealthChecksBody(Body):
    fleet_name: str
    instance_num: int
    after: datetime | None = None
    before: datetime | None = None
    limit: int | None = None


class NextRedirectBody(Body):
    code: str
    state: str


def warm_up() -> None:
    """Build every request model now (of this module and of the modules that extend ``Body``)."""
    todo: list[type[BaseModel]] = [Body, _RepoInfoBase, NoBody]
    while todo:
        model = todo.pop()
        todo.extend(model.__subclasses__())
        model.model_rebuild()


class GetSecretBody(Body):
    name: str


class CreateOrUpdateSecretBody(Body):
    name: str
    value: str


class DeleteSecretsBody(Body):
    secrets_names: list[str]


class JobMetricsQuery(BaseModel):
    """``GET /api/project/{p}/metrics/job/{run_name}``'s query (dstack's parameters; others are ignored)."""

    model_config = ConfigDict(extra="ignore", defer_build=True)
    run_id: UUID | None = None
    replica_num: int = Field(0, ge=0, le=2**31)
    job_num: int = Field(0, ge=0, le=2**31)
    #: dstack's default: one sample (its CLI asks for 1000).
    limit: int = Field(1, ge=0, le=100_000)
    after: WireTime | None = None
    before: WireTime | None = None


class BackendConfigBody(BaseModel):
    """``backends/create|update``: a backend's configuration with its credentials (dstack's
    ``AnyBackendConfigWithCreds``); checked field by field by the service for the ``type`` given."""

    model_config = ConfigDict(extra="allow", defer_build=True)
    type: str


class BackendYAMLBody(Body):
    """``backends/create_yaml|update_yaml``."""

    config_yaml: str


class DeleteBackendsBody(Body):
    backends_names: list[str]
