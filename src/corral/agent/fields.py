"""Field validators of the agent's wire format (``protocol``, ``protocol_containers``).

Each reads one key of a decoded JSON object and raises :class:`ProtocolError` naming the field
(``JobSubmission.env``, ``ContainerSpec.ports``, ...) when the value does not fit.
"""

from __future__ import annotations

import math
from typing import Any


class ProtocolError(ValueError):
    """A message that does not follow the agent protocol; the text names the field."""


def _obj(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProtocolError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data


def _str(d: dict[str, Any], key: str, what: str, optional: bool = False, nonempty: bool = False) -> Any:
    v = d.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, str):
        raise ProtocolError(f"{what}.{key}: expected a string, got {_tn(v)}")
    if nonempty and not v:
        raise ProtocolError(f"{what}.{key}: must not be empty")
    return v


def _int(d: dict[str, Any], key: str, what: str, optional: bool = False, minimum: int | None = None) -> Any:
    v = d.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ProtocolError(f"{what}.{key}: expected an integer, got {_tn(v)}")
    if minimum is not None and v < minimum:
        raise ProtocolError(f"{what}.{key}: must be >= {minimum}, got {v}")
    return v


def _num(d: dict[str, Any], key: str, what: str, optional: bool = False, default: float | None = None) -> Any:
    v = d.get(key, default)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ProtocolError(f"{what}.{key}: expected a finite number, got {_tn(v)}")
    if v < 0:
        raise ProtocolError(f"{what}.{key}: must not be negative, got {v}")
    return float(v)


def _choice(d: dict[str, Any], key: str, what: str, choices: Any) -> Any:
    v = d.get(key)
    if v not in choices:
        raise ProtocolError("{}.{}: expected one of {}, got {!r}".format(what, key, ", ".join(choices), v))
    return v


def _str_list(d: dict[str, Any], key: str, what: str) -> list[str]:
    v = d.get(key)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ProtocolError(f"{what}.{key}: expected a list of strings")
    return list(v)


def _bool(d: dict[str, Any], key: str, what: str) -> bool:
    v = d.get(key, False)
    if not isinstance(v, bool):
        raise ProtocolError(f"{what}.{key}: expected true or false, got {_tn(v)}")
    return v


def _tn(v: Any) -> str:
    return "null" if v is None else type(v).__name__
