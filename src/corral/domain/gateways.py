"""Gateways (dstack 0.22.5's ``type: gateway``): the record, the configuration rules corral applies, what an
apply does to an existing gateway, and what a service published on a gateway is (its host, URL, model URL,
and the registration the gateway's operation sends to the gateway's process).

Where a gateway runs in corral: ``backend: remote`` and ``region: <an SSH or local fleet of the project>``; the
gateway is held on one idle instance of that fleet (an SSH host, or this server's machine for a local fleet), or
``backend: aws`` on a VM of its own (dstack 0.22.5 has no gateway on a fleet's instance: "You can create gateways with
the aws, azure, gcp, or kubernetes backends", dstack's docs, concepts/gateways; an on-prem gateway was asked
for in dstack issue #1402).

Pure: imports the standard library and ``domain`` only.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from corral.domain.interpolation import InterpolationError, interpolate
from corral.domain.statuses import GatewayStatus

#: The wire backends corral hosts gateways on: an SSH fleet's host (``remote``, as dstack names those), and a VM of
#: its own on ``aws`` (as dstack's ``ComputeWithGatewaySupport`` does).
GATEWAY_BACKENDS = ("remote", "aws")
#: The backends whose gateways may be private (``public_ip: false``; dstack's ``ComputeWithPrivateGatewaySupport``).
PRIVATE_GATEWAY_BACKENDS = ("aws",)
#: An aws gateway's instance type when the configuration names none (dstack 0.22.5's aws default, core/backends/aws).
AWS_INSTANCE_TYPE = "t3.micro"
#: How many replicas a gateway may have: one host (dstack's default cap is 9, ``DSTACK_SERVER_GATEWAY_MAX_REPLICAS``,
#: for cloud VMs behind a load balancer; corral's gateway is one fleet host).
MAX_REPLICAS = 1
#: The fields an apply may change in place (dstack 0.22.5 ``_CONF_UPDATABLE_FIELDS``); any other is a re-create.
UPDATABLE_FIELDS = ("domain", "default", "replicas")
#: dstack's effective default of a service's ``https`` (``SERVICE_HTTPS_DEFAULT``).
HTTPS_DEFAULT = True
#: The backends of the instances a ``backend: remote`` gateway may be held on: an SSH fleet's host, or this server's
#: own machine (an instance of a local fleet); a cloud instance is not (a gateway gets a VM of its own there).
HOST_BACKENDS = ("ssh", "local")
#: The message of a gateway whose fleet has no idle instance to hold.
NO_IDLE_HOST = "No idle instance in fleet {fleet} to host the gateway"


@dataclass(frozen=True)
class GatewayRec:
    """A gateway row. ``configuration`` is dstack's wire dump of its ``GatewayConfiguration`` as applied (its
    ``domain`` kept equal to ``wildcard_domain``); ``instance_id``/``hostname``: the fleet host it is held on
    and its address; ``secret_hash``: sha256 of its secret (what the in-server proxy compares against);
    ``secret_sealed``: the secret sealed with the server's key (the server's own use: the gateway process's
    configuration); ``connection``/``last_seen_at``: what the gateway's operation keeps to reach it again."""

    id: str
    project_id: str
    project_name: str
    name: str
    status: GatewayStatus
    status_message: str | None
    configuration: Mapping[str, Any]
    wildcard_domain: str | None
    is_default: bool
    to_be_deleted: bool
    created_at: float
    instance_id: str | None
    hostname: str | None
    secret_hash: str | None
    secret_sealed: str | None
    connection: Mapping[str, Any] | None
    last_seen_at: float | None

    @property
    def fleet_name(self) -> str:
        """The SSH or local fleet the gateway's host is taken from (its ``region``)."""
        return str(self.configuration.get("region") or "")

    @property
    def backend(self) -> str:
        """Where the gateway runs: ``remote`` (an SSH fleet's host or a local fleet's) or ``aws`` (a VM of its own)."""
        return str(self.configuration.get("backend") or "remote")

    @property
    def own_vm(self) -> bool:
        """Whether the gateway runs on a VM the backend brings up for it (not on a fleet's host)."""
        return self.backend != "remote"

    @property
    def has_certificate(self) -> bool:
        """Whether the gateway serves TLS (``certificate`` is not null)."""
        return self.configuration.get("certificate") is not None


def host_fleet_refusal(
    fleet: str, ssh: bool, fleet_backends: Sequence[str] | None, project_backends: Collection[str]
) -> str | None:
    """Why the fleet ``fleet`` cannot host a ``backend: remote`` gateway (None when it can): an SSH fleet
    (``ssh``) can, and so can a local fleet (one whose ``backends``, if it names any, include the local backend,
    ``remote`` on the wire, of a project that has it); a fleet of cloud instances cannot."""
    if ssh:
        return None
    local = "local" in project_backends and (not fleet_backends or bool({"local", "remote"} & set(fleet_backends)))
    if local:
        return None
    return (
        f"Fleet {fleet} is neither an SSH fleet nor a local fleet: a gateway with `backend: remote` runs on a host "
        "of an SSH fleet (`ssh_config`) or on this server's machine (a fleet of the local backend), taking its "
        "ports 80 and 443; a cloud fleet's instance cannot host it. Fix `region`, or use `backend: aws` for a "
        "gateway on a VM of its own"
    )


