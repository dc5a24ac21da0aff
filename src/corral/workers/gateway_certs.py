"""The gateways' certificates: for each HTTPS host a running gateway serves, a certificate got from the ACME
server (:mod:`corral.acme`, HTTP-01: the challenge published on the gateway) when the gateway has none or its
own is due for renewal, and installed on the gateway; a failure is an event on the gateway and the host's
services (the run goes on) and its error is kept for the gateway's status message. The server's ACME account
key is made once and kept sealed, shared by every server replica.

While gateways hold its certificates, the server asks the ACME server every ``acme_account_check_interval``
whether it still knows the account (RFC 8555 §7.3.1, ``onlyReturnExisting``). A CA that lost its state (pebble
at every restart: a new root, every account forgotten) answers that it does not: the account is registered again,
the reset recorded in the store (so every replica knows), an event written on each gateway, and every
certificate issued before the reset is due (``domain.gateway_ops.issued_before_reset``), since clients that trust
the CA's current root refuse its chain. A check that fails (the CA unreachable) is no reset: a log line, and the
next check an interval later.

Called by the gateways' operation (:mod:`corral.workers.gateway_ops`) on each pass over a running gateway,
under its lease. Imports ``domain``, ``store``, ``backends`` (the gateway's management API), ``context``, and
on first use the ACME client (``corral.acme``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from corral.backends.gateway_api import GatewayApi, GatewayRefused, GatewayUnreachable
from corral.context import Context
from corral.domain import gateway_ops as rules
from corral.domain.events import gateway_target, run_target
from corral.domain.gateways import GatewayRec, GatewayService
from corral.store import gateway_ops as ops_store

if TYPE_CHECKING:
    from corral.acme.client import AcmeClient

log = logging.getLogger("corral.gateways")


def _iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class GatewayCertificates:
    """The server's ACME account (made on first use) and the certificates it gets for gateways."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._acme: AcmeClient | None = None
        #: When the next check of the account is due (None: no certificate seen yet; the first check is an
        #: interval after the first).
        self._next_check: float | None = None

    async def certify(
        self,
        g: GatewayRec,
        api: GatewayApi,
        desired: Sequence[GatewayService],
        known: Mapping[str, rules.CertificateState],
    ) -> dict[str, str]:
        """Certificates for the HTTPS hosts that need one now; the errors of hosts still without one.
        Raises :class:`GatewayUnreachable` when the gateway does not answer."""
        points = [e for s in desired if (e := rules.entrypoint(g, s)) is not None]
        hosts = rules.certificate_hosts(desired, points) if g.has_certificate else []
        if not hosts:
            return {}
        try:
            on_gateway = {h: _iso(t) for h, t in (await api.certificates()).items()}
        except GatewayRefused as e:
            log.warning("gateway %s: its certificates could not be listed: %s", g.name, e)
            return {}
        if any(known[h].not_after is not None for h in hosts if h in known):
            await self._check_account(time.time())
        async with self.ctx.db.read() as conn:
            reset_at = await ops_store.acme_reset_at(conn, self.ctx.settings.acme_server)
        for host in rules.hosts_to_certify(hosts, on_gateway, known, time.time(), reset_at):
            if await self._issue(g, api, host, desired):
                on_gateway[host] = time.time()
        async with self.ctx.db.read() as conn:
            now_known = await ops_store.certificates(conn, g.id)
        return {h: s.error for h, s in now_known.items() if h in hosts and h not in on_gateway and s.error}

    async def _issue(self, g: GatewayRec, api: GatewayApi, host: str, desired: Sequence[GatewayService]) -> bool:
        from corral.acme.errors import AcmeError

        targets = [gateway_target(g.project_id, g.id, g.name)]
        targets += [run_target(g.project_id, s.run_id, s.run_name) for s in desired if s.host == host]
        started = time.time()
        try:
            acme = await self._acme_client()
            issued = await acme.issue(
                host, publish=api.put_challenge, withdraw=api.delete_challenge, address=g.hostname
            )
            await api.put_certificate(host, issued.fullchain_pem, issued.key_pem)
        except (AcmeError, GatewayRefused, GatewayUnreachable) as e:
            why = str(e)
            log.warning("gateway %s: no certificate for %s: %s", g.name, host, why)
            async with self.ctx.db.write() as conn:
                await ops_store.certificate_failed(conn, g.id, host, time.time(), why)
                await ops_store.event(conn, f"Certificate for {host} failed: {why}", targets)
            return False
        async with self.ctx.db.write() as conn:
            await ops_store.certificate_issued(
                conn, g.id, host, issued.not_before.timestamp(), issued.not_after.timestamp(), started
            )
            await ops_store.event(conn, f"Certificate for {host} issued", targets)
        log.info("gateway %s: certificate for %s until %s", g.name, host, issued.not_after.isoformat())
        return True

    async def _check_account(self, now: float) -> None:
        """Whether the ACME server still knows the account, at most once per interval; when it does not, the
        account registered again, the reset recorded and an event on each gateway that holds certificates."""
        from corral.acme.errors import AcmeError

        s = self.ctx.settings
        if self._next_check is None:
            self._next_check = now + s.acme_account_check_interval
        if now < self._next_check:
            return
        self._next_check = now + s.acme_account_check_interval
        async with self.ctx.db.read() as conn:
            if await ops_store.acme_account(conn, s.acme_server) is None:
                return  # no account at this directory: nothing it issued can be stale
        try:
            forgotten = await (await self._acme_client()).register_if_forgotten()
        except AcmeError as e:
            log.warning(
                "the ACME server %s was not asked whether it still knows this server's account (again in %g s): %s",
                s.acme_server,
                s.acme_account_check_interval,
                e,
            )
            return
        if not forgotten:
            return
        text = (
            f"ACME server {s.acme_server} no longer knows this server's account (it was reset): "
            "its certificates are issued again"
        )
        log.warning(text)
        async with self.ctx.db.write() as conn:
            await ops_store.record_acme_reset(conn, s.acme_server, now)
            for g in await ops_store.certified_gateways(conn):
                await ops_store.event(conn, text, [gateway_target(g.project_id, g.id, g.name)])

    async def _acme_client(self) -> AcmeClient:
        """The server's ACME account at the configured directory (its key made once and kept sealed)."""
        if self._acme is None:
            from corral.acme.client import AcmeClient, EabCredentials

            s = self.ctx.settings
            eab = (
                EabCredentials(s.acme_eab_kid, s.acme_eab_hmac_key) if s.acme_eab_kid and s.acme_eab_hmac_key else None
            )

            def client(key: str | None) -> AcmeClient:
                pem = self.ctx.reveal(key).encode() if key is not None else None
                return AcmeClient(s.acme_server, ca_bundle=s.acme_ca_bundle, eab=eab, account_key_pem=pem)

            async with self.ctx.db.read() as conn:
                stored = await ops_store.acme_account(conn, s.acme_server)
            made = client(stored)
            if stored is None:
                sealed = self.ctx.cipher().encrypt(made.account_key_pem.decode())
                async with self.ctx.db.write() as conn:
                    await ops_store.save_acme_account(conn, s.acme_server, sealed, time.time())
                    kept = await ops_store.acme_account(conn, s.acme_server)
                if kept is not None and kept != sealed:  # another server replica kept its key first
                    made = client(kept)
            self._acme = made
        return self._acme
