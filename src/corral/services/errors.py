"""Errors the services raise; the API maps each to dstack's error body."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class ServiceError(Exception):
    """400 ``{"detail": [{"msg", "code"}]}``."""

    code = "error"

    def __init__(self, msg: str, code: str | None = None) -> None:
        super().__init__(msg)
        self.msg = msg
        if code is not None:
            self.code = code


class StorageFull(ServiceError):
    """507: the server's state directory is below its free-space watermark (or full); the message names it
    and its free space (:func:`corral.diskspace.refusal`)."""


class ResourceNotExists(ServiceError):
    code = "resource_not_exists"


class ResourceExists(ServiceError):
    code = "resource_exists"


class Forbidden(Exception):
    """403 ``{"detail": {"msg": "Access denied", "code": null}}``."""

    def __init__(self, msg: str = "Access denied") -> None:
        super().__init__(msg)
        self.msg = msg


class AccessDenied(Forbidden):
    """dstack's ``ForbiddenError`` raised by a service (not by a route's permission dependency): 403 with the
    bare body ``{"msg": "Access denied: ...", "code": null}``, as dstack's handler answers it."""


class ProjectNotFound(Exception):
    """404 ``{"detail": {"msg": "Not found", "code": null}}``."""


class InvalidConfiguration(Exception):
    """422 with pydantic-style errors whose ``loc`` starts at the request body."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("invalid configuration")
        self.errors = errors


def validation_errors(exc: Any, prefix: tuple[str | int, ...]) -> InvalidConfiguration:
    """Turn a pydantic ``ValidationError`` raised while parsing a nested document into a 422."""
    out = []
    for err in exc.errors(include_url=False):
        item = {"type": err.get("type"), "loc": ["body", *prefix, *err.get("loc", ())], "msg": err.get("msg")}
        if "input" in err:
            try:
                import json

                json.dumps(err["input"])
                item["input"] = err["input"]
            except (TypeError, ValueError):
                item["input"] = str(err["input"])
            except RecursionError:  # nested deeper than the encoder goes: not shown
                item["input"] = None
        out.append(item)
    return InvalidConfiguration(out)


def validated(parse: Callable[[Any], T], value: object, loc: tuple[str | int, ...]) -> T:
    """``parse(value)``; a pydantic ``ValidationError`` it raises becomes the 422 naming ``loc``
    (:func:`validation_errors`)."""
    from pydantic import ValidationError  # (loaded already by the models ``parse`` validates with)

    try:
        return parse(value)
    except ValidationError as e:
        raise validation_errors(e, loc) from None