def configuration_error(conf: Mapping[str, Any]) -> str | None:
    """dstack's 400 for a gateway configuration corral cannot host (``conf``: the wire dump, defaults filled
    in), or None. The messages are dstack's where dstack has one (``services/gateways/__init__.py``)."""
    backend = str(conf.get("backend"))
    if backend not in GATEWAY_BACKENDS:
        return (
            f"Gateways are not supported for {backend} backend. "
            f"Available backends with gateway support: {list(GATEWAY_BACKENDS)}"
        )
    private = conf.get("public_ip") is False
    if private and backend not in PRIVATE_GATEWAY_BACKENDS:
        return (
            f"Private gateways are not supported for {backend} backend. "
            f"Available backends with private gateway support: {list(PRIVATE_GATEWAY_BACKENDS)}"
        )
    replicas = conf.get("replicas")
    if replicas is not None and int(replicas) > MAX_REPLICAS:
        return f"Cannot provision {replicas} gateway replicas. This server allows at most {MAX_REPLICAS}"
    if conf.get("load_balancer") is not None:
        if backend == "aws":
            return (
                "`load_balancer: { type: alb }` is not supported by corral's aws gateways: the gateway is one VM "
                "with its own address. Remove `load_balancer`"
            )
        return "`load_balancer: { type: alb }` is supported for `aws` and `gcp` backends only"
    refusal = _certificate_error(conf.get("certificate"), backend, private)
    if refusal is not None:
        return refusal
    if backend == "remote" and conf.get("instance_type") is not None:
        return (
            "`instance_type` does not apply to a gateway on a fleet's instance (backend: remote): the gateway "
            "takes an idle instance of the fleet `region` names. Remove `instance_type`"
        )
    domain = conf.get("domain")
    return None if domain is None else domain_error(str(domain))


#: A DNS name as services' hosts ``<run>.<domain>`` need it (RFC 1123 §2.1: labels of letters, digits and ``-``,
#: not starting or ending with ``-``, 63 characters at most; RFC 1035 §2.3.4: 253 characters in all).
_DOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


def domain_error(domain: str) -> str | None:
    """Why ``domain`` cannot be a gateway's domain (None when it can): it must interpolate (dstack's check) and
    be a DNS name once a leading ``*.`` is stripped, else no service host under it can be served or certified."""
    try:
        name = project_domain(domain, "main")
    except InterpolationError as e:
        return f"Cannot interpolate gateway domain name: {e}"
    if _DOMAIN.match(name.lower()):
        return None
    return (
        f"domain: {domain!r} is not a domain name. Give one like example.com or *.example.com (letters, digits, "
        "'-' and '.'; no scheme, port, path or trailing dot): services are published at <run>.<domain>"
    )


def _certificate_error(cert: Any, backend: str, private: bool) -> str | None:
    """Why ``certificate`` cannot be had on the gateway (None when it can): corral gets Let's Encrypt's (or
    another ACME CA's) certificates by HTTP-01, which a private gateway cannot answer (dstack's rule)."""
    if not isinstance(cert, Mapping):
        return None
    kind = cert.get("type")
    if kind != "lets-encrypt":
        return f"The `{kind}` certificate type is not supported for {backend} backend: use lets-encrypt or null"
    if private:
        return (
            "lets-encrypt certificate type is not supported for private gateways: the CA cannot reach a gateway "
            "without a public IP. Set `certificate: null` (HTTP only) or `public_ip: true`"
        )
    return None


def project_domain(wildcard_domain: str, project_name: str) -> str:
    """The gateway's domain as a project's services use it: a leading ``*.`` stripped and
    ``${{ run.project_name }}`` interpolated (dstack's ``get_gateway_configuration`` + interpolation)."""
    domain = wildcard_domain[2:] if wildcard_domain.startswith("*.") else wildcard_domain
    return interpolate(domain, {"run": {"project_name": project_name}})


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The configuration fields ``new`` changes (``default`` unset in ``new`` changes nothing: dstack's
    client omits it when unset), in the wire dump's order."""
    keys = list(new) + [k for k in old if k not in new]
    return [k for k in keys if old.get(k) != new.get(k) and not (k == "default" and new.get(k) is None)]


