"""A gateway run for real by the server: deployed on an SSH fleet's host, its certificate got from a private ACME
CA (pebble) by HTTP-01, a service on the local fleet served at ``https://<run>.<domain>`` (verified against
pebble's root only; the system store refuses it; 403 without a token, with a bad one or a non-member's), its
process killed and started again by the next pass, a stopped service withdrawn, the host gone ("Gateway
unreachable"; the service still served by the in-server proxy) and back, a restarted server registering the
service again, a certificate refused when DNS points at a host with nothing on port 80, a certificate due for
renewal renewed from a CA that restarted with a new root, a certificate not due issued again once the server
notices that the CA lost its state (its account forgotten), and deleting it closes ports 80/443 and gives the host
back to jobs."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ssh_harness import (
    SSH_SETTINGS,
    apply_fleet,
    delete_all_fleets,
    fleet_settled,
    get_fleet,
    host_run,
    ssh_fleet,
    stop_all_runs,
)

import gateway_client
from fakehosts import FakeHosts
from pebble_harness import PebbleLab
from server_harness import RunningServer, fleet_body, get_run, make_settings, running_server, wait_for

G = "/api/project/main/gateways"
DOMAIN = "gw.example.test"
APP = base64.b64encode((Path(__file__).parent.parent / "proxy" / "replica_app.py").read_bytes()).decode()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PebbleLab]:
    pebble = PebbleLab(tmp_path_factory.mktemp("pebble")).start()
    try:
        yield pebble
    finally:
        pebble.stop()


def _settings(tmp_path: Path, lab: PebbleLab, **extra: Any) -> Any:
    return make_settings(
        tmp_path,
        **{**SSH_SETTINGS, "safety_net_interval": 1.0, "provisioning_timeout": 20.0},
        acme_server=lab.directory_url,
        acme_ca_bundle=lab.ca_bundle,
        sandbox="on",  # the replicas in their own network namespaces
        **extra,
    )


@pytest.fixture
async def server(tmp_path: Path, hosts: FakeHosts, lab: PebbleLab) -> AsyncIterator[RunningServer]:
    async with running_server(_settings(tmp_path, lab)) as s:
        yield s


def _open(ip: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((ip, port)) == 0


async def gateway(c: httpx.AsyncClient, name: str) -> dict[str, Any] | None:
    r = await c.post(G + "/get", json={"name": name})
    return dict(r.json()) if r.status_code == 200 else None


async def gateway_is(c: httpx.AsyncClient, name: str, status: str) -> dict[str, Any] | None:
    g = await gateway(c, name)
    if g is not None and g["status"] == "failed" and status != "failed":
        raise AssertionError(f"the gateway failed: {g['status_message']}")
    return g if g is not None and g["status"] == status else None


async def publish(server: RunningServer, run_name: str, gateway_id: str) -> None:
    """Put the service on the gateway (as the service's ``gateway:`` does)."""
    import sqlalchemy as sa

    from corral.store.tables import runs

    async with server.ctx.db.write() as conn:
        await conn.execute(sa.update(runs).where(runs.c.run_name == run_name).values(gateway_id=gateway_id))
    server.ctx.wakeups.wake("gateways")


async def start_service(c: httpx.AsyncClient, name: str) -> None:
    if (await c.post("/api/project/main/fleets/get", json={"name": "local"})).status_code != 200:
        r = await c.post("/api/project/main/fleets/apply", json=fleet_body(name="local", nodes="0..2"))
        assert r.status_code == 200, r.text
    conf = {
        "type": "service", "name": name, "port": 8000,
        "commands": [f"echo {APP} | base64 -d > app.py", "exec python3 app.py 8000"],
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."}, "fleets": ["local"],
    }  # fmt: skip
    r = await c.post(
        "/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {"configuration": conf}}}
    )
    assert r.status_code == 200, r.text

    async def ready() -> bool:
        run = await get_run(c, name)
        return any(j["job_submissions"][-1].get("corral_ready") for j in run["jobs"])

    await wait_for(ready, timeout=60, interval=0.3)


async def test_a_gateway_serves_a_service_over_tls_and_is_removed(
    server: RunningServer, hosts: FakeHosts, lab: PebbleLab, tmp_path: Path
) -> None:
    ip = hosts.ip("cpu1")
    lab.set_default_ipv4(ip)
    root = tmp_path / "pebble-root.pem"
    root.write_text(lab.root_pem())
    host = f"svc.{DOMAIN}"
    async with server.client() as c:
        await _edge_fleet(c, hosts, ip)
        await start_service(c, "svc")
        gw = await _gateway_on_edge(c)
        assert _open(ip, 80) and _open(ip, 443)
        await publish(server, "svc", gw["id"])

        async def served() -> gateway_client.Answer | None:
            with contextlib.suppress(OSError, ssl.SSLError, asyncio.TimeoutError):
                got = await gateway_client.request(
                    ip, host, "/whoami", cafile=str(root), headers={"Authorization": f"Bearer {server.token}"}
                )
                return got if got.status == 200 else None
            return None

        await wait_for(served, timeout=60, interval=0.5)
        anon = await gateway_client.request(ip, host, "/whoami", cafile=str(root))
        assert anon.status == 403, anon
        assert b"Unauthenticated or unauthorized to access project main" in anon.body
        # a token the server does not know, and a user of the server who is not a member of the project: 403 too
        r = await c.post("/api/users/create", json={"username": "outsider", "global_role": "user"})
        assert r.status_code == 200, r.text
        outsider = (await c.post("/api/users/get_user", json={"username": "outsider"})).json()["creds"]["token"]
        for bearer in ("not-a-token-of-this-server", outsider):
            got = await gateway_client.request(
                ip, host, "/whoami", cafile=str(root), headers={"Authorization": f"Bearer {bearer}"}
            )
            assert got.status == 403 and b"Unauthenticated or unauthorized" in got.body, got
        with pytest.raises(ssl.SSLCertVerificationError):
            await gateway_client.request(ip, host, "/whoami", cafile=None)  # the system store refuses pebble's root
        plain = await gateway_client.request(ip, host, "/whoami", cafile=None, port=80, tls=False)
        assert plain.status == 301 and plain.headers["location"] == f"https://{host}/whoami"

        # the gateway's process dies: the next pass starts it again, and it serves what it kept
        await host_run(hosts, "cpu1", "kill -9 $(cat ~/.corral-gateway/gateway.pid)")
        await wait_for(served, timeout=30, interval=0.5)

        r = await c.post("/api/events/list", json={"target_gateways": [gw["id"]], "ascending": True})
        messages = [e["message"] for e in r.json()]
        assert f"Certificate for {host} issued" in messages, messages
        async with server.ctx.db.read() as conn:  # the ACME account key is kept sealed
            from corral.store import gateway_ops

            sealed = await gateway_ops.acme_account(conn, lab.directory_url)
        assert sealed is not None and sealed.startswith("enc:") and "PRIVATE KEY" not in sealed, sealed

        # deleted (its service stopped first): ports 80/443 closed, the host is the fleet's again
        r = await c.post(G + "/delete", json={"names": ["gw"]})
        assert r.status_code == 400 and "publishes services svc" in r.text, r.text
        await stop_all_runs(c)

        async def withdrawn() -> bool:  # the stopped service is withdrawn from the gateway: its own 404
            got = await gateway_client.request(
                ip, host, "/whoami", cafile=str(root), headers={"Authorization": f"Bearer {server.token}"}
            )
            return got.status == 404 and got.body == f"No service at {host}\n".encode()

        await wait_for(withdrawn, timeout=30, interval=0.5)
        r = await c.post(G + "/delete", json={"names": ["gw"]})
        assert r.status_code == 200, r.text
        await wait_for(lambda: _gone(c, "gw"), timeout=30)
        assert not _open(ip, 80) and not _open(ip, 443)
        inst = (await get_fleet(c, "edge"))["instances"][0]
        assert inst["status"] == "idle", inst


async def _edge_fleet(c: httpx.AsyncClient, hosts: FakeHosts, ip: str) -> None:
    """The SSH fleet ``edge`` of the one host at ``ip``, settled."""
    await apply_fleet(c, ssh_fleet(hosts, "edge", [ip]))
    await wait_for(lambda: fleet_settled(c, "edge", 1), timeout=40)


async def _gateway_on_edge(c: httpx.AsyncClient) -> dict[str, Any]:
    """The gateway ``gw`` of :data:`DOMAIN` on the fleet ``edge``'s host, once running."""
    conf = {"type": "gateway", "name": "gw", "backend": "remote", "region": "edge", "domain": DOMAIN}
    r = await c.post(G + "/apply", json={"plan": {"spec": {"configuration": conf}}, "force": False})
    assert r.status_code == 200, r.text
    gw: dict[str, Any] = await wait_for(lambda: gateway_is(c, "gw", "running"), timeout=60)
    return gw


async def _gone(c: httpx.AsyncClient, name: str) -> bool:
    return await gateway(c, name) is None


async def _served(ip: str, host: str, root: Path, token: str) -> gateway_client.Answer | None:
    with contextlib.suppress(OSError, ssl.SSLError, asyncio.TimeoutError):
        got = await gateway_client.request(
            ip, host, "/whoami", cafile=str(root), headers={"Authorization": f"Bearer {token}"}
        )
        return got if got.status == 200 else None
    return None


async def _messages(c: httpx.AsyncClient, **target: list[str]) -> list[str]:
    r = await c.post("/api/events/list", json={**target, "ascending": True})
    return [e["message"] for e in r.json()]


#: Run on the gateway's host: withdraw the service ``svc`` of project ``main`` from the gateway through its
#: management API (its loopback port and token are in ``~/.corral-gateway``), and check it is gone.
WITHDRAW_SVC = """python3 - <<'PY'
import pathlib, urllib.request
d = pathlib.Path.home() / ".corral-gateway"
token, port = (d / "token").read_text().strip(), (d / "gateway.port").read_text().strip()
auth = {"Authorization": "Bearer " + token}
url = "http://127.0.0.1:" + port + "/api/services"
urllib.request.urlopen(urllib.request.Request(url + "/main/svc", method="DELETE", headers=auth), timeout=5).read()
assert b'"svc"' not in urllib.request.urlopen(urllib.request.Request(url, headers=auth), timeout=5).read()
print("withdrawn")
PY
"""


async def test_restart_unreachable_host_and_a_certificate_dns_cannot_get(
    hosts: FakeHosts, lab: PebbleLab, tmp_path: Path
) -> None:
    ip = hosts.ip("cpu1")
    lab.set_default_ipv4(ip)
    bad_host = f"bad.{DOMAIN}"
    lab.add_a(bad_host + ".", [hosts.gateway])  # DNS points at an address with nothing on port 80
    root = tmp_path / "pebble-root.pem"
    root.write_text(lab.root_pem())
    host = f"svc.{DOMAIN}"
    settings = make_settings(
        tmp_path,
        **{**SSH_SETTINGS, "safety_net_interval": 1.0, "provisioning_timeout": 20.0},
        acme_server=lab.directory_url,
        acme_ca_bundle=lab.ca_bundle,
        sandbox="on",
    )
    try:
        async with running_server(settings) as s, s.client() as c:
            token = s.token
            await _edge_fleet(c, hosts, ip)
            await start_service(c, "svc")
            await start_service(c, "bad")
            gw = await _gateway_on_edge(c)
            await publish(s, "svc", gw["id"])
            await publish(s, "bad", gw["id"])
            await wait_for(lambda: _served(ip, host, root, token), timeout=60, interval=0.5)

            async def cert_error() -> str | None:
                g = await gateway(c, "gw")
                return g["status_message"] if g and bad_host in (g["status_message"] or "") else None

            message = await wait_for(cert_error, timeout=60, interval=0.5)
            assert message.startswith(f"Certificate for {bad_host}: "), message
            assert hosts.gateway in message, message  # the address DNS points at, named
            bad_run = await get_run(c, "bad")
            assert bad_run["status"] == "running"  # the run goes on
            events = await _messages(c, target_runs=[bad_run["id"]])
            assert any(m.startswith(f"Certificate for {bad_host} failed: ") for m in events), events

            # the host goes away: "Gateway unreachable"; back (rebooted: the process gone): served again
            hosts.kill("cpu1")

            async def unreachable() -> bool:
                g = await gateway(c, "gw")
                return bool(g and (g["status_message"] or "").startswith("Gateway unreachable: "))

            await wait_for(unreachable, timeout=60, interval=0.5)
            assert (await gateway(c, "gw") or {})["status"] == "running"
            # meanwhile the service keeps its in-server proxy URL
            r = await c.get("/proxy/services/main/svc/whoami")
            assert r.status_code == 200, r.text
            hosts.revive("cpu1")
            await wait_for(lambda: _served(ip, host, root, token), timeout=60, interval=0.5)

            async def back() -> list[str] | None:  # written once the pass that found it again ends
                events = await _messages(c, target_gateways=[gw["id"]])
                return events if "Gateway reachable again" in events else None

            events = await wait_for(back, timeout=30, interval=0.5)
            assert any(m.startswith("Gateway unreachable: ") for m in events), events
        # the server stops; the gateway goes on running (it reaches the services through the server) ...
        assert _open(ip, 443) and not await _served(ip, host, root, token)
        # ... and forgets the service meanwhile (withdrawn through its management API, on the host)
        withdrawn = await host_run(hosts, "cpu1", WITHDRAW_SVC)
        assert withdrawn.exit_status == 0 and "withdrawn" in withdrawn.stdout, withdrawn
        async with running_server(settings) as s, s.client() as c:
            # ... and a restarted server reaches it again through new forwards, and registers the service again
            await wait_for(lambda: _served(ip, host, root, token), timeout=30, interval=0.5)
            await stop_all_runs(c)
            assert (await c.post(G + "/delete", json={"names": ["gw"]})).status_code == 200
            await wait_for(lambda: _gone(c, "gw"), timeout=30)
            assert not _open(ip, 80)
    finally:
        lab.clear_a(bad_host + ".")


async def test_model_endpoint_and_scaling_from_zero_on_the_gateways_counts(
    hosts: FakeHosts, lab: PebbleLab, tmp_path: Path
) -> None:
    from corral.store import gateway_ops

    ip = hosts.ip("cpu1")
    lab.set_default_ipv4(ip)
    root = tmp_path / "pebble-root.pem"
    root.write_text(lab.root_pem())
    settings = make_settings(
        tmp_path,
        **{**SSH_SETTINGS, "safety_net_interval": 1.0, "provisioning_timeout": 20.0},
        acme_server=lab.directory_url,
        acme_ca_bundle=lab.ca_bundle,
        sandbox="on",
        service_scaling_tick=0.2,
        service_scaling_window=4.0,
    )
    async with running_server(settings) as s, s.client() as c:
        auth = {"Authorization": f"Bearer {s.token}"}
        await _edge_fleet(c, hosts, ip)
        r = await c.post("/api/project/main/fleets/apply", json=fleet_body(name="local", nodes="0..2"))
        assert r.status_code == 200, r.text
        conf = {
            "type": "service", "name": "llm", "port": 8000, "model": "org/m", "env": {"MODEL": "org/m"},
            "commands": [f"echo {APP} | base64 -d > app.py", "exec python3 app.py 8000"],
            "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."}, "fleets": ["local"],
            "probes": [{"type": "http", "url": "/health", "interval": "1s"}],
            "replicas": "0..2",
            "scaling": {"metric": "rps", "target": 2, "scale_up_delay": "1s", "scale_down_delay": "3s"},
        }  # fmt: skip
        r = await c.post(
            "/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {"configuration": conf}}}
        )
        assert r.status_code == 200, r.text
        gconf = {"type": "gateway", "name": "gw", "backend": "remote", "region": "edge", "domain": DOMAIN}
        r = await c.post(G + "/apply", json={"plan": {"spec": {"configuration": gconf}}, "force": False})
        assert r.status_code == 200, r.text
        gw = await wait_for(lambda: gateway_is(c, "gw", "running"), timeout=60)
        await publish(s, "llm", gw["id"])
        entry = f"gateway.{DOMAIN}"

        async def entry_certified() -> bool:
            with contextlib.suppress(OSError, ssl.SSLError, asyncio.TimeoutError):
                got = await gateway_client.request(ip, entry, "/models", cafile=str(root), headers=auth)
                return got.status == 200
            return False

        await wait_for(entry_certified, timeout=60, interval=0.5)
        models = await gateway_client.request(ip, entry, "/models", cafile=str(root), headers=auth)
        assert [m["id"] for m in json.loads(models.body)["data"]] == ["org/m"], models
        # the service's own name is certified apart from the entry's; until then SNI refuses it
        await wait_for(
            lambda: gateway_client.certified(ip, f"llm.{DOMAIN}", cafile=str(root)), timeout=60, interval=0.5
        )
        # at zero replicas: a request to the service's host is held until the service has scaled up
        chat: dict[str, Any] = {"model": "org/m", "messages": [{"role": "user", "content": "hi"}]}
        got = await gateway_client.request(
            ip, f"llm.{DOMAIN}", "/v1/chat/completions", cafile=str(root), method="POST",
            body=json.dumps(chat).encode(), headers={**auth, "Content-Type": "application/json"}, timeout=90,
        )  # fmt: skip
        assert got.status == 200 and json.loads(got.body)["model"] == "org/m", got
        # the model endpoint, streamed, with and without /v1
        chat["stream"] = True
        for path in ("/chat/completions", "/v1/chat/completions"):
            got = await gateway_client.request(
                ip, entry, path, cafile=str(root), method="POST", body=json.dumps(chat).encode(),
                headers={**auth, "Content-Type": "application/json"}, timeout=90,
            )  # fmt: skip
            assert got.status == 200, got
            events = [line for line in got.body.decode().splitlines() if line.startswith("data: ")]
            assert events[-1] == "data: [DONE]" and "org/m" in events[-2], events
        anon = await gateway_client.request(ip, entry, "/models", cafile=str(root))
        assert anon.status == 403, anon

        # a service whose host is the model endpoint's: the gateway refuses it, the run is told (and waits on)
        clash = {**conf, "name": "gateway", "fleets": ["edge"], "replicas": 1}
        clash.pop("scaling")
        r = await c.post(
            "/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {"configuration": clash}}}
        )
        assert r.status_code == 200, r.text
        await publish(s, "gateway", gw["id"])

        async def refused() -> list[str] | None:
            got = await _messages(c, target_runs=[r.json()["id"]])
            found = [m for m in got if m.startswith("Service registration on gateway gw failed: ")]
            return found or None

        (told,) = await wait_for(refused, timeout=30, interval=0.5)
        assert f"gateway.{DOMAIN}" in told, told

        async def counted_by_gateway() -> int:
            """The requests recorded from the gateway's stats (rows under its own name)."""
            run_id = (await get_run(c, "llm"))["id"]
            async with s.ctx.db.read() as conn:
                rows = await gateway_ops.recorded_requests(conn, f"gateway:{gw['id']}", [run_id], 0)
            return rows.get(run_id, 0)

        # the held request and the model endpoint's were counted by the server (each once), not by the gateway
        assert await counted_by_gateway() == 0

        # under load through the gateway (about 10 rps, target 2 a replica): a second replica, on the gateway's
        # counts alone (the in-server proxy does not count what a gateway forwards to a service with replicas)
        async def two_ready() -> bool:
            run = await get_run(c, "llm")
            live = [j["job_submissions"][-1] for j in run["jobs"]]
            return sum(1 for x in live if x["status"] == "running" and x.get("corral_ready")) == 2

        deadline = asyncio.get_running_loop().time() + 60
        while not await two_ready():
            assert asyncio.get_running_loop().time() < deadline, await get_run(c, "llm")
            for _ in range(5):
                got = await gateway_client.request(ip, f"llm.{DOMAIN}", "/whoami", cafile=str(root), headers=auth)
                assert got.status == 200, got
                await asyncio.sleep(0.1)
        assert await wait_for(counted_by_gateway, timeout=20, interval=0.5) >= 1

        async def scaled_to_zero() -> bool:
            run = await get_run(c, "llm")
            live = [j["job_submissions"][-1] for j in run["jobs"]]
            return bool(live) and all(x["status"] in ("terminated", "done", "aborted") for x in live)

        await wait_for(scaled_to_zero, timeout=60, interval=0.5)  # no traffic: back to zero


