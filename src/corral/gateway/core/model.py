"""The gateway's state and the validation of the management API's bodies.

The state is a frozen value: the configuration (the server's URL and the gateway's secret), the services by
``(project, run)``, the entrypoints (model endpoint hosts) by host, the ACME challenges by token and the
certificates' expiry by host (their PEMs are files of the state directory). Each change is a function returning a
new state, or raising :class:`BadRequest` with a message naming the field and the fix. ``to_json``/``from_json``
are the state file's format.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Optional

#: dstack's defaults for a service's body size and read timeout (dstack 0.22.5,
#: ``DSTACK_DEFAULT_SERVICE_CLIENT_MAX_BODY_SIZE`` = 64 MiB and ``DSTACK_SERVICE_CLIENT_TIMEOUT`` = 300 s, as its
#: nginx template ``proxy/gateway/resources/nginx/service.jinja2`` uses them).
DEFAULT_CLIENT_MAX_BODY_SIZE = 64 * 1024 * 1024
DEFAULT_READ_TIMEOUT = 300

_HOST = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
#: dstack's rules for a rate limit's prefix and header name (dstack 0.22.5, ``core/models/configurations.py``).
_PREFIX = re.compile(r"^/[^\s\\{}]*$")
_HEADER = re.compile(r"^[a-zA-Z0-9-_]+$")
_MAX_PREFIX = 4094
_MAX_RPS = (2**63 - 1) // 60


class BadRequest(ValueError):
    """A management request is wrong; the message names the field and what to send instead."""


@dataclass(frozen=True)
class Config:
    server_url: str
    secret: str
    host: str
    port: int


@dataclass(frozen=True)
class RateLimit:
    prefix: str
    header: Optional[str]  # None: the client's IP address is the key
    rps: float
    burst: int


@dataclass(frozen=True)
class Service:
    project: str
    run: str
    host: str
    https: bool
    auth: bool
    upstream_path: str
    rate_limits: tuple[RateLimit, ...] = ()
    client_max_body_size: int = DEFAULT_CLIENT_MAX_BODY_SIZE
    read_timeout: int = DEFAULT_READ_TIMEOUT


@dataclass(frozen=True)
class Entrypoint:
    host: str
    project: str
    https: bool


@dataclass(frozen=True)
class State:
    config: Optional[Config] = None
    services: Mapping[tuple[str, str], Service] = field(default_factory=dict)
    entrypoints: Mapping[str, Entrypoint] = field(default_factory=dict)
    challenges: Mapping[str, str] = field(default_factory=dict)
    certificates: Mapping[str, str] = field(default_factory=dict)  # host -> not_after (ISO 8601, UTC)


# -- field readers ---------------------------------------------------------------------------------------------


def _object(body: object, where: str) -> dict[str, object]:
    if not isinstance(body, dict):
        raise BadRequest(f"{where}: the body must be a JSON object")
    return body


def _no_extra(d: Mapping[str, object], allowed: tuple[str, ...], where: str) -> None:
    extra = sorted(set(d) - set(allowed))
    if extra:
        raise BadRequest(f"{where}: unknown field {extra[0]!r}; the fields are {', '.join(allowed)}")


def _required(d: Mapping[str, object], key: str, where: str) -> object:
    if key not in d:
        raise BadRequest(f"{where}.{key} is required")
    return d[key]


def _str(d: Mapping[str, object], key: str, where: str) -> str:
    value = _required(d, key, where)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where}.{key} must be a non-empty string")
    return value


def _bool(d: Mapping[str, object], key: str, where: str) -> bool:
    value = _required(d, key, where)
    if not isinstance(value, bool):
        raise BadRequest(f"{where}.{key} must be true or false")
    return value


def _int(d: Mapping[str, object], key: str, where: str, default: int, minimum: int) -> int:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"{where}.{key} must be an integer >= {minimum}")
    return value


def check_host(host: str, where: str) -> str:
    """A DNS name (lowercased); ``where`` names the field in the error."""
    low = host.lower()
    if not _HOST.match(low):
        raise BadRequest(f"{where} {host!r} is not a valid host name (letters, digits, '-' and '.')")
    return low


def check_name(name: str, where: str) -> str:
    if not _NAME.match(name):
        raise BadRequest(f"{where} {name!r} is not a valid name (letters, digits, '_', '-', '.')")
    return name


def check_token(token: str) -> str:
    if not _TOKEN.match(token):
        raise BadRequest(f"challenge token {token!r} must be base64url characters (A-Z a-z 0-9 _ -)")
    return token


# -- bodies ----------------------------------------------------------------------------------------------------


def parse_config(body: object) -> Config:
    d = _object(body, "config")
    _no_extra(d, ("server_url", "secret"), "config")
    url = _str(d, "server_url", "config")
    m = re.match(r"^http://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})/?$", url)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise BadRequest(f"config.server_url {url!r} must be http://HOST:PORT (e.g. http://127.0.0.1:8100)")
    return Config(url.rstrip("/"), _str(d, "secret", "config"), m.group(1).strip("[]"), int(m.group(2)))


def _parse_rate_limit(item: object, where: str) -> RateLimit:
    d = _object(item, where)
    _no_extra(d, ("prefix", "key", "rps", "burst"), where)
    prefix = d.get("prefix", "/")
    if not isinstance(prefix, str) or not _PREFIX.match(prefix) or len(prefix) > _MAX_PREFIX:
        raise BadRequest(f"{where}.prefix must start with '/' and hold no spaces, '\\', '{{' or '}}'")
    key = _object(_required(d, "key", where), f"{where}.key")
    header: Optional[str] = None
    if key.get("type") == "header":
        _no_extra(key, ("type", "header"), f"{where}.key")
        header = _str(key, "header", f"{where}.key")
        if not _HEADER.match(header):
            raise BadRequest(f"{where}.key.header must be letters, digits, '-' or '_'")
    elif key.get("type") == "ip_address":
        _no_extra(key, ("type",), f"{where}.key")
    else:
        raise BadRequest(f"{where}.key.type must be 'ip_address' or 'header'")
    rps = _required(d, "rps", where)
    if isinstance(rps, bool) or not isinstance(rps, (int, float)) or not 1 / 60 <= rps <= _MAX_RPS:
        raise BadRequest(f"{where}.rps must be a number from 1/60 to {_MAX_RPS}")
    burst = _int(d, "burst", where, 0, 0)
    return RateLimit(prefix, header, float(rps), burst)


def parse_service(project: str, run: str, body: object) -> Service:
    where = "service"
    d = _object(body, where)
    allowed = ("host", "https", "auth", "upstream_path", "rate_limits", "client_max_body_size", "read_timeout")
    _no_extra(d, allowed, where)
    upstream = _str(d, "upstream_path", where)
    if not upstream.startswith("/") or any(c in upstream for c in " ?#\\\r\n"):
        raise BadRequest(f"{where}.upstream_path must be a path starting with '/' (e.g. /proxy/services/p/r/)")
    raw_limits = d.get("rate_limits", [])
    if not isinstance(raw_limits, list):
        raise BadRequest(f"{where}.rate_limits must be a list")
    limits = tuple(_parse_rate_limit(item, f"{where}.rate_limits[{i}]") for i, item in enumerate(raw_limits))
    prefixes = [limit.prefix for limit in limits]
    if len(set(prefixes)) != len(prefixes):
        raise BadRequest(f"{where}.rate_limits: each prefix may appear once")
    return Service(
        project=check_name(project, "project"),
        run=check_name(run, "run"),
        host=check_host(_str(d, "host", where), f"{where}.host"),
        https=_bool(d, "https", where),
        auth=_bool(d, "auth", where),
        upstream_path=upstream,
        rate_limits=limits,
        client_max_body_size=_int(d, "client_max_body_size", where, DEFAULT_CLIENT_MAX_BODY_SIZE, 0),
        read_timeout=_int(d, "read_timeout", where, DEFAULT_READ_TIMEOUT, 1),
    )


def parse_entrypoint(host: str, body: object) -> Entrypoint:
    d = _object(body, "entrypoint")
    _no_extra(d, ("project", "https"), "entrypoint")
    project = check_name(_str(d, "project", "entrypoint"), "entrypoint.project")
    return Entrypoint(check_host(host, "entrypoint host"), project, _bool(d, "https", "entrypoint"))


def parse_challenge(body: object) -> str:
    d = _object(body, "challenge")
    _no_extra(d, ("key_authorization",), "challenge")
    value = _str(d, "key_authorization", "challenge")
    if not re.match(r"^[A-Za-z0-9_.-]+$", value):
        raise BadRequest("challenge.key_authorization must be '<token>.<thumbprint>' (base64url and '.')")
    return value


def parse_certificate(body: object) -> tuple[str, str]:
    d = _object(body, "certificate")
    _no_extra(d, ("fullchain_pem", "key_pem"), "certificate")
    return _str(d, "fullchain_pem", "certificate"), _str(d, "key_pem", "certificate")


# -- changes ---------------------------------------------------------------------------------------------------


def _host_owner(state: State, host: str) -> Optional[str]:
    for svc in state.services.values():
        if svc.host == host:
            return f"service {svc.project}/{svc.run}"
    return f"entrypoint of project {state.entrypoints[host].project}" if host in state.entrypoints else None


def put_service(state: State, svc: Service) -> State:
    others = {k: v for k, v in state.services.items() if k != (svc.project, svc.run)}
    owner = _host_owner(replace(state, services=others), svc.host)
    if owner is not None:
        raise BadRequest(f"service.host {svc.host!r} is already used by the {owner}; pick another host")
    return replace(state, services={**others, (svc.project, svc.run): svc})


def delete_service(state: State, project: str, run: str) -> State:
    return replace(state, services={k: v for k, v in state.services.items() if k != (project, run)})


def put_entrypoint(state: State, ep: Entrypoint) -> State:
    others = {k: v for k, v in state.entrypoints.items() if k != ep.host}
    owner = _host_owner(replace(state, entrypoints=others), ep.host)
    if owner is not None:
        raise BadRequest(f"entrypoint host {ep.host!r} is already used by the {owner}; pick another host")
    return replace(state, entrypoints={**others, ep.host: ep})


def delete_entrypoint(state: State, host: str) -> State:
    return replace(state, entrypoints={k: v for k, v in state.entrypoints.items() if k != host})


def put_challenge(state: State, token: str, key_authorization: str) -> State:
    return replace(state, challenges={**state.challenges, token: key_authorization})


def delete_challenge(state: State, token: str) -> State:
    return replace(state, challenges={k: v for k, v in state.challenges.items() if k != token})


def put_certificate(state: State, host: str, not_after: str) -> State:
    return replace(state, certificates={**state.certificates, host: not_after})


# -- the state file --------------------------------------------------------------------------------------------


def _limit_json(limit: RateLimit) -> dict[str, object]:
    key: dict[str, object] = (
        {"type": "ip_address"} if limit.header is None else {"type": "header", "header": limit.header}
    )
    return {"prefix": limit.prefix, "key": key, "rps": limit.rps, "burst": limit.burst}


def service_json(svc: Service) -> dict[str, object]:
    """The management API's body for ``svc`` (what ``parse_service`` reads)."""
    return {
        "host": svc.host,
        "https": svc.https,
        "auth": svc.auth,
        "upstream_path": svc.upstream_path,
        "rate_limits": [_limit_json(limit) for limit in svc.rate_limits],
        "client_max_body_size": svc.client_max_body_size,
        "read_timeout": svc.read_timeout,
    }


