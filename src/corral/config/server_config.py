"""The server's optional ``config.yml`` (in the state directory): projects and their backends, and dstack's
``default_permissions`` that corral applies.

projects:
  - name: main
    backends:
      - type: local
      - type: aws              # dstack's block: creds, regions, vpc_name / vpc_ids, public_ips, ...
        creds: {type: access_key, access_key: AKIA..., secret_key: ...}
      - type: slurm            # dstack's block: clusters (login node, user, key, partitions) + corral's extensions
        clusters: [{name: hpc, hostname: login.example.org, user: alice, private_key: {path: ~/.ssh/id_ed25519}}]
    weight: 1                  # fair-share weight and quotas (corral.config.quotas); omitted: no limit
    quota: {nominal: {gpu: 8}, max: {gpu: {H100: 8, any: 16}, price_per_hour: 40}}
    preemptible_max_priority: 49   # its tasks of priority <= 49 may be preempted (null: none)
    preemptible_run_types: [task]  # the run types that covers (default: tasks only)
default_permissions:
  allow_managers_manage_secrets: true
scheduling:
  preemption: {enabled: false, min_priority_gap: 10, min_runtime: 10m, grace_period: 120s, max_victims_per_cycle: 8}
plugins: [rest_plugin]         # dstack's key: apply policies asked of the service at DSTACK_PLUGIN_SERVICE_URI

A project's policy (``weight``, ``quota``, ``preemptible_max_priority``, ``preemptible_run_types``) is
re-applied at each start for the projects that give one; a project listed without any of them keeps the
policy set through the API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from corral.config.aws_backend import AWSBackendConfig
from corral.config.quotas import POLICY_KEYS, ProjectPolicy, Quota, RunType, Scheduling
from corral.config.slurm_backend import SlurmBackendConfig
from corral.domain.quotas import QuotaPolicy

#: dstack's name of its built-in REST plugin (``_BUILTIN_PLUGINS`` in dstack 0.22.5's ``services/plugins.py``).
REST_PLUGIN = "rest_plugin"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built when a config.yml is read


class BackendEntry(_Strict):
    type: Literal["local"]


def _local() -> BackendEntry | AWSBackendConfig | SlurmBackendConfig:
    return BackendEntry(type="local")


AnyBackend = Annotated[Union[BackendEntry, AWSBackendConfig, SlurmBackendConfig], Field(discriminator="type")]


class ProjectEntry(_Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9-_]{1,50}$")
    backends: list[AnyBackend] = Field(default_factory=lambda: [_local()])
    weight: Optional[float] = Field(default=None, gt=0)
    quota: Optional[Quota] = None
    preemptible_max_priority: Optional[int] = Field(default=None, ge=0, le=100)
    preemptible_run_types: Optional[list[RunType]] = None

    def policy(self) -> QuotaPolicy | None:
        """The project's scheduling policy, None when the entry gives none (the stored one is kept)."""
        given = self.model_fields_set & set(POLICY_KEYS)
        if not given:
            return None
        return ProjectPolicy.model_validate(
            {k: getattr(self, k) for k in given if getattr(self, k) is not None}
        ).to_policy()


class DefaultPermissions(_Strict):
    #: dstack's flag: project managers may manage the project's secrets too (default: admins only).
    allow_managers_manage_secrets: bool = False


class ServerConfig(_Strict):
    projects: list[ProjectEntry] = Field(default_factory=list)
    default_permissions: DefaultPermissions = Field(default_factory=DefaultPermissions)
    scheduling: Scheduling = Field(default_factory=Scheduling)
    #: dstack's ``plugins``: the server-side plugins enabled, by name. corral has dstack's built-in
    #: ``rest_plugin`` (docs/policies.md); dstack's other plugins are Python packages it cannot load.
    plugins: list[str] = Field(default_factory=list)

    @field_validator("plugins")
    @classmethod
    def _known_plugins(cls, names: list[str]) -> list[str]:
        unknown = [n for n in names if n != REST_PLUGIN]
        if unknown:
            raise ValueError(
                f"unknown plugin {', '.join(map(repr, unknown))}: corral has dstack's built-in `{REST_PLUGIN}` "
                "(a policy service over HTTP) only; list that, or remove the others"
            )
        return list(dict.fromkeys(names))


class ServerConfigError(ValueError):
    pass


def load_server_config(path: Path) -> ServerConfig | None:
    """The parsed file, None when it does not exist; a readable error naming the field otherwise."""
    if not path.exists():
        return None
    import yaml  # only when there is a file to read

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ServerConfigError(f"{path}: not valid YAML: {e}") from None
    try:
        return ServerConfig.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in e.errors()
        )
        backends = any("backends" in err["loc"] for err in e.errors())
        hint = " (corral supports the `local`, `aws` and `slurm` backends)" if backends else ""
        raise ServerConfigError(f"{path}: {problems}{hint}") from None
