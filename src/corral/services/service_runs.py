"""The `service` run type at submission: what corral's in-server proxy refuses (a 400 naming the field),
one job spec per replica (``replica_num`` global across replica groups, as dstack numbers them) and one
template per replica group (what rollouts and autoscaling submit), the probes resolved as dstack writes
them into the job spec, and the run's ``service`` field (``url`` = ``/proxy/services/<project>/<run>/``, or
``<scheme>://<run>.<domain>`` on a gateway; ``model.base_url``).

Pure functions over the parsed configuration and plain dicts; imports ``services.errors``, ``domain.gateways``
(and ``config``'s types) only.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corral.domain.gateways import Publication, model_base_url, service_host, service_https, service_url
from corral.services.errors import ServiceError

if TYPE_CHECKING:
    from corral.config.services import ReplicaGroup, ServiceConfiguration

#: dstack's server limits (``DSTACK_SERVER_MAX_PROBES_PER_JOB``, ``DSTACK_SERVER_MAX_PROBE_TIMEOUT``).
MAX_PROBES = 10
MAX_PROBE_TIMEOUT = 300
#: dstack's ``OPENAI_MODEL_PROBE_TIMEOUT``: the default probe of an OpenAI model service.
OPENAI_MODEL_PROBE_TIMEOUT = 30
#: Group-level fields the replicas of one run do not take from a group yet (set at the service level).
_GROUP_ONLY_AT_SERVICE_LEVEL = ("image", "docker", "privileged", "python", "nvcc", "spot_policy", "reservation")


def check_service(conf: ServiceConfiguration, on_gateway: bool = False) -> None:  # noqa: C901
    """Raise ``ServiceError`` for what a service may say but corral does not do (yet); ``on_gateway``: it is
    published on a gateway (which applies ``rate_limits`` and serves ``https: false``)."""
    if conf.rate_limits and not on_gateway:
        raise ServiceError(
            "`rate_limits` are not supported when running services without a gateway: remove `rate_limits` "
            "from the service configuration"
        )
    if conf.https is False and not on_gateway:
        raise ServiceError("`https`: Setting `https: False` is not allowed without a gateway.")
    if conf.model is not None and conf.model.format == "tgi":
        raise ServiceError(
            "`model`: the `tgi` format is not supported yet; serve an OpenAI-compatible API (`format: openai`)"
        )
    for group in conf.replica_groups:
        where = "`replicas`" if conf.groups is None else f"`groups` ({group.name})"
        if group.router is not None:
            raise ServiceError(f"{where}: replica groups with a `router` are not supported yet; remove `router`")
        if (group.replicas.max or 0) < 1:
            raise ServiceError(f"{where}: a service needs at least one replica; set `replicas: 1` or more")
        if conf.groups is not None:
            for field in _GROUP_ONLY_AT_SERVICE_LEVEL:
                if getattr(group, field) is not None:
                    raise ServiceError(
                        f"`groups` ({group.name}): `{field}` in a replica group is not supported yet; "
                        "set it at the service level"
                    )
    if getattr(conf, "schedule", None) and all((g.replicas.min or 0) == 0 for g in conf.replica_groups):
        raise ServiceError("Scheduled services with autoscaling to zero are not supported")
    probes = conf.probes or []
    if len(probes) > MAX_PROBES:
        raise ServiceError(f"`probes`: at most {MAX_PROBES} probes are allowed, got {len(probes)}")
    for i, p in enumerate(probes):
        if p.timeout is not None and p.timeout > MAX_PROBE_TIMEOUT:
            raise ServiceError(f"`probes[{i}].timeout` cannot be longer than {MAX_PROBE_TIMEOUT}s")


def probe_specs(conf: ServiceConfiguration) -> list[dict[str, Any]]:
    """dstack's ``ProbeSpec``s: the configured probes with defaults resolved, or an OpenAI model's default
    probe when ``probes`` is omitted (``probes: []`` disables probing)."""
    if conf.probes is None:
        model = conf.model
        if model is None or model.format != "openai":
            return []
        import orjson

        body = {"model": model.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        return [
            {
                "type": "http",
                "url": model.prefix.rstrip("/") + "/chat/completions",
                "method": "post",
                "headers": [{"name": "Content-Type", "value": "application/json"}],
                "body": orjson.dumps(body).decode(),
                "timeout": OPENAI_MODEL_PROBE_TIMEOUT,
                "interval": 15,
                "ready_after": 1,
                "until_ready": False,
            }
        ]
    return [
        {
            "type": "http",
            "url": p.url or "/",
            "method": p.method or "get",
            "headers": [{"name": h.name, "value": h.value} for h in p.headers],
            "body": p.body,
            "timeout": int(p.timeout) if p.timeout is not None else 10,
            "interval": int(p.interval) if p.interval is not None else 15,
            "ready_after": p.ready_after or 1,
            "until_ready": bool(p.until_ready),
        }
        for p in conf.probes
    ]


def _group_spec(
    run_name: str,
    base: dict[str, Any],
    conf: ServiceConfiguration,
    group: ReplicaGroup,
    probes: list[dict[str, Any]],
    replica_num: int,
) -> dict[str, Any]:
    js = copy.deepcopy(base)
    js.update(
        replica_num=replica_num,
        job_name=f"{run_name}-0-{replica_num}",
        replica_group=group.name,
        commands=list(group.commands or conf.commands or []),
        service_port=conf.port_mapping.container_port,
        probes=copy.deepcopy(probes),
    )
    js["requirements"]["resources"] = group.resources.model_dump(mode="json")
    if js["requirements"].get("spot") is None:
        js["requirements"]["spot"] = False  # a service runs on-demand unless told otherwise (dstack)
    return js


def replica_job_specs(run_name: str, base: dict[str, Any], conf: ServiceConfiguration) -> list[dict[str, Any]]:
    """One job spec per replica of every group (``replicas.min`` of each), from ``base`` (the run's
    one-node job spec)."""
    probes = probe_specs(conf)
    out = []
    replica_num = 0
    for group in conf.replica_groups:
        for _ in range(int(group.replicas.min or 0)):
            out.append(_group_spec(run_name, base, conf, group, probes, replica_num))
            replica_num += 1
    return out


def group_templates(run_name: str, base: dict[str, Any], conf: ServiceConfiguration) -> list[dict[str, Any]]:
    """One job spec per replica group (``replica_num`` 0): what new replicas of each group are made from
    (rollouts, autoscaling), and what ``runs/get_plan`` shows."""
    probes = probe_specs(conf)
    return [_group_spec(run_name, base, conf, group, probes, 0) for group in conf.replica_groups]


def replica_of(template: dict[str, Any], run_name: str, replica_num: int) -> dict[str, Any]:
    """A group's template as the job spec of replica ``replica_num``."""
    return {**template, "replica_num": replica_num, "job_name": f"{run_name}-0-{replica_num}"}


