"""Parts of run configurations written in shorthand: ports (`8080`, `80:8080`, `*:8080`), volume
mounts (`name:/path` network volumes, `/host:/path` instance mounts), Git repos (`.`,
`https://...:/dir`) and uploaded files (`local[:container]`).
"""

from __future__ import annotations

import re
import string
from enum import Enum
from pathlib import PurePosixPath, PureWindowsPath
from typing import Annotated, Any, Optional, Union

from pydantic import BeforeValidator, Field, field_validator, model_validator
from typing_extensions import Self

from corral.config.common import CoreModel

ValidPort = Annotated[int, Field(gt=0, le=65535)]


class PortMapping(CoreModel):
    local_port: Optional[ValidPort] = None
    container_port: ValidPort

    @classmethod
    def parse(cls, value: str) -> PortMapping:
        """`8080`, `80:8080` or `*:8080` (any free local port)."""
        match = re.search(r"^(?:(\d+|\*):)?(\d+)$", value)
        if not match:
            raise ValueError(f"invalid port {value!r}: use PORT, LOCAL:CONTAINER or *:CONTAINER")
        local, container = match.groups()
        if local is None:
            return cls(local_port=int(container), container_port=int(container))
        return cls(local_port=None if local == "*" else int(local), container_port=int(container))


def _port_shorthand(value: Any) -> Any:
    if isinstance(value, int):
        return {"local_port": value, "container_port": value}
    if isinstance(value, str):
        return PortMapping.parse(value)
    return value


PortMappingOrShorthand = Annotated[PortMapping, BeforeValidator(_port_shorthand)]


def _mount_path(path: str) -> str:
    if not path:
        raise ValueError("empty path")
    posix = PurePosixPath(path)
    if not posix.is_absolute():
        raise ValueError(f"path must be absolute: {path}")
    if ".." in posix.parts:
        raise ValueError(f".. are not allowed: {path}")
    return str(posix)


class VolumeMountPoint(CoreModel):
    """A network volume (or one of a list of alternatives) mounted at an absolute `path`."""

    name: Union[str, list[str]]
    path: str

    _path = field_validator("path")(_mount_path)


class InstanceMountPoint(CoreModel):
    """A directory of the instance (host) mounted into the container."""

    instance_path: str
    path: str
    optional: bool = False

    _instance_path = field_validator("instance_path")(_mount_path)
    _path = field_validator("path")(_mount_path)


MountPoint = Union[VolumeMountPoint, InstanceMountPoint]


def _mount_shorthand(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    parts = value.split(":")
    if len(parts) != 2:
        raise ValueError(f"invalid mount point {value!r}: use VOLUME_NAME:/path or /instance/path:/path")
    src, dest = parts
    if "/" in src:
        return InstanceMountPoint(instance_path=src, path=dest)
    return VolumeMountPoint(name=src, path=dest)


MountPointOrShorthand = Annotated[MountPoint, BeforeValidator(_mount_shorthand)]


def _split_windows_drive(parts: list[str]) -> list[str]:
    """Rejoin a Windows drive letter split off by `:` (`C:\\path`, `c:/path`)."""
    drive = len(parts) > 1 and len(parts[0]) == 1 and parts[0] in string.ascii_letters
    if drive and parts[1][:1] in ("\\", "/"):
        return [f"{parts[0]}:{parts[1]}", *parts[2:]]
    return parts


class RepoExistsAction(str, Enum):
    ERROR = "error"
    SKIP = "skip"


class RepoSpec(CoreModel):
    """A Git repo: `local_path` or `url`, optional `branch`/`hash`, checked out at `path`."""

    local_path: Optional[str] = None
    url: Optional[str] = None
    branch: Optional[str] = None
    hash: Optional[str] = None
    path: str = "."
    if_exists: RepoExistsAction = RepoExistsAction.ERROR

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        is_url = False
        parts = value.split(":")
        if len(parts) > 1:
            if "@" in parts[0] or parts[1].startswith("//"):
                parts = [f"{parts[0]}:{parts[1]}", *parts[2:]]
                is_url = True
            else:
                parts = _split_windows_drive(parts)
        if len(parts) > 2:
            raise ValueError(f"invalid repo {value!r}: use PATH_OR_URL or PATH_OR_URL:REPO_DIR")
        data: dict[str, str] = {"url" if is_url else "local_path": parts[0]}
        if len(parts) == 2:
            data["path"] = parts[1]
        return data

    @model_validator(mode="after")
    def _local_path_or_url(self) -> Self:
        if self.local_path and self.url:
            raise ValueError("`local_path` and `url` are mutually exclusive")
        if not self.local_path and not self.url:
            raise ValueError("Either `local_path` or `url` must be specified")
        return self

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if value.startswith("~") and PurePosixPath(value).parts[0] != "~":
            raise ValueError("`~username` syntax is not supported")
        return value


class FilePathMapping(CoreModel):
    """`local[:container]`: a local file or directory uploaded to `path` in the container."""

    local_path: str
    path: str

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        parts = _split_windows_drive(value.split(":"))
        if len(parts) == 1:
            return {"local_path": parts[0], "path": parts[0]}
        if len(parts) == 2:
            return {"local_path": parts[0], "path": parts[1]}
        raise ValueError(f"invalid file path mapping {value!r}: use LOCAL_PATH[:CONTAINER_PATH]")

    @field_validator("path")
    @classmethod
    def _unix_path(cls, value: str) -> str:
        if PureWindowsPath(value).is_absolute():
            raise ValueError(f"path must be a Unix file path: {value}")
        return value
