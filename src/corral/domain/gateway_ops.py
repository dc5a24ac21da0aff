"""What the gateways' operation decides (pure): the next step of a gateway, the registrations to send and
withdraw, the hosts that need a certificate, the requests a gateway's stats add for the autoscaler, and the
status message of a running gateway.

Each pass of ``workers/gateways.py`` loads the gateways and what they should serve, asks these functions
what to do, does it over the gateway's management API, and writes the outcome.

Pure: imports the standard library and ``domain`` only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from corral.domain.certificates import CertificateDates, attempt_due
from corral.domain.gateways import GatewayRec, GatewayService, project_domain
from corral.domain.statuses import GatewayStatus

Step = Literal["delete", "provision", "deploy", "operate", "wait"]
#: The stats window (seconds) a pass turns into requests for the autoscaler: dstack's shortest, so a pass
#: every few seconds sees each request once.
STATS_WINDOW = 30
#: What the status message of a gateway that does not answer starts with (and its event says).
UNREACHABLE = "Gateway unreachable"
#: dstack's defaults of a service on a gateway (``DSTACK_DEFAULT_SERVICE_CLIENT_MAX_BODY_SIZE``: 64 MiB,
#: ``DSTACK_SERVICE_CLIENT_TIMEOUT``: 300 s; dstack 0.22.5 ``proxy/gateway/resources/nginx/service.jinja2``).
CLIENT_MAX_BODY_SIZE = 64 * 2**20
READ_TIMEOUT = 300


@dataclass(frozen=True)
class Registered:
    """A service as the gateway's ``GET /api/services`` lists it."""

    project: str
    run: str
    host: str
    https: bool


@dataclass(frozen=True)
class WindowStats:
    requests: int
    request_time: float


@dataclass(frozen=True)
class ServiceStats:
    """A service's stats as the gateway's ``GET /api/stats`` gives them, by window (seconds)."""

    project: str
    run: str
    stats: Mapping[int, WindowStats]


@dataclass(frozen=True)
class Entrypoint:
    """The model endpoint of a project's services on a gateway: ``gateway.<domain>``."""

    host: str
    project: str
    https: bool


@dataclass(frozen=True)
class Registrations:
    """What a pass sends: services to withdraw, services to (re-)register with their bodies, entry points."""

    unregister: tuple[tuple[str, str], ...]
    register: tuple[tuple[GatewayService, Mapping[str, Any]], ...]
    entrypoints: tuple[Entrypoint, ...]


def next_step(g: GatewayRec) -> Step:
    """What a pass does with the gateway: remove it, deploy it (again after a restart in the middle of a
    deploy: a gateway is never left in ``provisioning``), look after it, or nothing (not held on a host). A
    gateway on a VM of its own (``aws``) has its VM brought up first (``provision``) until it has an address."""
    if g.to_be_deleted:
        return "delete"
    if g.status in (GatewayStatus.SUBMITTED, GatewayStatus.PROVISIONING):
        if g.own_vm:
            return "deploy" if g.hostname is not None else "provision"
        return "deploy" if g.instance_id is not None else "wait"
    if g.status == GatewayStatus.RUNNING:
        return "operate"
    return "wait"


def registration_body(svc: GatewayService) -> dict[str, Any]:
    """``PUT /api/services/{project}/{run}``'s body for ``svc``."""
    limits = []
    for r in svc.rate_limits:
        key: dict[str, str] = {"type": "header", "header": r.header or ""} if r.key == "header" else {"type": r.key}
        limits.append({"prefix": r.prefix, "key": key, "rps": r.rps, "burst": r.burst})
    return {
        "host": svc.host,
        "https": svc.https,
        "auth": svc.auth,
        "upstream_path": svc.upstream_path,
        "rate_limits": limits,
        "client_max_body_size": CLIENT_MAX_BODY_SIZE,
        "read_timeout": READ_TIMEOUT,
    }


def entrypoint(g: GatewayRec, svc: GatewayService) -> Entrypoint | None:
    """The model endpoint a service with a ``model`` brings (https iff the gateway has a certificate)."""
    if svc.model is None or not g.wildcard_domain:
        return None
    host = "gateway." + project_domain(g.wildcard_domain, svc.project_name)
    return Entrypoint(host, svc.project_name, g.has_certificate)


