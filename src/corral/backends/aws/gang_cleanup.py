"""What is left of a gang on EC2 to clean up: the instances of a gang that failed (terminated, confirmed),
its placement group once no instance holds it (after a failed launch; after the last instance's
termination, ``release_group``), and this server's groups no live instance names (the orphan reaper's
``sweep_groups``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from corral.backends.aws import ec2, launch, placement
from corral.backends.aws.session import AWSProject, AWSSession
from corral.backends.base import ProvisioningError

log = logging.getLogger("corral.aws.gangs")

#: The tag naming the placement group an instance was launched in (its termination deletes the group).
TAG_PLACEMENT = launch.TAG_PLACEMENT


async def rollback(session: AWSSession, client: Any, ids: Sequence[str], group: str | None) -> None:
    """Terminate ``ids`` and wait until EC2 says so (the orphan reaper is the backstop past the
    termination timeout), then delete ``group``."""
    for ec2_id in ids:
        try:
            await session.ec2(ec2.terminate, client, ec2_id)
        except ec2.AWSError as e:
            log.warning("could not terminate %s of a failed gang: %s", ec2_id, e)
    deadline = time.monotonic() + session.terminate_timeout
    left = list(ids)
    while left and time.monotonic() < deadline:
        states = {str(i["InstanceId"]): i["State"]["Name"] for i in await session.ec2(ec2.described, client, left)}
        left = [i for i in left if states.get(i, "terminated") != "terminated"]
        if left:
            await asyncio.sleep(session.poll)
    if left:
        log.warning("instances %s of a failed gang are not terminated yet (the reaper terminates them)", left)
    if group is not None:
        await delete_group(session, client, group)


async def delete_group(session: AWSSession, client: Any, group: str) -> None:
    deadline = time.monotonic() + session.terminate_timeout
    while True:
        try:
            if await session.ec2(placement.delete, client, group):
                return
        except ec2.AWSError as e:
            log.warning("could not delete placement group %s: %s", group, e)
            return
        if time.monotonic() >= deadline:
            log.warning("placement group %s is still in use; its last instance's termination deletes it", group)
            return
        await asyncio.sleep(session.poll)


async def release_group(session: AWSSession, client: Any, where: dict[str, Any]) -> None:
    """After an instance of a gang is confirmed terminated: delete its placement group unless another
    instance of the gang still lives (that one's termination deletes it); raises while EC2 still says the
    group is in use with none of the gang alive (the worker tries the termination again)."""
    group = where.get("placement_group")
    if not group:
        return
    if await session.ec2(placement.delete, client, str(group)):
        return
    live = await session.ec2(ec2.by_tag, client, launch.TAG_GANG, str(where.get("gang") or ""))
    if not [i for i in live if str(i["InstanceId"]) != str(where.get("instance_id"))]:
        raise ProvisioningError(f"placement group {group} is still in use; deleting it again")


async def sweep_groups(
    session: AWSSession, project: AWSProject, regions: Sequence[str], grace: float, report: bool
) -> list[str]:
    """Delete (with ``report``: only log) this server's placement groups in ``regions`` that no live
    instance of it names, made more than ``grace`` seconds ago; their names."""
    server_id = await session.server_id()
    swept: list[str] = []
    for region in regions:
        client = await session.ec2(ec2.client, project.creds, region)
        once = await session.ec2(ec2.client, project.creds, region, "ec2", True)
        try:  # asked once, not retried: an endpoint without placement groups costs one reply per pass
            groups = await session.ec2(placement.owned, once, server_id)
        except ec2.AWSError as e:
            log.warning("could not list the placement groups of %s in %s: %s", project.name, region, e)
            continue
        if not groups:
            continue
        live = await session.ec2(ec2.by_tag, client, launch.TAG_SERVER, server_id)
        named = {t["Value"] for i in live for t in i.get("Tags") or [] if t["Key"] == TAG_PLACEMENT}
        for name in placement.unused(groups, named, grace, time.time()):
            if report:
                log.warning("unused placement group %s in %s: reported only", name, region)
            elif await session.ec2(placement.delete, client, name):
                log.warning("deleted unused placement group %s in %s", name, region)
            else:
                continue
            swept.append(name)
    return swept
