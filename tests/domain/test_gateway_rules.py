"""Gateways' pure rules: which configurations corral hosts (dstack 0.22.5's messages), what an apply may change
in place, and where a service on a gateway is published (``Run.service.url``, ``model.base_url``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from corral.domain.events import gateway_target, status_change_message
from corral.domain.gateways import (
    GatewayRec,
    apply_refusal,
    changed_fields,
    configuration_error,
    host_fleet_refusal,
    https_refusal,
    model_base_url,
    project_domain,
    publication,
    publish_refusal,
    rate_limits,
    service_host,
    service_https,
    service_model,
    service_url,
    updatable_in_place,
)
from corral.domain.statuses import GatewayStatus

# dstack 0.22.5's wire dump of a gateway configuration with its defaults (``GatewayConfiguration``)
CONF: dict[str, Any] = {
    "type": "gateway", "name": "gw", "default": None, "backend": "remote", "region": "edge",
    "instance_type": None, "domain": "example.test", "public_ip": True, "load_balancer": None,
    "certificate": {"type": "lets-encrypt"}, "replicas": None, "tags": None,
}  # fmt: skip


def gateway(**kw: Any) -> GatewayRec:
    base = GatewayRec(
        id="g1", project_id="p1", project_name="main", name="gw", status=GatewayStatus.RUNNING,
        status_message=None, configuration=CONF, wildcard_domain="example.test", is_default=True,
        to_be_deleted=False, created_at=1.0, instance_id="i1", hostname="10.0.0.5", secret_hash=None,
        secret_sealed=None, connection=None, last_seen_at=None,
    )  # fmt: skip
    return replace(base, **kw)


def test_a_remote_gateway_on_a_fleet_is_accepted() -> None:
    assert configuration_error(CONF) is None
    assert configuration_error({**CONF, "domain": None, "replicas": 1, "certificate": None}) is None
    for domain in ("*.example.test", "*.${{ run.project_name }}.Example.TEST", "gw-1.example.test", "localhost"):
        assert configuration_error({**CONF, "domain": domain}) is None, domain
    assert gateway().fleet_name == "edge" and gateway().has_certificate


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"backend": "gcp"},
            "Gateways are not supported for gcp backend. Available backends with gateway support: ['remote', 'aws']",
        ),
        (
            {"public_ip": False},
            "Private gateways are not supported for remote backend. Available backends with "
            "private gateway support: ['aws']",
        ),
        ({"replicas": 2}, "Cannot provision 2 gateway replicas. This server allows at most 1"),
        ({"load_balancer": {"type": "alb"}}, "`load_balancer: { type: alb }` is supported for `aws` and `gcp`"),
        ({"certificate": {"type": "acm", "arn": "x"}}, "The `acm` certificate type is not supported for remote"),
        ({"instance_type": "t3.micro"}, "`instance_type` does not apply"),
        ({"domain": "${{ run.nope }}.example.test"}, "Cannot interpolate gateway domain name"),
        ({"domain": "https://example.test"}, "domain: 'https://example.test' is not a domain name. Give one like"),
        ({"domain": "example.test:8443"}, "domain: 'example.test:8443' is not a domain name"),
        ({"domain": "example.test."}, "domain: 'example.test.' is not a domain name"),
        ({"domain": "my domain.test"}, "domain: 'my domain.test' is not a domain name"),
        ({"domain": "-edge.example.test"}, "domain: '-edge.example.test' is not a domain name"),
        ({"domain": "a." + "b" * 64 + ".test"}, "domain: 'a.bbbb"),
        ({"domain": ""}, "domain: '' is not a domain name"),
    ],
)
def test_what_corral_cannot_host_is_refused_with_dstacks_words(change: dict[str, Any], message: str) -> None:
    got = configuration_error({**CONF, **change})
    assert got is not None and got.startswith(message), got


AWS = {**CONF, "backend": "aws", "region": "us-east-1"}


def test_which_fleets_host_a_remote_gateway() -> None:
    # an SSH fleet, whatever the project's backends; a local fleet of a project that has the local backend
    assert host_fleet_refusal("edge", True, None, ()) is None
    assert host_fleet_refusal("edge", False, None, {"local"}) is None
    assert host_fleet_refusal("edge", False, ["remote"], {"local", "aws"}) is None  # `local` goes as `remote`
    assert host_fleet_refusal("edge", False, ["local"], {"local"}) is None
    # a cloud fleet, or a fleet of a project without the local backend: refused, naming the fleet and the fixes
    for backends, project in ((["aws"], {"local", "aws"}), (None, {"aws"})):
        message = host_fleet_refusal("edge", False, backends, project)
        assert message is not None and message.startswith("Fleet edge is neither an SSH fleet nor a local fleet")
        assert "Fix `region`" in message and "`backend: aws`" in message


def test_an_aws_gateway_is_a_vm_of_its_own() -> None:
    assert configuration_error(AWS) is None
    assert configuration_error({**AWS, "instance_type": "t3.small", "tags": {"team": "a"}}) is None
    # a private gateway serves plain HTTP only: a CA cannot reach it to validate a certificate
    assert configuration_error({**AWS, "public_ip": False, "certificate": None}) is None
    g = gateway(configuration=AWS)
    assert g.backend == "aws" and g.own_vm and not gateway().own_vm and gateway().backend == "remote"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"public_ip": False}, "lets-encrypt certificate type is not supported for private gateways"),
        ({"load_balancer": {"type": "alb"}}, "`load_balancer: { type: alb }` is not supported by corral's aws"),
        ({"certificate": {"type": "acm", "arn": "x"}}, "The `acm` certificate type is not supported for aws"),
    ],
)
def test_what_an_aws_gateway_refuses(change: dict[str, Any], message: str) -> None:
    got = configuration_error({**AWS, **change})
    assert got is not None and got.startswith(message), got


def test_the_domain_a_project_sees() -> None:
    assert project_domain("*.example.test", "main") == "example.test"
    assert project_domain("${{ run.project_name }}.example.test", "team") == "team.example.test"


def test_only_domain_default_and_replicas_change_in_place() -> None:
    assert changed_fields(CONF, CONF) == []
    assert changed_fields(CONF, {**CONF, "default": None}) == []
    assert changed_fields({**CONF, "default": True}, {**CONF, "default": False, "domain": "b.test"}) == [
        "default",
        "domain",
    ]
    assert changed_fields({**CONF, "extra": 1}, CONF) == ["extra"]
    assert updatable_in_place(CONF, {**CONF, "domain": "b.test", "replicas": 1})
    assert not updatable_in_place(CONF, {**CONF, "region": "other"})


def test_an_apply_over_an_existing_gateway() -> None:
    assert apply_refusal(gateway(), {**CONF, "domain": "b.test"}) is None
    assert apply_refusal(gateway(to_be_deleted=True), CONF) == "Gateway 'gw' is being deleted. Try again later."
    assert apply_refusal(gateway(status=GatewayStatus.FAILED), CONF) == (
        "Gateway 'gw' is in FAILED status and cannot be updated in-place. Delete it and re-apply."
    )
    assert apply_refusal(gateway(), {**CONF, "region": "other"}) == (
        "Gateway 'gw' cannot be updated in-place. Delete it and re-apply."
    )


def test_when_a_service_cannot_be_published() -> None:
    assert publish_refusal(gateway()) is None
    assert publish_refusal(gateway(to_be_deleted=True)) == "Gateway gw is marked for deletion"
    assert publish_refusal(gateway(instance_id=None)) == "Gateway has no instance associated with it"
    # a gateway on a VM of its own has no fleet instance: its VM's address is its host
    assert publish_refusal(gateway(instance_id=None, configuration=AWS)) is None
    no_vm_yet = gateway(instance_id=None, hostname=None, configuration=AWS)
    assert publish_refusal(no_vm_yet) == "Gateway has no instance associated with it"
    assert publish_refusal(gateway(status=GatewayStatus.PROVISIONING)) == "Gateway status is not running"
    assert publish_refusal(gateway(wildcard_domain=None)) == "Domain is required for gateway"


def test_the_scheme_of_a_service() -> None:
    assert service_https(None, True) is True
    assert service_https(False, True) is False
    assert service_https("auto", True) is True
    assert service_https("auto", False) is False
    assert https_refusal(None, True) is None and https_refusal("auto", False) is None
    assert https_refusal(False, False) is None
    assert https_refusal(None, False) == "Cannot run HTTPS service on gateway with no SSL certificates configured"
    assert https_refusal(True, False) is not None


def test_the_url_and_model_url_of_a_service() -> None:
    pub = publication(gateway(wildcard_domain="*.example.test"))
    assert (pub.gateway_name, pub.wildcard_domain, pub.has_certificate) == ("gw", "*.example.test", True)
    host = service_host("svc", pub, "main")
    assert host == "svc.example.test"
    url = service_url(host, True)
    assert url == "https://svc.example.test"
    assert service_url(host, False) == "http://svc.example.test"
    assert model_base_url(url, {"format": "openai", "prefix": "/v1"}, pub, "main") == "https://svc.example.test/v1"
    assert model_base_url(url, {"format": "tgi"}, pub, "main") == "https://gateway.example.test"
    plain = publication(gateway(configuration={**CONF, "certificate": None}, wildcard_domain=None))
    assert plain.wildcard_domain == "" and not plain.has_certificate
    plain = replace(plain, wildcard_domain="example.test")
    assert model_base_url("http://svc.example.test", {"format": "tgi"}, plain, "main") == "http://gateway.example.test"


def test_a_services_rate_limits_and_model_as_values() -> None:
    limits = rate_limits(
        [{"prefix": "/", "key": {"type": "ip_address"}, "rps": 2.0, "burst": 3},
         {"prefix": "/api", "key": {"type": "header", "header": "X-Key"}, "rps": 0.5}]
    )  # fmt: skip
    assert [(r.prefix, r.key, r.header, r.rps, r.burst) for r in limits] == [
        ("/", "ip_address", None, 2.0, 3),
        ("/api", "header", "X-Key", 0.5, 0),
    ]
    assert service_model(None) is None
    m = service_model({"name": "llama", "type": "chat", "format": "openai", "prefix": "/v1"})
    assert m is not None and (m.name, m.type, m.format, m.prefix) == ("llama", "chat", "openai", "/v1")


def test_a_gateways_events_target_it_and_tell_its_status_message() -> None:
    t = gateway_target("p1", "g1", "gw")
    assert (t.type, t.project_id, t.id, t.name) == ("gateway", "p1", "g1", "gw")
    assert status_change_message("gateway", "submitted", "failed", None, "No idle instance") == (
        "Gateway status changed SUBMITTED -> FAILED (No idle instance)"
    )