async def test_a_fleet_login_that_is_not_root_fails_the_gateway_with_the_reason(
    hosts: FakeHosts, tmp_path: Path
) -> None:
    key = Path(f"{hosts.key}.pub").read_text().strip()
    setup = (
        "id gwuser >/dev/null 2>&1 || useradd -m -s /bin/sh gwuser; usermod -p '*' gwuser; mkdir -p ~gwuser/.ssh; "
        f"echo '{key}' > ~gwuser/.ssh/authorized_keys; chown -R gwuser ~gwuser/.ssh; chmod 700 ~gwuser/.ssh"
    )
    assert (await host_run(hosts, "cpu2", setup)).exit_status == 0
    # a login that is not root runs the host's agent without a sandbox
    settings = make_settings(tmp_path, **{**SSH_SETTINGS, "safety_net_interval": 1.0}, sandbox="off")
    try:
        async with running_server(settings) as server, server.client() as c:
            fleet = ssh_fleet(hosts, "edge", [hosts.ip("cpu2")])
            fleet["ssh_config"]["user"] = "gwuser"
            await apply_fleet(c, fleet)
            settled = await wait_for(lambda: fleet_settled(c, "edge", 1), timeout=40)
            assert [i["status"] for i in settled["instances"]] == ["idle"], settled["instances"]
            conf = {"type": "gateway", "name": "gw", "backend": "remote", "region": "edge", "domain": DOMAIN}
            r = await c.post(G + "/apply", json={"plan": {"spec": {"configuration": conf}}, "force": False})
            assert r.status_code == 200, r.text
            failed = await wait_for(lambda: gateway_is(c, "gw", "failed"), timeout=60)
            assert "needs root" in failed["status_message"] and "gwuser" in failed["status_message"], failed
            events = await _messages(c, target_gateways=[failed["id"]])
            assert any("PROVISIONING -> FAILED" in m and "needs root" in m for m in events), events
            assert (await c.post(G + "/delete", json={"names": ["gw"]})).status_code == 200
            await wait_for(lambda: _gone(c, "gw"), timeout=30)
            await delete_all_fleets(c)
    finally:
        await host_run(hosts, "cpu2", "pkill -u gwuser; userdel -r gwuser; true")


