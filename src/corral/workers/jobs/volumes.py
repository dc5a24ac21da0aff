"""A placed job's network volumes, attached to its instance before the job is handed to the agent:
AttachVolume on the first free device name (``/dev/sdf``...), waited until EC2 says ``attached``, and the
attachment recorded on the volume (its device name, the job it serves) -- the agent then finds, formats if
new and mounts it. A volume still attached for an earlier job (its detach, by the volumes worker, not
done yet) makes the job wait (:class:`NotYet`); one that cannot be attached fails it (:class:`AttachError`).

May import: corral.backends.aws, corral.store.volumes, corral.context, corral.workers.volumes.
"""

from __future__ import annotations

import asyncio
import time

from corral.agent.protocol import NetworkMount
from corral.backends.aws import ec2
from corral.backends.aws import volumes as ebs
from corral.context import Context
from corral.domain.records import InstanceRec, JobRec
from corral.domain.volumes import Place, VolumeRec, chosen, mount_points
from corral.store import volumes as store
from corral.workers.volumes import Volumes

ATTACH_WAIT_S = 120.0


class NotYet(Exception):
    """A volume is still attached elsewhere (or for a job that ended): try again shortly."""


class AttachError(Exception):
    """The volumes cannot be attached to the job's instance: the job fails with this message."""


async def attach(
    ctx: Context, job: JobRec, inst: InstanceRec, conf: dict[str, object], poll: float = 0.5
) -> list[NetworkMount]:
    points = mount_points(conf)
    if not points:
        return []
    where = ((inst.agent or {}).get("connection") or {}).get("aws")
    if not where:
        raise AttachError(f"network volumes attach to aws instances only; {inst.name} is a {inst.backend} instance")
    ec2_id, region = str(where["instance_id"]), str(where["region"])
    async with ctx.db.read() as conn:
        vols = {v.name: v for v in await store.by_names(conn, job.project_id, [n for ns, _p in points for n in ns])}
        here = await store.attached(conn, inst.id)
    mounts = _chosen(points, vols, (inst.backend, region, str((inst.offer or {}).get("zone") or "") or None))
    taken = {str((v.attachment or {}).get("device_name")) for v in here}
    client = None
    out = []
    for v, path in mounts:
        name = v.name
        if not v.volume_id:
            raise AttachError(f"volume {name} not found or not provisioned")
        a = v.attachment or {}
        if v.instance_id == inst.id and a.get("job_id") == job.id:
            out.append(NetworkMount(name, v.volume_id, str(a["device_name"]), path))
            continue
        if v.instance_id is not None:
            ctx.wakeups.wake("volumes")
            raise NotYet(f"volume {name} is still attached to another job's instance")
        if client is None:
            client = await Volumes(ctx).client(inst.project_name, region)
        try:
            device = await asyncio.to_thread(ebs.attach, client, v.volume_id, ec2_id, taken)
            deadline = time.monotonic() + ATTACH_WAIT_S
            while await asyncio.to_thread(ebs.state, client, v.volume_id, ec2_id) != "attached":
                if time.monotonic() > deadline:
                    raise AttachError(f"volume {name} ({v.volume_id}) did not attach to {ec2_id} in time")
                await asyncio.sleep(poll)
        except ec2.AWSError as e:
            raise AttachError(f"cannot attach volume {name} ({v.volume_id}) to {ec2_id}: {e}") from None
        taken.add(device)
        attachment = {
            "device_name": device, "job_id": job.id, "ec2_id": ec2_id, "instance_name": inst.name,
            "fleet_name": inst.fleet_name, "instance_num": inst.instance_num,
        }  # fmt: skip
        async with ctx.db.write() as conn:
            await store.attach(conn, v.id, inst.id, attachment)
        out.append(NetworkMount(name, v.volume_id, device, path))
    return out


def _chosen(
    points: list[tuple[tuple[str, ...], str]], vols: dict[str, VolumeRec], where: Place
) -> list[tuple[VolumeRec, str]]:
    """The volume each mount point mounts on an instance at ``where`` (its first alternative there), with
    its path."""
    missing = [n for names, _p in points for n in names if n not in vols]
    if missing:
        raise AttachError(f"volume {', '.join(missing)} not found or not provisioned")
    try:
        picked = chosen([[vols[n] for n in names] for names, _p in points], where)
    except ValueError as e:
        raise AttachError(str(e)) from None
    return [(v, path) for v, (_names, path) in zip(picked, points, strict=True)]