def updatable_in_place(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether applying ``new`` over ``old`` changes only what an apply may change in place."""
    return all(f in UPDATABLE_FIELDS for f in changed_fields(old, new))


def apply_refusal(gateway: GatewayRec, new: Mapping[str, Any]) -> str | None:
    """dstack's 400 for applying ``new`` to the existing ``gateway`` in place, or None when it may be."""
    if gateway.to_be_deleted:
        return f"Gateway '{gateway.name}' is being deleted. Try again later."
    if gateway.status == GatewayStatus.FAILED:
        return f"Gateway '{gateway.name}' is in FAILED status and cannot be updated in-place. Delete it and re-apply."
    if not updatable_in_place(gateway.configuration, new):
        return f"Gateway '{gateway.name}' cannot be updated in-place. Delete it and re-apply."
    return None


# --- services on a gateway ----------------------------------------------------------------------------


def publish_refusal(gateway: GatewayRec) -> str | None:
    """Why a service cannot be put on ``gateway`` now (dstack's ``assign_service`` checks), or None."""
    if gateway.to_be_deleted:
        return f"Gateway {gateway.name} is marked for deletion"
    if gateway.instance_id is None and not (gateway.own_vm and gateway.hostname):
        return "Gateway has no instance associated with it"
    if gateway.status != GatewayStatus.RUNNING:
        return "Gateway status is not running"
    if not gateway.wildcard_domain:
        return "Domain is required for gateway"
    return None


@dataclass(frozen=True)
class Publication:
    """Where a service is published: its gateway's name and wildcard domain, and whether the gateway serves TLS
    (what a run keeps of its gateway to tell its URL)."""

    gateway_name: str
    wildcard_domain: str
    has_certificate: bool


def publication(gateway: GatewayRec) -> Publication:
    return Publication(gateway.name, gateway.wildcard_domain or "", gateway.has_certificate)


def https_refusal(https: bool | Literal["auto"] | None, has_certificate: bool) -> str | None:
    """dstack's 400 for a service's ``https`` on a gateway with or without a certificate, or None."""
    if https != "auto" and (HTTPS_DEFAULT if https is None else bool(https)) and not has_certificate:
        return "Cannot run HTTPS service on gateway with no SSL certificates configured"
    return None


def service_https(https: bool | Literal["auto"] | None, has_certificate: bool) -> bool:
    """Whether a service on a gateway is served over HTTPS: its ``https`` (true by default; ``auto``: iff the
    gateway has a certificate)."""
    if https == "auto":
        return has_certificate
    return HTTPS_DEFAULT if https is None else bool(https)


def service_host(run_name: str, pub: Publication, project_name: str) -> str:
    """``<run>.<domain>``: where a service of ``project_name`` is published on its gateway."""
    return f"{run_name}.{project_domain(pub.wildcard_domain, project_name)}"


def service_url(host: str, https: bool) -> str:
    """dstack's ``Run.service.url`` on a gateway: no trailing slash."""
    return f"{'https' if https else 'http'}://{host}"


def model_base_url(url: str, model: Mapping[str, Any], pub: Publication, project_name: str) -> str:
    """dstack's ``Run.service.model.base_url`` on a gateway: an OpenAI-format model's is the service's URL with
    the model's ``prefix``; any other model's is the gateway's model endpoint ``<scheme>://gateway.<domain>``
    (https iff the gateway has a certificate)."""
    if model.get("format", "openai") == "openai":
        return url + str(model.get("prefix") or "/v1")
    scheme = "https" if pub.has_certificate else "http"
    return f"{scheme}://gateway.{project_domain(pub.wildcard_domain, project_name)}"


@dataclass(frozen=True)
class RateLimit:
    """A service's rate limit as the gateway applies it (dstack's ``RateLimit``): requests under ``prefix``
    (longest prefix wins), per ``key`` (``ip_address``, or the value of ``header``), ``rps`` with ``burst``."""

    prefix: str
    key: Literal["ip_address", "header"]
    header: str | None
    rps: float
    burst: int


@dataclass(frozen=True)
class ServiceModel:
    """A service's ``model`` (what the gateway's model endpoint serves)."""

    name: str
    type: str
    format: str
    prefix: str


@dataclass(frozen=True)
class GatewayService:
    """A service that should be registered on a gateway: where it is published (``host``, ``https``), whether
    the gateway checks the caller's token (``auth``), its ``rate_limits``, its ``model`` and the path on the
    server the gateway forwards to (``upstream_path``: the in-server proxy's, ``/proxy/services/<p>/<run>/``)."""

    project_name: str
    run_name: str
    run_id: str
    host: str
    https: bool
    auth: bool
    rate_limits: tuple[RateLimit, ...]
    model: ServiceModel | None
    upstream_path: str


def rate_limits(raw: Sequence[Mapping[str, Any]]) -> tuple[RateLimit, ...]:
    """A service configuration's ``rate_limits`` (wire dump, defaults filled in) as values."""
    out = []
    for r in raw:
        key = r.get("key") or {}
        kind: Literal["ip_address", "header"] = "header" if key.get("type") == "header" else "ip_address"
        out.append(
            RateLimit(
                prefix=str(r.get("prefix") or "/"),
                key=kind,
                header=str(key["header"]) if kind == "header" else None,
                rps=float(r["rps"]),
                burst=int(r.get("burst") or 0),
            )
        )
    return tuple(out)


def service_model(raw: Mapping[str, Any] | None) -> ServiceModel | None:
    """A service configuration's ``model`` (wire dump) as a value."""
    if raw is None:
        return None
    return ServiceModel(
        name=str(raw.get("name")),
        type=str(raw.get("type") or "chat"),
        format=str(raw.get("format") or "openai"),
        prefix=str(raw.get("prefix") or "/v1"),
    )
