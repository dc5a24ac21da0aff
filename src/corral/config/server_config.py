"""The server's optional ``config.yml`` (in the state directory): projects and their backends, and dstack's
``default_permissions`` that corral applies.

projects:
  - name: main
    backends:
      - type: local
      - type: aws              # dstack's block: creds, regions, vpc_name / vpc_ids, public_ips, ...
        creds: {type: access_key, access_key: AKIA..., secret_key: ...}
default_permissions:
  allow_managers_manage_secrets: true
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.config.aws_backend import AWSBackendConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built when a config.yml is read


class BackendEntry(_Strict):
    type: Literal["local"]


def _local() -> BackendEntry | AWSBackendConfig:
    return BackendEntry(type="local")


AnyBackend = Annotated[Union[BackendEntry, AWSBackendConfig], Field(discriminator="type")]


class ProjectEntry(_Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9-_]{1,50}$")
    backends: list[AnyBackend] = Field(default_factory=lambda: [_local()])


class DefaultPermissions(_Strict):
    #: dstack's flag: project managers may manage the project's secrets too (default: admins only).
    allow_managers_manage_secrets: bool = False


class ServerConfig(_Strict):
    projects: list[ProjectEntry] = Field(default_factory=list)
    default_permissions: DefaultPermissions = Field(default_factory=DefaultPermissions)


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
        raise ServerConfigError(f"{path}: {problems} (corral supports the `local` and `aws` backends)") from None