def group_plans(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first job spec of each replica group: ``runs/get_plan`` shows one job plan per group (dstack)."""
    seen: set[str] = set()
    out = []
    for js in specs:
        group = str(js.get("replica_group") or "0")
        if group not in seen:
            seen.add(group)
            out.append(js)
    return out


def plan_specs(specs: list[dict[str, Any]], templates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One job spec per replica group for ``runs/get_plan``: its first replica's, or (a group at zero
    replicas) its template."""
    first = {str(js.get("replica_group") or "0"): js for js in reversed(specs)}
    return [first.get(str(t.get("replica_group") or "0"), t) for t in templates]


def proxy_path(project_name: str, run_name: str) -> str:
    return f"/proxy/services/{project_name}/{run_name}/"


def service_field(
    project_name: str, run_name: str, configuration: Mapping[str, Any], gateway: Publication | None = None
) -> dict[str, Any] | None:
    """The run's ``service`` (dstack's ``ServiceSpec``) from its stored configuration and the gateway it is
    published on (None: the in-server proxy); None for other types. On a gateway, ``url`` is
    ``<scheme>://<run>.<domain>`` and a model's ``base_url`` as dstack 0.22.5 makes them (``domain/gateways.py``)."""
    if configuration.get("type") != "service":
        return None
    model = configuration.get("model")
    if gateway is not None:
        https = service_https(configuration.get("https"), gateway.has_certificate)
        url = service_url(service_host(run_name, gateway, project_name), https)
        base_url = model_base_url(url, model, gateway, project_name) if isinstance(model, dict) else ""
    else:
        url = proxy_path(project_name, run_name)
        base_url = url.rstrip("/") + str(model.get("prefix") or "/v1") if isinstance(model, dict) else ""
    if not isinstance(model, dict):
        return {"url": url, "model": None, "options": {}}
    return {
        "url": url,
        "model": {"name": model.get("name"), "base_url": base_url, "type": model.get("type", "chat")},
        "options": {"openai": {"model": model}},
    }