def to_json(state: State) -> dict[str, object]:
    config = state.config
    return {
        "version": 1,
        "config": None if config is None else {"server_url": config.server_url, "secret": config.secret},
        "services": [{"project": p, "run": r, "spec": service_json(s)} for (p, r), s in sorted(state.services.items())],
        "entrypoints": [
            {"host": h, "project": e.project, "https": e.https} for h, e in sorted(state.entrypoints.items())
        ],
        "challenges": dict(sorted(state.challenges.items())),
        "certificates": dict(sorted(state.certificates.items())),
    }


def _list(d: Mapping[str, object], key: str) -> list[object]:
    value = d.get(key, [])
    if not isinstance(value, list):
        raise BadRequest(f"state.{key} must be a list")
    return value


def _str_map(d: Mapping[str, object], key: str) -> dict[str, str]:
    value = _object(d.get(key, {}), f"state.{key}")
    if not all(isinstance(v, str) for v in value.values()):
        raise BadRequest(f"state.{key} must map names to strings")
    return {k: str(v) for k, v in value.items()}


def from_json(data: object) -> State:
    """The state a state file holds; :class:`BadRequest` names what is wrong in it."""
    d = _object(data, "state")
    state = State(config=None if d.get("config") is None else parse_config(d["config"]))
    for item in _list(d, "services"):
        s = _object(item, "state.services[]")
        state = put_service(state, parse_service(_str(s, "project", "state"), _str(s, "run", "state"), s.get("spec")))
    for item in _list(d, "entrypoints"):
        e = _object(item, "state.entrypoints[]")
        state = put_entrypoint(
            state, parse_entrypoint(_str(e, "host", "state"), {k: e.get(k) for k in ("project", "https")})
        )
    challenges = {check_token(k): v for k, v in _str_map(d, "challenges").items()}
    certificates = {check_host(k, "state.certificates"): v for k, v in _str_map(d, "certificates").items()}
    return replace(state, challenges=challenges, certificates=certificates)
