"""The gateways' operation: each gateway's process deployed on its host, configured, kept serving its
services, given their certificates, asked for their stats, and removed with the gateway.

Each pass, per gateway (under its lease, so one server replica acts on it): load -> decide (pure,
``domain.gateway_ops``) -> act (SSH and the gateway's management API, no transaction open) -> apply (short
transactions).

* a gateway on a VM of its own, until its VM has an address: the VM brought up (:mod:`.gateway_vms`).
* ``submitted``/``provisioning`` (a restart in the middle of a deploy deploys again, never leaves it in
  ``provisioning``: dstack #2677), over SSH, or on this machine for a local fleet's instance
  (``backends.gateway_local``, a port taken named in the failure): the zipapp uploaded when the host's differs,
  the process started (or adopted), the forwards opened, ``PUT /api/config`` -> ``running``. A failure trying
  again cannot help (the login refused, no root for ports 80/443, a port taken) -> ``failed`` with the reason;
  others are tried again until
  ``provisioning_timeout`` has passed since the gateway was created.
* ``running``: the gateway sent its configuration (this server's end of the reverse forward, which changes with
  a new SSH connection or a restarted server; the same configuration is a no-op for it); the registrations
  reconciled with what it serves (extra ones withdrawn: dstack #3046); certificates got for the HTTPS hosts
  that lack one or are due for renewal (:mod:`.gateway_certs`; a failure is an event on the gateway and the
  service and the gateway's status message, with the host named; the run goes on); stats turned into request
  counts for the autoscaler.
  A gateway that does not answer gets the status message and event ``Gateway unreachable`` (its services keep
  their in-server proxy URL); it is deployed again when its host answers SSH but the process is gone.
* marked for deletion: its services withdrawn, the process stopped and removed (ports 80/443 closed), its
  host given back to jobs (or its own VM terminated), the row removed.

Imports ``domain``, ``store``, ``backends``, ``context``, ``settings``, the two modules above, and on first use
the gateway's zipapp builder (``corral.gateway.zipapp``).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

from corral.backends.gateway_api import GatewayApi, GatewayRefused, GatewayUnreachable
from corral.backends.gateway_link import GatewayBuild, GatewayChannel, GatewayLink
from corral.backends.gateway_local import LocalGatewayError, LocalGatewayLink
from corral.backends.ssh_conn import SshError, SshTarget
from corral.backends.ssh_secrets import KeyOpener
from corral.context import Context
from corral.domain import gateway_ops as rules
from corral.domain.events import gateway_target, run_target
from corral.domain.gateway_ops import Entrypoint
from corral.domain.gateways import GatewayRec, GatewayService
from corral.domain.statuses import GatewayStatus
from corral.store import gateway_ops as ops_store
from corral.store import gateways as store
from corral.store import plan_apply
from corral.store import service_scaling as scaling_store
from corral.workers import gateway_vms
from corral.workers.gateway_certs import GatewayCertificates

log = logging.getLogger("corral.gateways")

_G = GatewayStatus
#: What reaching a gateway's host raises: SSH to a fleet's host or a VM, or starting it on this machine.
_HOST_ERRORS = (SshError, LocalGatewayError)


class _Unreachable(Exception):
    """The gateway cannot be reached (the message says why)."""


class GatewayOperator:
    """What the server holds per gateway between passes: its link, its API client, what it sent it."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.links: dict[str, GatewayChannel] = {}
        self.apis: dict[str, GatewayApi] = {}
        #: Per gateway: the registration bodies sent since this server started (empty after a restart: all
        #: are sent again), the entry points sent, and the link generation it was configured for.
        self.sent: dict[str, dict[tuple[str, str], Mapping[str, Any]]] = {}
        self.sent_entrypoints: dict[str, set[Entrypoint]] = {}
        self.configured: dict[str, int] = {}
        #: (gateway, run) -> the reason the gateway last refused the run's registration (told once).
        self.refusals: dict[tuple[str, str], str] = {}
        self._build: GatewayBuild | None = None
        self.certificates = GatewayCertificates(ctx)
        self._open = KeyOpener(ctx.cipher)

    # ---- the pass ----------------------------------------------------------------------------
    async def pass_once(self) -> None:
        async with self.ctx.db.read() as conn:
            gateways = await ops_store.live(conn)
        for g in gateways:
            step = rules.next_step(g)
            if step == "wait":
                continue
            async with self.ctx.db.write() as conn:
                token = await ops_store.claim(conn, g.id, self.ctx.replica_id, time.time())
            if token is None:
                continue
            try:
                if step == "delete":
                    await self._delete(g)
                elif step == "provision":
                    await gateway_vms.provision(self.ctx, g)
                elif step == "deploy":
                    await self._deploy(g)
                else:
                    await self._operate(g, token)
            finally:
                async with self.ctx.db.write() as conn:
                    await ops_store.release(conn, g.id, token)
        live = {g.id for g in gateways}
        for gid in [i for i in self.links if i not in live]:
            await self._forget(gid)

    async def close(self) -> None:
        for gid in list(self.links):
            await self._forget(gid)

    async def _forget(self, gid: str) -> None:
        api = self.apis.pop(gid, None)
        if api is not None:
            await api.aclose()
        link = self.links.pop(gid, None)
        if link is not None:
            await link.close()
        self.sent.pop(gid, None)
        self.sent_entrypoints.pop(gid, None)
        self.configured.pop(gid, None)

    # ---- links -------------------------------------------------------------------------------
    async def _link(self, g: GatewayRec) -> tuple[GatewayChannel, GatewayApi, str]:
        """The gateway's link and API client (made from what the rows store after a restart), and its
        management token (made and kept, sealed, at its first deploy)."""
        kept = dict(g.connection or {})
        mgmt = kept.get("management_token")
        if not isinstance(mgmt, str):
            mgmt = secrets.token_hex(24)
            async with self.ctx.db.write() as conn:
                kept["management_token"] = self.ctx.cipher().encrypt(mgmt)
                await store.set_connection(conn, g.id, kept, g.last_seen_at)
        else:
            mgmt = self._open.named("gateway token")(mgmt)
        link = self.links.get(g.id)
        if link is None:
            link = await self._new_link(g)
            self.links[g.id] = link
        return link, await self._api(g, link, mgmt), mgmt

    async def _api(self, g: GatewayRec, link: GatewayChannel, mgmt: str) -> GatewayApi:
        """The client of the gateway's management API, made again when its address moved (a gateway on this
        machine started again on another loopback port; an SSH link's local end never moves)."""
        api = self.apis.get(g.id)
        if api is None or api.url != link.management_url():
            if api is not None:
                await api.aclose()
            api = self.apis[g.id] = GatewayApi(link.management_url(), mgmt)
        return api

    async def _new_link(self, g: GatewayRec) -> GatewayChannel:
        """The channel to the gateway's host: this machine for an instance of a local fleet, else SSH to the
        fleet's host or the gateway's own VM."""
        s = self.ctx.settings
        host = "127.0.0.1" if s.host in ("0.0.0.0", "::", "") else s.host  # where this server listens
        if g.own_vm:  # its VM's login, kept with the gateway when the VM came up
            ssh = gateway_vms.vm_login(g)
        else:
            async with self.ctx.db.read() as conn:
                if await ops_store.instance_backend(conn, g.instance_id or "") == "local":
                    return LocalGatewayLink(
                        s.server_dir / "gateways" / g.id,
                        f"http://{host}:{s.port}",
                        s.local_gateway_http_port,
                        s.local_gateway_https_port,
                    )
                ssh = await ops_store.instance_connection(conn, g.instance_id or "")
        if ssh is None:
            raise SshError(f"the gateway's host (instance {g.instance_id}) has no SSH connection details", True)
        return GatewayLink(SshTarget.from_json(ssh), s.ssh_connect_timeout, s.port, self._open, host)

    def _gateway_build(self) -> GatewayBuild:
        if self._build is None:
            from corral.gateway.zipapp import build_zipapp

            path = build_zipapp(self.ctx.settings.server_dir / "corral-gateway.pyz")
            self._build = GatewayBuild.of(path.read_bytes())
        return self._build

    async def _configure(self, g: GatewayRec, link: GatewayChannel, api: GatewayApi) -> None:
        """``PUT /api/config`` with this server's end of the reverse forward, every pass (the same body is a
        no-op for the gateway; another server replica may have configured its own forward since). A new forward,
        or this server's first pass, sends the services again too."""
        server_url = await link.server_url()
        await api.configure(server_url, self.ctx.reveal(g.secret_sealed or ""))
        if self.configured.get(g.id) != link.generation:
            self.configured[g.id] = link.generation
            self.sent.pop(g.id, None)
            self.sent_entrypoints.pop(g.id, None)

    # ---- deploy ------------------------------------------------------------------------------
    async def _deploy(self, g: GatewayRec) -> None:
        now = time.time()
        if g.status == _G.SUBMITTED:
            async with self.ctx.db.write() as conn:
                await store.set_status(conn, g.id, _G.PROVISIONING, now, expect=(_G.SUBMITTED,))
        try:
            link, api, mgmt = await self._link(g)
            deployed = await link.deploy(self._gateway_build(), mgmt)
            api = await self._api(g, link, mgmt)  # a local gateway's management port is known now
            self.configured.pop(g.id, None)
            await self._configure(g, link, api)
            version = await api.health()
        except (*_HOST_ERRORS, GatewayUnreachable, GatewayRefused) as e:
            # a new VM's sshd may answer before cloud-init has authorised the gateway's key: tried again
            refused_login = isinstance(e, _HOST_ERRORS) and e.permanent and not g.own_vm
            permanent = isinstance(e, GatewayRefused) or refused_login
            late = now - g.created_at > self.ctx.settings.provisioning_timeout
            log.info("gateway %s: deploy failed: %s", g.name, e)
            if permanent or late:
                await self._forget(g.id)
                async with self.ctx.db.write() as conn:
                    await store.set_status(conn, g.id, _G.FAILED, time.time(), f"Failed to deploy the gateway: {e}")
            return
        async with self.ctx.db.write() as conn:
            await store.set_status(conn, g.id, _G.RUNNING, time.time(), None, expect=(_G.PROVISIONING, _G.SUBMITTED))
            await _seen(conn, g.id)
        log.info(
            "gateway %s running on %s (version %s, %s)",
            g.name,
            link.label,
            version,
            "adopted" if deployed.adopted else "started",
        )
        self.ctx.wakeups.wake("gateways")

    # ---- delete ------------------------------------------------------------------------------
    async def _delete(self, g: GatewayRec) -> None:
        if g.own_vm:  # the VM goes, and the gateway's program with it
            await self._forget(g.id)
            if not await gateway_vms.terminate(self.ctx, g):
                return
        elif g.instance_id is not None:
            try:
                link, api, _ = await self._link(g)
                try:
                    for r in await api.services():
                        await api.unregister(r.project, r.run)
                except (GatewayUnreachable, GatewayRefused) as e:
                    log.info("gateway %s: withdrawing its services failed: %s", g.name, e)
                await link.remove()
            except _HOST_ERRORS as e:  # the host is gone: nothing is left there to serve
                log.warning("gateway %s: removing it from its host failed: %s", g.name, e)
        await self._forget(g.id)
        async with self.ctx.db.write() as conn:
            fresh = await store.get(conn, g.id)
            if fresh is None or not fresh.to_be_deleted:
                return
            if fresh.instance_id is not None:
                await plan_apply.release_gateway_hold(conn, fresh.instance_id, fresh.id, time.time())
            await ops_store.forget(conn, fresh.id)
            await store.delete(conn, fresh)
        log.info("gateway %s of project %s deleted", g.name, g.project_name, extra={"event": "gateway_deleted"})
        self.ctx.wakeups.wake("scheduler")

    # ---- operate -----------------------------------------------------------------------------
    async def _operate(self, g: GatewayRec, token: str) -> None:
        async with self.ctx.db.read() as conn:
            desired = await ops_store.services_to_register(conn, g)
            known = await ops_store.certificates(conn, g.id)
        unreachable: str | None = None
        cert_errors: dict[str, str] = {}
        try:
            api = await self._reach(g)
            await self._register(g, api, desired)
            cert_errors = await self.certificates.certify(g, api, desired, known)
            await self._stats(g, api, desired)
        except (_Unreachable, GatewayUnreachable) as e:
            unreachable = str(e)
        message = rules.status_message(unreachable, cert_errors)
        if message == g.status_message:
            return
        async with self.ctx.db.write() as conn:
            await ops_store.set_message(conn, g.id, token, message)
            was_down = (g.status_message or "").startswith(rules.UNREACHABLE)
            if unreachable is not None and not was_down:
                await ops_store.event(conn, f"{rules.UNREACHABLE}: {unreachable}", [_target(g)])
            elif unreachable is None and was_down:
                await ops_store.event(conn, "Gateway reachable again", [_target(g)])
            if unreachable is None:
                await _seen(conn, g.id)

    async def _reach(self, g: GatewayRec) -> GatewayApi:
        """The gateway's API once it answers (configured again if need be; deployed again when its host
        answers but the process does not)."""
        try:
            link, api, mgmt = await self._link(g)
            await self._configure(g, link, api)
            await api.health()
            return api
        except (GatewayUnreachable, GatewayRefused) as first:
            try:
                link, api, mgmt = await self._link(g)
                deployed = await link.deploy(self._gateway_build(), mgmt)
                api = await self._api(g, link, mgmt)
                self.configured.pop(g.id, None)
                await self._configure(g, link, api)
                await api.health()
            except (*_HOST_ERRORS, GatewayUnreachable, GatewayRefused) as e:
                raise _Unreachable(str(e)) from None
            log.warning("gateway %s: its process did not answer (%s); %s", g.name, first, _how(deployed.adopted))
            return api
        except _HOST_ERRORS as e:
            raise _Unreachable(str(e)) from None

    async def _register(self, g: GatewayRec, api: GatewayApi, desired: Sequence[GatewayService]) -> None:
        sent = self.sent.setdefault(g.id, {})
        points = self.sent_entrypoints.setdefault(g.id, set())
        try:
            plan = rules.registrations(g, desired, await api.services(), sent, points)
            for e in plan.entrypoints:
                await api.put_entrypoint(e.host, e.project, e.https)
                points.add(e)
            for project, run in plan.unregister:
                await api.unregister(project, run)
                sent.pop((project, run), None)
                log.info("gateway %s: withdrew %s/%s", g.name, project, run)
            for svc, body in plan.register:
                try:
                    await api.register(svc.project_name, svc.run_name, body)
                except GatewayRefused as e:  # tried again next pass; told once per reason
                    await self._refused(g, svc, e.detail)
                    continue
                sent[(svc.project_name, svc.run_name)] = body
                self.refusals.pop((g.id, svc.run_id), None)
                log.info("gateway %s: registered %s/%s at %s", g.name, svc.project_name, svc.run_name, svc.host)
        except GatewayUnreachable as e:
            raise _Unreachable(str(e)) from None
        except GatewayRefused as e:
            log.warning("gateway %s: the gateway refused a request: %s", g.name, e)

    async def _refused(self, g: GatewayRec, svc: GatewayService, detail: str) -> None:
        """A registration the gateway refused: an event on the gateway and the run (once per reason)."""
        log.warning("gateway %s: registering %s refused: %s", g.name, svc.run_name, detail)
        if self.refusals.get((g.id, svc.run_id)) == detail:
            return
        self.refusals[(g.id, svc.run_id)] = detail
        targets = [_target(g), run_target(g.project_id, svc.run_id, svc.run_name)]
        async with self.ctx.db.write() as conn:
            await ops_store.event(conn, f"Service registration on gateway {g.name} failed: {detail}", targets)

    async def _stats(self, g: GatewayRec, api: GatewayApi, desired: Sequence[GatewayService]) -> None:
        """The gateway's counts for its services, written as requests for the autoscaler."""
        try:
            got = await api.stats()
        except GatewayUnreachable as e:
            raise _Unreachable(str(e)) from None
        except GatewayRefused as e:
            log.warning("gateway %s: its stats were refused: %s", g.name, e)
            return
        ids = {(s.project_name, s.run_name): s.run_id for s in desired}
        counted = {ids[(s.project, s.run)]: s.stats.get(rules.STATS_WINDOW) for s in got if (s.project, s.run) in ids}
        second = int(time.time())
        server = f"gateway:{g.id}"
        async with self.ctx.db.write() as conn:
            recorded = await ops_store.recorded_requests(conn, server, sorted(counted), second - rules.STATS_WINDOW + 1)
            rows = []
            for run_id, window in counted.items():
                n = rules.new_requests(window.requests if window else 0, recorded.get(run_id, 0))
                if n:
                    rows.append((run_id, second, n))
            await scaling_store.record_requests(conn, server, rows)
        if rows:
            self.ctx.wakeups.wake("services")


async def _seen(conn: Any, gateway_id: str) -> None:
    """The gateway answered now (its connection as stored, ``last_seen_at`` now)."""
    fresh = await store.get(conn, gateway_id)
    if fresh is not None:
        await store.set_connection(conn, gateway_id, fresh.connection, time.time())


def _target(g: GatewayRec) -> Any:
    return gateway_target(g.project_id, g.id, g.name)


def _how(adopted: bool) -> str:
    return "found it running again" if adopted else "started it again"
