"""What a request on :80 or :443 gets: a direct answer (an ACME challenge, a 301 to https, a 404) or a forward
(to which upstream path, with which rate limits, auth and limits).

:func:`build_table` turns the state into a host index once per change; :func:`decide` then costs one dict
lookup per request, however many services the gateway serves.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional, Union

from .model import DEFAULT_CLIENT_MAX_BODY_SIZE, DEFAULT_READ_TIMEOUT, Entrypoint, RateLimit, Service, State

CHALLENGE_PREFIX = "/.well-known/acme-challenge/"
#: The model endpoint's paths (dstack 0.22.5 serves ``/models`` and ``/chat/completions`` on ``gateway.<domain>``,
#: its docs' concepts/gateways page); corral serves them under ``/v1/`` too (dstack issue #1546).
MODEL_PATHS = ("/models", "/chat/completions")
_DOT_SEGMENT = re.compile(r"(^|/)(\.|%2e){1,2}(/|$)", re.IGNORECASE)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    location: Optional[str] = None


@dataclass(frozen=True)
class Forward:
    """Forward to ``{server_url}{target}``."""

    target: str
    project: str
    service: Optional[tuple[str, str]]  # (project, run); None for the model endpoint (the server counts it)
    auth: bool
    rate_limits: tuple[RateLimit, ...]
    client_max_body_size: int
    read_timeout: int


Decision = Union[Answer, Forward]
Table = Mapping[str, Union[Service, Entrypoint]]


def build_table(state: State) -> dict[str, Union[Service, Entrypoint]]:
    table: dict[str, Union[Service, Entrypoint]] = dict(state.entrypoints)
    table.update({svc.host: svc for svc in state.services.values()})
    return table


def host_of(header: Optional[str]) -> str:
    """The Host header's name, lowercased, without the port (``[v6]:port`` kept as ``[v6]``)."""
    value = (header or "").strip().lower()
    if value.startswith("["):
        return value.split("]", 1)[0] + "]"
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _not_found(what: str) -> Answer:
    return Answer(404, f"{what}\n".encode())


def decide(table: Table, challenges: Mapping[str, str], https: bool, host: str, target: str) -> Decision:
    """The decision for ``target`` (origin form: path and query) on ``host``, over TLS or not."""
    path = target.split("?", 1)[0]
    if not path.startswith("/") or _DOT_SEGMENT.search(path):
        return Answer(400, b"Bad request target\n")
    if not https and path.startswith(CHALLENGE_PREFIX):
        token = path[len(CHALLENGE_PREFIX) :]
        if token in challenges:
            return Answer(200, challenges[token].encode())
        return _not_found("No such challenge")
    entry = table.get(host)
    if entry is None:
        return _not_found(f"No service at {host or 'this address'}")
    if entry.https and not https:
        return Answer(301, b"", location=f"https://{host}{target}")
    if isinstance(entry, Service):
        return Forward(
            target=entry.upstream_path.rstrip("/") + target,
            project=entry.project,
            service=(entry.project, entry.run),
            auth=entry.auth,
            rate_limits=entry.rate_limits,
            client_max_body_size=entry.client_max_body_size,
            read_timeout=entry.read_timeout,
        )
    model_path = path[3:] if path.startswith("/v1/") else path
    if model_path not in MODEL_PATHS:
        return _not_found("The model endpoint serves /models and /chat/completions (also under /v1/)")
    query = target[len(path) :]
    return Forward(
        target=f"/proxy/models/{entry.project}{model_path}{query}",
        project=entry.project,
        service=None,
        auth=True,
        rate_limits=(),
        client_max_body_size=DEFAULT_CLIENT_MAX_BODY_SIZE,
        read_timeout=DEFAULT_READ_TIMEOUT,
    )
