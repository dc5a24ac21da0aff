"""Fields every run type shares (image/python/docker, user, shell, env, resources, priority,
ports, volumes, repos, files) and the `task` and `dev-environment` types, with node groups.
`service` lives in `corral.config.services`; shorthand parts in `corral.config.run_parts`.
"""

from __future__ import annotations

import re
from collections import Counter
from enum import Enum
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, Optional

from pydantic import Field, ValidationInfo, field_validator, model_validator
from typing_extensions import Self

from corral.config.common import CoreModel, Env, RegistryAuth
from corral.config.profiles import ProfileParams
from corral.config.resources import ResourcesSpec
from corral.config.run_parts import (
    FilePathMapping,
    InstanceMountPoint,
    MountPoint,
    MountPointOrShorthand,
    PortMapping,
    PortMappingOrShorthand,
    RepoExistsAction,
    RepoSpec,
    ValidPort,
    VolumeMountPoint,
)
from corral.domain.durations import parse_off_duration

GROUP_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
DEFAULT_GROUP_NAME = "0"


class PythonVersion(str, Enum):
    PY39 = "3.9"
    PY310 = "3.10"
    PY311 = "3.11"
    PY312 = "3.12"
    PY313 = "3.13"
    PY314 = "3.14"
    PY315 = "3.15"


def coerce_python(value: Any) -> Any:
    """`3.12` (a YAML float) or `"3.12"`; `3.10` reads as the float 3.1 and means 3.10."""
    if isinstance(value, float):
        value = "3.10" if str(value) == "3.1" else str(value)
    if isinstance(value, str):
        try:
            return PythonVersion(value)
        except ValueError:
            versions = ", ".join(v.value for v in PythonVersion)
            raise ValueError(f"unsupported python version {value!r}: use one of {versions}") from None
    return value


def _check_unix_user(value: str) -> None:
    parts = value.split(":")
    if len(parts) > 2:
        raise ValueError("invalid user format: too many parts; use USER[:GROUP]")
    for part, what in zip(parts, ("user", "group")[: len(parts)], strict=True):
        if not part:
            raise ValueError(f"invalid user format: empty {what} name or id; use USER[:GROUP]")
        if part.lstrip("-").isdigit() and int(part) < 0:
            raise ValueError(f"invalid user format: negative {what} id {part}")