def _short_lived_certificate(host: str) -> dict[str, str]:
    """A self-signed certificate of ``host`` that expires within the hour (and its key), as management API bodies
    take them: one due for renewal by any rule."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(minutes=50))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return {"fullchain_pem": cert.public_bytes(serialization.Encoding.PEM).decode(), "key_pem": key_pem.decode()}


def _put_certificate_script(host: str, body: dict[str, str]) -> str:
    """Run on the gateway's host: install ``body`` as the certificate of ``host`` through the management API."""
    data = base64.b64encode(json.dumps(body).encode()).decode()
    return f"""python3 - <<'PY'
import base64, pathlib, urllib.request
d = pathlib.Path.home() / ".corral-gateway"
token, port = (d / "token").read_text().strip(), (d / "gateway.port").read_text().strip()
req = urllib.request.Request(
    "http://127.0.0.1:" + port + "/api/certificates/{host}", data=base64.b64decode("{data}"), method="PUT",
    headers={{"Authorization": "Bearer " + token, "Content-Type": "application/json"}},
)
print(urllib.request.urlopen(req, timeout=5).read().decode())
PY
"""


async def test_a_certificate_due_is_renewed_from_a_ca_that_restarted_with_a_new_root(
    server: RunningServer, hosts: FakeHosts, lab: PebbleLab, tmp_path: Path
) -> None:
    ip = hosts.ip("cpu1")
    lab.set_default_ipv4(ip)
    host = f"svc.{DOMAIN}"
    old_root, new_root = tmp_path / "old-root.pem", tmp_path / "new-root.pem"
    old_root.write_text(lab.root_pem())
    async with server.client() as c:
        await _edge_fleet(c, hosts, ip)
        await start_service(c, "svc")
        gw = await _gateway_on_edge(c)
        await publish(server, "svc", gw["id"])
        await wait_for(lambda: _served(ip, host, old_root, server.token), timeout=60, interval=0.5)

        # the CA restarts (a new root; the server's ACME account and nonces forgotten), and the certificate the
        # gateway serves is due (50 minutes left): the next pass gets a new one, from the restarted CA
        lab.restart()
        new_root.write_text(lab.root_pem())
        assert new_root.read_text() != old_root.read_text()
        put = await host_run(hosts, "cpu1", _put_certificate_script(host, _short_lived_certificate(host)))
        assert put.exit_status == 0 and "not_after" in put.stdout, put
        await wait_for(lambda: _served(ip, host, new_root, server.token), timeout=60, interval=0.5)
        assert not await _served(ip, host, old_root, server.token)  # the old CA's chain is gone

        issued = [m for m in await _messages(c, target_gateways=[gw["id"]]) if m == f"Certificate for {host} issued"]
        assert len(issued) == 2, issued
        await stop_all_runs(c)
        assert (await c.post(G + "/delete", json={"names": ["gw"]})).status_code == 200
        await wait_for(lambda: _gone(c, "gw"), timeout=30)


