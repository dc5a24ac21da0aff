"""A small synchronous client of corral's (and dstack's) REST API.

``corral.sdk.client.CorralClient`` makes the calls; ``corral.sdk.errors`` holds the exceptions
(importing it costs nothing); ``corral.sdk.config_file`` reads and writes ``~/.corral/config.yml``.
Nothing heavy (httpx, yaml) is imported until a client is created or the file is read.

May import: corral.schemas, httpx, yaml.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.sdk.errors import (
    AuthError,
    ClientError,
    ConfigFileError,
    CorralError,
    NotFoundError,
    ResourceNotExistsError,
    ServerError,
    ServerUnreachable,
    ValidationError,
)

if TYPE_CHECKING:
    from corral.sdk.client import CorralClient

__all__ = [
    "AuthError",
    "ClientError",
    "ConfigFileError",
    "CorralClient",
    "CorralError",
    "NotFoundError",
    "ResourceNotExistsError",
    "ServerError",
    "ServerUnreachable",
    "ValidationError",
]


def __getattr__(name: str) -> Any:
    if name == "CorralClient":
        from corral.sdk.client import CorralClient

        return CorralClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