class BaseRunConfiguration(CoreModel):
    """Fields every run type has (dstack's `BaseRunConfiguration`, same order and defaults)."""

    type: str
    name: Optional[str] = None
    image: Optional[str] = None
    user: Optional[str] = None
    privileged: bool = False
    entrypoint: Optional[str] = None
    working_dir: Optional[str] = None
    home_dir: str = "/root"
    registry_auth: Optional[RegistryAuth] = None
    python: Optional[PythonVersion] = None
    nvcc: Optional[bool] = None
    single_branch: Optional[bool] = None
    env: Env = {}
    shell: Optional[str] = None
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    priority: Annotated[Optional[int], Field(ge=0, le=100)] = None
    volumes: list[MountPointOrShorthand] = []
    docker: Optional[bool] = None
    repos: list[RepoSpec] = []
    files: list[FilePathMapping] = []
    dstack: bool = False
    setup: list[str] = []

    @field_validator("python", mode="before")
    @classmethod
    def _python(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("image"):
            raise ValueError("`image` and `python` are mutually exclusive fields")
        return coerce_python(value)

    @field_validator("docker", mode="before")
    @classmethod
    def _docker(cls, value: Any, info: ValidationInfo) -> Any:
        for other in ("image", "python", "nvcc"):
            if value is True and info.data.get(other):
                raise ValueError(f"`{other}` and `docker` are mutually exclusive fields")
        return value

    @field_validator("repos")
    @classmethod
    def _repos(cls, value: list[RepoSpec]) -> list[RepoSpec]:
        if len(value) > 1:
            raise ValueError("A maximum of one repo is currently supported")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            _check_unix_user(value)
        return value

    @field_validator("shell")
    @classmethod
    def _shell(cls, value: Optional[str]) -> Optional[str]:
        if value is None or value in ("sh", "bash") or PurePosixPath(value).is_absolute():
            return value
        raise ValueError("The value must be `sh`, `bash`, or an absolute path")

    def env_dict(self) -> dict[str, str]:
        """The env as plain strings; raises ValueError naming variables listed without a value."""
        unresolved = sorted(k for k, v in self.env.items() if not isinstance(v, str))
        if unresolved:
            raise ValueError(f"not all variables are resolved: {', '.join(unresolved)}")
        return {k: v for k, v in self.env.items() if isinstance(v, str)}


class _PortsParams(CoreModel):
    ports: list[PortMappingOrShorthand] = []


class _CommandsParams(CoreModel):
    commands: list[str] = []

    @model_validator(mode="after")
    def _image_or_commands(self) -> Self:
        if getattr(self, "groups", None) is not None:
            return self
        if not self.commands and not getattr(self, "image", None):
            raise ValueError("Either `commands` or `image` must be set")
        return self


class _DevEnvironmentParams(CoreModel):
    ide: Optional[Literal["vscode", "cursor", "windsurf", "zed"]] = None
    version: Optional[str] = None
    init: list[str] = []
    inactivity_duration: Optional[int] = None

    @field_validator("inactivity_duration", mode="before")
    @classmethod
    def _inactivity(cls, value: Any) -> Optional[int]:
        parsed = parse_off_duration(value)
        return parsed if isinstance(parsed, int) else None

    @model_validator(mode="after")
    def _ide_and_version(self) -> Self:
        if self.version and self.ide is None:
            raise ValueError("`version` requires `ide` to be set")
        if self.ide == "windsurf" and self.version and not re.match(r"^.+@[a-f0-9]+$", self.version):
            raise ValueError(f"Invalid Windsurf version format: `{self.version}`. Expected format: `version@commit`")
        return self


class DevEnvironmentConfiguration(ProfileParams, BaseRunConfiguration, _PortsParams, _DevEnvironmentParams):
    type: Literal["dev-environment"] = "dev-environment"

    @field_validator("entrypoint")
    @classmethod
    def _no_entrypoint(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            raise ValueError("entrypoint is not supported for dev-environment")
        return value

    @model_validator(mode="after")
    def _dstack_and_inactivity(self) -> Self:
        if self.dstack and self.inactivity_duration is not None:
            raise ValueError("`dstack` is not supported together with `inactivity_duration`")
        return self


def check_group_names(groups: list[Any], what: str) -> None:
    """Fill omitted names with the group's index; reject duplicates."""
    if not groups:
        raise ValueError("`groups` cannot be an empty list")
    for index, group in enumerate(groups):
        if group.name is None:
            group.name = str(index)
    duplicates = [name for name, count in Counter(g.name for g in groups).items() if count > 1]
    if duplicates:
        raise ValueError(
            f"Duplicate {what} group names found: {duplicates}. Each {what} group must have a unique name."
        )


def check_group_name(value: Optional[str]) -> Optional[str]:
    if value is not None and not GROUP_NAME_RE.match(value):
        raise ValueError(f"Group name should match regex '{GROUP_NAME_RE.pattern}'")
    return value


class NodeGroup(CoreModel):
    """One group of a heterogeneous multi-node task; does not inherit top-level `resources`."""

    name: Optional[str] = None
    nodes: Annotated[int, Field(ge=1)] = 1
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    commands: list[str] = []
    ports: list[PortMappingOrShorthand] = []

    _name = field_validator("name")(check_group_name)


class _TaskParams(CoreModel):
    nodes: Annotated[Optional[int], Field(ge=1)] = None
    groups: Optional[list[NodeGroup]] = None

    @model_validator(mode="before")
    @classmethod
    def _nodes_xor_groups(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("groups") is not None and data.get("nodes") is not None:
            raise ValueError("`nodes` and `groups` are mutually exclusive")
        return data

    @field_validator("groups")
    @classmethod
    def _groups(cls, value: Optional[list[NodeGroup]]) -> Optional[list[NodeGroup]]:
        if value is not None:
            check_group_names(value, "node")
        return value


class TaskConfiguration(ProfileParams, BaseRunConfiguration, _CommandsParams, _PortsParams, _TaskParams):
    type: Literal["task"] = "task"

    @model_validator(mode="after")
    def _groups_exclusive(self) -> Self:
        if self.groups is None:
            return self
        for name, present in (
            ("commands", bool(self.commands)),
            ("ports", bool(self.ports)),
            ("entrypoint", self.entrypoint is not None),
        ):
            if present:
                raise ValueError(
                    f"Top-level `{name}` is not allowed when `groups` is set. "
                    "Specify `commands` and `ports` in each node group instead."
                )
        for group in self.groups:
            if not group.commands and self.image is None:
                raise ValueError(
                    f"Node group '{group.name}': either `commands` must be set in the group, "
                    "or `image` at the task level."
                )
        return self

    @property
    def nodes_num(self) -> int:
        """Total nodes: `nodes` (default 1) or the sum over `groups`."""
        if self.groups is not None:
            return sum(g.nodes for g in self.groups)
        return self.nodes if self.nodes is not None else 1


__all__ = [
    "BaseRunConfiguration",
    "DevEnvironmentConfiguration",
    "FilePathMapping",
    "InstanceMountPoint",
    "MountPoint",
    "NodeGroup",
    "PortMapping",
    "PortMappingOrShorthand",
    "RepoExistsAction",
    "RepoSpec",
    "TaskConfiguration",
    "ValidPort",
    "VolumeMountPoint",
]
