"""Exceptions raised by the corral SDK.

Every error a user can cause (a bad token, an unknown run, a server that is not running, a
missing config file) is a :class:`CorralError` whose ``str()`` is one readable sentence, so the
CLI can print it as a single line. This module imports nothing but the standard library, so the
CLI may import it while handling an error without slowing down start-up.
"""

from __future__ import annotations


class CorralError(Exception):
    """Base class of every error the SDK raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ClientError(CorralError):
    """The server rejected the request (HTTP 400 with ``{"detail": [{"msg", "code"}]}``)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class ResourceNotExistsError(ClientError):
    """A 400 with code ``resource_not_exists`` (a run, fleet, ... that is not there)."""


class AuthError(CorralError):
    """HTTP 401/403: the token is missing, invalid, or lacks the permission."""


class NotFoundError(CorralError):
    """HTTP 404: an unknown project (or route)."""


class ValidationError(CorralError):
    """HTTP 422: the request body failed validation; ``errors`` holds ``"field.path: message"``."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("Invalid request: " + "; ".join(errors) if errors else "Invalid request")


class ServerError(CorralError):
    """HTTP 5xx or a response that is not the JSON the API promises."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class ServerUnreachable(CorralError):
    """The server could not be reached (connection refused, DNS failure, timeout)."""


class ConfigFileError(CorralError):
    """The CLI configuration file (``~/.corral/config.yml``) is missing a project or is invalid."""