def registrations(
    g: GatewayRec,
    desired: Sequence[GatewayService],
    actual: Sequence[Registered],
    sent: Mapping[tuple[str, str], Mapping[str, Any]],
    sent_entrypoints: Iterable[Entrypoint],
) -> Registrations:
    """Unregister what the gateway serves but should not (a dangling registration: dstack #3046), register what
    it lacks, serves under another host or scheme, or was last sent another body (``sent``: the bodies this
    server sent since it started; empty after a restart, so that everything is sent again); the entry points
    of model services not sent yet."""
    wanted = {(s.project_name, s.run_name): s for s in desired}
    have = {(r.project, r.run): r for r in actual}
    unregister = tuple(sorted(k for k in have if k not in wanted))
    register = []
    for key, svc in sorted(wanted.items()):
        body = registration_body(svc)
        got = have.get(key)
        if got is None or got.host != svc.host or got.https != svc.https or sent.get(key) != body:
            register.append((svc, body))
    done = set(sent_entrypoints)
    points = {e for s in desired if (e := entrypoint(g, s)) is not None and e not in done}
    return Registrations(unregister, tuple(register), tuple(sorted(points, key=lambda e: e.host)))


def certificate_hosts(desired: Sequence[GatewayService], entrypoints: Iterable[Entrypoint]) -> list[str]:
    """The hosts served over HTTPS (services and model endpoints): each needs its certificate."""
    hosts = {s.host for s in desired if s.https} | {e.host for e in entrypoints if e.https}
    return sorted(hosts)


def new_requests(in_window: int, recorded: int) -> int:
    """Requests the gateway counted in its last ``STATS_WINDOW`` seconds that the seconds recorded for it over
    the same span do not hold yet (never negative: a restarted gateway starts its counts again)."""
    return max(0, in_window - recorded)


def status_message(unreachable: str | None, certificate_errors: Mapping[str, str]) -> str | None:
    """A running gateway's status message: why it does not answer, else the certificate errors by host."""
    if unreachable is not None:
        return f"{UNREACHABLE}: {unreachable}"
    if certificate_errors:
        return "; ".join(f"Certificate for {h}: {why}" for h, why in sorted(certificate_errors.items()))
    return None


@dataclass(frozen=True)
class CertificateState:
    """What the server knows of a host's certificate on a gateway: its validity (as issued), its last
    failure (when and why), and when the server began the issuance of the certificate it recorded (None: not
    recorded, as for certificates issued before the server kept it)."""

    host: str
    not_before: float | None
    not_after: float | None
    failed_at: float | None
    error: str | None
    issued_at: float | None = None


#: The lifetime assumed for a certificate whose start the server did not record (one the gateway had before):
#: Let's Encrypt's 90 days (letsencrypt.org/docs/faq, "What is the lifetime for Let's Encrypt certificates?").
ASSUMED_LIFETIME = timedelta(days=90)


def issued_before_reset(state: CertificateState | None, reset_at: float | None) -> bool:
    """Whether the certificate recorded in ``state`` came from the ACME server before it lost its state (at
    ``reset_at``: a new root, so that clients trusting its current root refuse the chain). A certificate recorded
    without its issuance time was issued before the server kept it, so before any reset it found."""
    if reset_at is None or state is None or state.not_after is None:
        return False
    return state.issued_at is None or state.issued_at < reset_at


def hosts_to_certify(
    hosts: Sequence[str],
    on_gateway: Mapping[str, float],
    known: Mapping[str, CertificateState],
    now: float,
    reset_at: float | None = None,
) -> list[str]:
    """The hosts of ``hosts`` to get a certificate for now (``on_gateway``: host -> not_after of the certificate
    the gateway serves), by the renewal rule of ``domain.certificates``: none served, or a third of its lifetime
    left, or the one served is the one recorded and it was issued before the ACME server's reset (``reset_at``,
    :func:`issued_before_reset`); and no failed attempt for the host in the last hour."""
    out = []
    for host in hosts:
        state = known.get(host)
        not_after = on_gateway.get(host)
        recorded = not_after is not None and _served_is_recorded(state, not_after)
        dates = None  # none served, or the one served is as good as none: the CA's reset made its chain stale
        if not_after is not None and not (recorded and issued_before_reset(state, reset_at)):
            end = datetime.fromtimestamp(not_after, timezone.utc)
            start = (
                datetime.fromtimestamp(state.not_before, timezone.utc)
                if recorded and state is not None and state.not_before is not None
                else end - ASSUMED_LIFETIME
            )
            dates = CertificateDates(start, end)
        failed = state.failed_at if state is not None else None
        failed_at = datetime.fromtimestamp(failed, timezone.utc) if failed is not None else None
        if attempt_due(dates, failed_at, datetime.fromtimestamp(now, timezone.utc)):
            out.append(host)
    return out


def _served_is_recorded(state: CertificateState | None, not_after: float) -> bool:
    """Whether the certificate the gateway serves (``not_after``) is the one the server recorded."""
    return state is not None and state.not_after is not None and abs(state.not_after - not_after) < 1.0