#: The check interval of the next test: short, so that the CA's reset is noticed within seconds.
CHECK_INTERVAL = 2.0


async def test_a_ca_that_lost_its_state_is_noticed_and_a_certificate_not_due_is_issued_again(
    hosts: FakeHosts, lab: PebbleLab, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral.gateways")
    ip = hosts.ip("cpu1")
    lab.set_default_ipv4(ip)
    host = f"svc.{DOMAIN}"
    old_root, new_root = tmp_path / "old-root.pem", tmp_path / "new-root.pem"
    old_root.write_text(lab.root_pem())
    settings = _settings(tmp_path, lab, acme_account_check_interval=CHECK_INTERVAL)
    async with running_server(settings) as server, server.client() as c:
        await _edge_fleet(c, hosts, ip)
        await start_service(c, "svc")
        gw = await _gateway_on_edge(c)
        await publish(server, "svc", gw["id"])
        await wait_for(lambda: _served(ip, host, old_root, server.token), timeout=60, interval=0.5)
        await asyncio.sleep(2 * CHECK_INTERVAL)  # checks while the CA still knows the account: nothing issued
        assert await _served(ip, host, old_root, server.token)

        # the CA goes away: the checks fail, and that is no reset (a log line each, nothing issued)
        lab.stop_ca()
        caplog.clear()
        await asyncio.sleep(3 * CHECK_INTERVAL)
        failed = [m for m in caplog.messages if "was not asked whether it still knows this server's account" in m]
        assert 1 <= len(failed) <= 4 and all(lab.directory_url in m for m in failed), caplog.messages
        assert not [m for m in caplog.messages if "no longer knows" in m or "certificate for" in m], caplog.messages

        # it comes back restarted: a new root, the server's account forgotten. The certificate the gateway serves is
        # pebble's (years left: not due), yet it chains to the old root, which clients of the CA's current one refuse
        lab.start_ca()
        new_root.write_text(lab.root_pem())
        assert new_root.read_text() != old_root.read_text()
        await wait_for(lambda: _served(ip, host, new_root, server.token), timeout=30, interval=0.5)
        assert not await _served(ip, host, old_root, server.token)

        events = await _messages(c, target_gateways=[gw["id"]])
        reset = (
            f"ACME server {lab.directory_url} no longer knows this server's account (it was reset): "
            "its certificates are issued again"
        )
        assert events.count(reset) == 1, events
        assert events.count(f"Certificate for {host} issued") == 2, events
        await stop_all_runs(c)
        assert (await c.post(G + "/delete", json={"names": ["gw"]})).status_code == 200
        await wait_for(lambda: _gone(c, "gw"), timeout=30)
        await delete_all_fleets(c)
