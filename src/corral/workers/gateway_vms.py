"""A gateway on a VM of its own (``instance`` not set, a backend that is a ``GatewayProvisioner``): the VM
brought up by its backend, with a key of the gateway's own made first and kept sealed (a VM a launch made before a
restart is adopted, with the same key), its address and login kept with the gateway so that the next pass deploys
on it as on a fleet's host; and the VM terminated when the gateway is deleted.

Called by the gateways' operation (:mod:`corral.workers.gateway_ops`) under the gateway's lease. Imports
``domain``, ``store``, ``backends``, ``context``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from corral.backends.base import GatewayHost, GatewayProvisioner, GatewaySpec, ProvisioningError
from corral.backends.ssh_secrets import new_keypair
from corral.context import Context
from corral.domain.gateways import GatewayRec
from corral.domain.statuses import GatewayStatus
from corral.store import gateways as store

log = logging.getLogger("corral.gateways")

_G = GatewayStatus

#: What a gateway on a VM of its own keeps in its ``connection``: its key (sealed), the public part, the VM's login.
_VM_KEY, _VM_PUBLIC_KEY, _VM = "vm_key", "vm_public_key", "vm"


def vm_login(g: GatewayRec) -> dict[str, Any] | None:
    """The SSH login of the gateway's VM, as kept when it came up (None before)."""
    vm = (g.connection or {}).get(_VM)
    return dict(vm) if isinstance(vm, Mapping) else None


def _vm_spec(g: GatewayRec, kept: Mapping[str, Any]) -> GatewaySpec:
    """What the gateway's VM must be: its configuration's region, type, ``public_ip`` and ``tags``, its key."""
    conf = g.configuration
    return GatewaySpec(
        gateway_id=g.id, project_name=g.project_name, region=str(conf.get("region") or "") or None,
        instance_type=conf.get("instance_type") or None, public_ip=conf.get("public_ip") is not False,
        name=g.name, tags=dict(conf.get("tags") or {}), public_key=str(kept.get(_VM_PUBLIC_KEY) or ""),
        private_key=str(kept.get(_VM_KEY) or ""),
    )  # fmt: skip


async def provision(ctx: Context, g: GatewayRec) -> None:
    """The gateway's VM brought up by its backend (``GatewayProvisioner``), with a key of the gateway's own
    made first and kept sealed; its address and login are kept with the gateway, and the next pass deploys on it."""
    now = time.time()
    compute = ctx.computes.get(g.backend)
    if not isinstance(compute, GatewayProvisioner):
        why = f"The project has no {g.backend} backend to host the gateway: configure it, or use another backend"
        async with ctx.db.write() as conn:
            await store.set_status(conn, g.id, _G.FAILED, now, why)
        return
    if g.status == _G.SUBMITTED:
        async with ctx.db.write() as conn:
            await store.set_status(conn, g.id, _G.PROVISIONING, now, expect=(_G.SUBMITTED,))
    kept = dict(g.connection or {})
    if not isinstance(kept.get(_VM_KEY), str):
        private, public = new_keypair(f"corral-gateway-{g.name}")
        kept.update({_VM_KEY: ctx.cipher().encrypt(private), _VM_PUBLIC_KEY: public})
        async with ctx.db.write() as conn:
            await store.set_connection(conn, g.id, kept, g.last_seen_at)
    try:
        host = await compute.create_gateway(_vm_spec(g, kept))
    except ProvisioningError as e:
        late = now - g.created_at > ctx.settings.provisioning_timeout
        log.info("gateway %s: its VM: %s", g.name, e)
        if late or e.kind != "no_capacity":
            async with ctx.db.write() as conn:
                await store.set_status(conn, g.id, _G.FAILED, time.time(), f"Failed to provision the gateway: {e}")
        return
    kept[_VM] = dict(host.connection)
    async with ctx.db.write() as conn:
        await store.set_connection(conn, g.id, kept, g.last_seen_at)
        await store.set_host(conn, g.id, None, host.address)
    log.info("gateway %s: its %s VM is up at %s", g.name, g.backend, host.address)
    ctx.wakeups.wake("gateways")


async def terminate(ctx: Context, g: GatewayRec) -> bool:
    """The gateway's VM terminated (True), or not yet (False: the next pass tries again)."""
    compute = ctx.computes.get(g.backend)
    if not isinstance(compute, GatewayProvisioner):
        log.warning("gateway %s: no %s backend to terminate its VM; the orphan reaper's", g.name, g.backend)
        return True
    kept = dict(g.connection or {})
    try:
        host = GatewayHost(g.hostname or "", vm_login(g) or {})
        await compute.terminate_gateway(_vm_spec(g, kept), host)
    except ProvisioningError as e:
        log.warning("gateway %s: terminating its VM: %s (tried again)", g.name, e)
        return False
    log.info("gateway %s: its VM terminated", g.name)
    return True
