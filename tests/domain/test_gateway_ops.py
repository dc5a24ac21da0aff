"""The gateways' operation's decisions: next step, registrations (dangling ones withdrawn, changed ones sent
again), model entry points, the hosts needing a certificate, stats turned into requests, status messages."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from corral.domain import gateway_ops as ops
from corral.domain.gateway_ops import CertificateState, Entrypoint, Registered
from corral.domain.gateways import GatewayRec, GatewayService, RateLimit, ServiceModel
from corral.domain.statuses import GatewayStatus

DAY = 86400.0
#: A certificate issued at NOW for 90 days (Let's Encrypt's lifetime, as the test's own fact).
NOW = datetime(2026, 12, 6, tzinfo=timezone.utc).timestamp()


def gateway(**kw: Any) -> GatewayRec:
    base = GatewayRec(
        id="g1", project_id="p1", project_name="main", name="gw", status=GatewayStatus.RUNNING,
        status_message=None, configuration={"certificate": {"type": "lets-encrypt"}},
        wildcard_domain="*.gw.example.test", is_default=True, to_be_deleted=False, created_at=0.0,
        instance_id="i1", hostname="10.0.0.11", secret_hash="h", secret_sealed="s", connection=None,
        last_seen_at=None,
    )  # fmt: skip
    return replace(base, **kw)


def service(run: str = "svc", **kw: Any) -> GatewayService:
    base = GatewayService(
        project_name="main", run_name=run, run_id=f"id-{run}", host=f"{run}.gw.example.test", https=True,
        auth=True, rate_limits=(), model=None, upstream_path=f"/proxy/services/main/{run}/",
    )  # fmt: skip
    return replace(base, **kw)


def test_next_step() -> None:
    assert ops.next_step(gateway(to_be_deleted=True)) == "delete"
    assert ops.next_step(gateway(status=GatewayStatus.SUBMITTED)) == "deploy"
    assert ops.next_step(gateway(status=GatewayStatus.PROVISIONING)) == "deploy"  # a restart mid-deploy (#2677)
    assert ops.next_step(gateway(status=GatewayStatus.SUBMITTED, instance_id=None)) == "wait"
    assert ops.next_step(gateway()) == "operate"
    assert ops.next_step(gateway(status=GatewayStatus.FAILED)) == "wait"
    # a gateway on a VM of its own: the VM first, then the deploy at its address
    aws = {"backend": "aws", "region": "us-east-1"}
    assert ops.next_step(gateway(status=GatewayStatus.SUBMITTED, configuration=aws, hostname=None)) == "provision"
    assert ops.next_step(gateway(status=GatewayStatus.PROVISIONING, configuration=aws, hostname=None)) == "provision"
    assert ops.next_step(gateway(status=GatewayStatus.PROVISIONING, configuration=aws, instance_id=None)) == "deploy"


def test_registration_body_carries_rate_limits_of_both_keys() -> None:
    limits = (
        RateLimit("/", "ip_address", None, 2.0, 0),
        RateLimit("/api", "header", "X-Key", 0.5, 3),
    )
    body = ops.registration_body(service(rate_limits=limits))
    assert body["rate_limits"] == [
        {"prefix": "/", "key": {"type": "ip_address"}, "rps": 2.0, "burst": 0},
        {"prefix": "/api", "key": {"type": "header", "header": "X-Key"}, "rps": 0.5, "burst": 3},
    ]
    assert body["host"] == "svc.gw.example.test" and body["upstream_path"] == "/proxy/services/main/svc/"
    assert body["client_max_body_size"] == 64 * 2**20 and body["read_timeout"] == 300


def test_registrations_withdraw_dangling_and_send_missing_or_changed() -> None:
    g = gateway()
    a, b, c = service("a"), service("b"), service("c")
    actual = [
        Registered("main", "a", a.host, True),  # as wanted and sent before: left alone
        Registered("main", "b", "old.gw.example.test", True),  # another host: sent again
        Registered("main", "gone", "gone.gw.example.test", True),  # no longer wanted (#3046)
    ]
    sent = {("main", "a"): ops.registration_body(a), ("main", "b"): ops.registration_body(b)}
    plan = ops.registrations(g, [a, b, c], actual, sent, [])
    assert plan.unregister == (("main", "gone"),)
    assert [s.run_name for s, _ in plan.register] == ["b", "c"]
    assert plan.entrypoints == ()
    # after a restart nothing was sent: everything is sent again
    again = ops.registrations(g, [a], [Registered("main", "a", a.host, True)], {}, [])
    assert [s.run_name for s, _ in again.register] == ["a"]
    # another scheme is another registration
    flipped = ops.registrations(g, [a], [Registered("main", "a", a.host, False)], sent, [])
    assert [s.run_name for s, _ in flipped.register] == ["a"]


def test_model_services_bring_their_entrypoint_once() -> None:
    g = gateway()
    model = ServiceModel("m", "chat", "openai", "/v1")
    m = service("llm", model=model)
    plan = ops.registrations(g, [m, service("plain")], [], {}, [])
    assert plan.entrypoints == (Entrypoint("gateway.gw.example.test", "main", True),)
    assert ops.registrations(g, [m], [], {}, plan.entrypoints).entrypoints == ()
    no_tls = gateway(configuration={"certificate": None})
    assert ops.entrypoint(no_tls, m) == Entrypoint("gateway.gw.example.test", "main", False)
    assert ops.entrypoint(gateway(wildcard_domain=None), m) is None


def test_certificate_hosts() -> None:
    points = [Entrypoint("gateway.d", "main", True), Entrypoint("gateway.e", "main", False)]
    hosts = ops.certificate_hosts([service("a"), service("b", https=False)], points)
    assert hosts == ["a.gw.example.test", "gateway.d"]


def test_hosts_to_certify() -> None:
    hosts = ["new", "fresh", "old", "failed", "failed-long-ago", "unrecorded"]
    on_gateway = {"fresh": NOW + 80 * DAY, "old": NOW + 20 * DAY, "unrecorded": NOW + 20 * DAY}
    known = {
        "fresh": CertificateState("fresh", NOW - 10 * DAY, NOW + 80 * DAY, None, None),
        "old": CertificateState("old", NOW - 70 * DAY, NOW + 20 * DAY, None, None),
        "failed": CertificateState("failed", None, None, NOW - 600, "DNS points elsewhere"),
        "failed-long-ago": CertificateState("failed-long-ago", None, None, NOW - 7200, "DNS points elsewhere"),
    }
    assert ops.hosts_to_certify(hosts, on_gateway, known, NOW) == ["new", "old", "failed-long-ago", "unrecorded"]
    # a certificate the gateway serves that is not the one recorded: its start is not known (90 days assumed)
    other = {"fresh": CertificateState("fresh", NOW - 1 * DAY, NOW + 400 * DAY, None, None)}
    assert ops.hosts_to_certify(["fresh"], {"fresh": NOW + 80 * DAY}, other, NOW) == []
    recorded_no_start = {"x": CertificateState("x", None, NOW + 20 * DAY, None, None)}
    assert ops.hosts_to_certify(["x"], {"x": NOW + 20 * DAY}, recorded_no_start, NOW) == ["x"]


def test_certificates_issued_before_the_acme_servers_reset_are_due() -> None:
    reset = NOW - 60.0
    before = CertificateState("before", NOW - DAY, NOW + 5 * 365 * DAY, None, None, issued_at=NOW - DAY)
    after = CertificateState("after", NOW - 30, NOW + 5 * 365 * DAY, None, None, issued_at=NOW - 30)
    untimed = CertificateState("untimed", NOW - DAY, NOW + 5 * 365 * DAY, None, None)  # recorded before issued_at
    failed_since = CertificateState("failed-since", NOW - DAY, NOW + 5 * 365 * DAY, NOW - 10, "rate limited", NOW - DAY)
    unissued = CertificateState("unissued", None, None, NOW - 7200, "DNS points elsewhere")
    assert [ops.issued_before_reset(s, reset) for s in (before, after, untimed, unissued, None)] == [
        True, False, True, False, False,
    ]  # fmt: skip
    assert not ops.issued_before_reset(before, None)  # no reset found

    known = {s.host: s for s in (before, after, untimed, failed_since)}
    on_gateway = {h: s.not_after for h, s in known.items() if s.not_after is not None}
    hosts = sorted(known)
    assert ops.hosts_to_certify(hosts, on_gateway, known, NOW, reset) == ["before", "untimed"]
    assert ops.hosts_to_certify(hosts, on_gateway, known, NOW) == []  # long-lived, and no reset
    # a certificate the gateway serves that is not the one recorded (installed by hand): the renewal rule alone
    by_hand = {"before": NOW + 80 * DAY}
    assert ops.hosts_to_certify(["before"], by_hand, known, NOW, reset) == []


def test_new_requests_and_status_message() -> None:
    assert ops.new_requests(10, 4) == 6
    assert ops.new_requests(3, 5) == 0  # a restarted gateway counts from zero again
    assert ops.status_message("no route to host", {"a": "x"}) == "Gateway unreachable: no route to host"
    assert ops.status_message(None, {"b.d": "DNS", "a.d": "timeout"}) == (
        "Certificate for a.d: timeout; Certificate for b.d: DNS"
    )
    assert ops.status_message(None, {}) is None
