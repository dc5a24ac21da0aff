"""The volumes worker: makes submitted volumes in the cloud (CreateVolume, gp3, tagged, in the configured
zone), registers existing ones by ``volume_id`` (DescribeVolumes), deletes those whose deletion was asked
(DeleteVolume; an external volume is only forgotten), and detaches (DetachVolume) a volume whose job
ended, once EC2 says it is detached. Load -> decide (``domain.volumes.next_step``) -> act (EC2, no
transaction open) -> apply (a short transaction guarded by the row's lease).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any

from corral.backends.aws import ec2
from corral.backends.aws import volumes as ebs
from corral.context import Context
from corral.domain.statuses import JobStatus
from corral.domain.volumes import ACTIVE, FAILED, VolumeRec, next_step
from corral.store import leases
from corral.store import runs as run_store
from corral.store import volumes as store
from corral.store.tables import volumes as volumes_table

log = logging.getLogger("corral.volumes")
LEASE_S = 120.0
DETACH_WAIT_S = 60.0
#: EC2 clients by backend (a server's ``AWSCompute``), region and credentials.
_CLIENTS: weakref.WeakKeyDictionary[Any, dict[tuple[str, Any], Any]] = weakref.WeakKeyDictionary()


def _size_gib(conf: dict[str, Any]) -> int:
    return max(1, round(float(conf.get("size") or 0)))


class Volumes:
    def __init__(self, ctx: Context, poll: float = 0.5) -> None:
        self.ctx = ctx
        self.poll = poll

    async def client(self, project_name: str, region: str) -> Any:
        """An EC2 client with the project's aws credentials, in ``region`` (kept for the backend's life: making
        one costs a boto3 session)."""
        compute: Any = self.ctx.computes.get("aws")
        if compute is None:
            raise ec2.AWSError("", "the aws backend is not configured on this server")
        project = await compute.project(project_name)
        kept = _CLIENTS.setdefault(compute, {})
        key = (region, project.creds)
        if key not in kept:
            kept[key] = await asyncio.to_thread(ec2.client, project.creds, region)
        return kept[key]

    async def pass_once(self) -> None:
        async with self.ctx.db.read() as conn:
            pending = await store.pending(conn)
            attached = await store.attached(conn)
            ended = {}
            for v in attached:
                job_id = (v.attachment or {}).get("job_id")
                job = await run_store.get_job(conn, str(job_id)) if job_id else None
                if job is None or JobStatus(job.status).is_finished():
                    ended[v.id] = v
        for v in pending:
            step = next_step(v)
            if step is not None:
                await self._lifecycle(v, step)
        for v in ended.values():
            await self.detach(v)

    async def _claim(self, v: VolumeRec) -> str | None:
        async with self.ctx.db.write() as conn:
            return await leases.claim(conn, volumes_table, v.id, self.ctx.replica_id, time.time(), LEASE_S)

    async def _lifecycle(self, v: VolumeRec, step: str) -> None:
        token = await self._claim(v)
        if token is None:
            return
        now = time.time
        try:
            if step == "delete":
                if not v.external and v.volume_id:
                    client = await self.client(v.project_name, v.region)
                    await asyncio.to_thread(ebs.delete, client, v.volume_id)
                async with self.ctx.db.write() as conn:
                    await store.mark_deleted(conn, v.id, token, now())
                log.info("volume %s deleted", v.name)
                return
            client = await self.client(v.project_name, v.region)
            if step == "register":
                pd = await asyncio.to_thread(ebs.register, client, str(v.configuration["volume_id"]))
            else:
                custom = {str(k): str(x) for k, x in (v.configuration.get("tags") or {}).items()}
                tags = {
                    "Name": v.name, "owner": "corral", "corral_project": v.project_name, "corral_name": v.name,
                    "corral_user": v.user_name, **custom,
                }  # fmt: skip
                pd = await asyncio.to_thread(ebs.create, client, v.configuration, _size_gib(v.configuration), tags)
            async with self.ctx.db.write() as conn:
                await store.set_status(conn, v.id, token, ACTIVE, now(), provisioning=pd)
            log.info("volume %s active: %s in %s", v.name, pd["volume_id"], pd["availability_zone"])
        except ec2.AWSError as e:
            log.warning("volume %s: %s failed: %s", v.name, step, e)
            async with self.ctx.db.write() as conn:
                if step == "delete":  # tried again on the next pass
                    await leases.release(conn, volumes_table, v.id, token)
                else:
                    await store.set_status(conn, v.id, token, FAILED, now(), message=str(e))
        except Exception:
            async with self.ctx.db.write() as conn:
                await leases.release(conn, volumes_table, v.id, token)
            raise

    async def detach(self, v: VolumeRec) -> bool:
        """DetachVolume, and clear the attachment once EC2 says detached (True); False: tried again later."""
        a = v.attachment or {}
        ec2_id, device = str(a.get("ec2_id") or ""), str(a.get("device_name") or "")
        try:
            if v.volume_id and ec2_id:
                client = await self.client(v.project_name, v.region)
                # forced only if a normal detach has not finished within the wait
                wait = DETACH_WAIT_S
                if not await asyncio.to_thread(ebs.detach, client, v.volume_id, ec2_id, device, wait, self.poll):
                    return False
        except ec2.AWSError as e:
            log.warning("volume %s: DetachVolume failed: %s", v.name, e)
            return False
        async with self.ctx.db.write() as conn:
            await store.detach(conn, v.id)
        log.info("volume %s detached from %s", v.name, ec2_id)
        return True
