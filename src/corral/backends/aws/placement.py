"""Cluster placement groups of multi-node runs (fleets with ``placement: cluster``), as dstack makes them:
``CreatePlacementGroup(GroupName=dstack-<project>-<fleet>-<8 random [a-z0-9]>, Strategy=cluster)`` in the
gang's region, ``Placement.GroupName`` on its RunInstances, and ``DeletePlacementGroup`` once its instances
are gone (``InvalidPlacementGroup.Unknown``: already deleted; ``InvalidPlacementGroup.InUse``: an instance
still holds it -- the group is deleted by the termination of the last one, tried again until then).
Burstable types (``t2.``, ``t3.``, ``t3a.``,
``t4g.``), ``mac1.`` and ``m7i-flex.`` cannot be placed in a cluster group: such a gang launches without one.
A group is tagged with this server's id and when it was made (``corral_created``): the orphan reaper
deletes this server's groups that no live instance names and that are older than its grace (a server
that died between CreatePlacementGroup and the launch, a deletion that never came).

The naming and the type rule are pure; the calls take a boto3 client (``ec2.call``, run in a thread by
the caller).
"""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Iterable
from typing import Any

from corral.backends.aws import ec2
from corral.backends.aws.launch import OWNER, TAG_PROJECT, TAG_SERVER

#: Instance families EC2 refuses in a cluster placement group: burstable ones (T2, T3, T3a, T4g), Mac1 and
#: M7i-flex (EC2 User Guide, "Placement groups", cluster placement group rules).
UNSUPPORTED_PREFIXES = ("t2.", "t3.", "t3a.", "t4g.", "mac1.", "m7i-flex.")
#: The tag saying when a group was made (epoch seconds).
TAG_CREATED = "corral_created"
#: EC2's limit on a placement group's name.
NAME_LIMIT = 255
_ALPHABET = string.ascii_lowercase + string.digits
_BAD = re.compile(r"[^A-Za-z0-9_.:+=@-]")


def supports_cluster(instance_type: str) -> bool:
    """Whether instances of ``instance_type`` may go into a cluster placement group."""
    return not instance_type.startswith(UNSUPPORTED_PREFIXES)


def group_name(project: str, fleet: str, rand: str | None = None) -> str:
    """``dstack-<project>-<fleet>-<8 random [a-z0-9]>`` (dstack's name; characters EC2 refuses become ``_``)."""
    suffix = rand if rand is not None else "".join(secrets.choice(_ALPHABET) for _ in range(8))
    head = _BAD.sub("_", f"dstack-{project}-{fleet}")[: NAME_LIMIT - len(suffix) - 1]
    return f"{head}-{suffix}"


def unused(groups: Iterable[tuple[str, float]], named: set[str], grace: float, now: float) -> list[str]:
    """Those of ``groups`` ((name, when made)) that no live instance names and older than ``grace``."""
    return [name for name, made in groups if name not in named and now - made > grace]


def create(
    client: Any, name: str, server_id: str, project: str, now: float, extra: dict[str, str] | None = None
) -> None:
    """Create the cluster group ``name`` (one that exists already is taken as it is: a retried launch), tagged
    with the ``extra`` tags (the backend's and the fleet's) and corral's own."""
    tags = [{"Key": k, "Value": v} for k, v in (extra or {}).items()] + [
        {"Key": OWNER[0], "Value": OWNER[1]},
        {"Key": TAG_SERVER, "Value": server_id},
        {"Key": TAG_PROJECT, "Value": project},
        {"Key": TAG_CREATED, "Value": str(int(now))},
    ]
    try:
        ec2.call(
            client,
            "create_placement_group",
            GroupName=name,
            Strategy="cluster",
            TagSpecifications=[{"ResourceType": "placement-group", "Tags": tags}],
        )
    except ec2.AWSError as e:
        if e.code != "InvalidPlacementGroup.Duplicate":
            raise


def owned(client: Any, server_id: str) -> list[tuple[str, float]]:
    """This server's placement groups: (name, when made)."""
    found = ec2.call(
        client, "describe_placement_groups", Filters=[{"Name": f"tag:{TAG_SERVER}", "Values": [server_id]}]
    )["PlacementGroups"]
    out = []
    for g in found:
        tags = {t["Key"]: t["Value"] for t in g.get("Tags") or []}
        made = tags.get(TAG_CREATED, "")
        out.append((str(g["GroupName"]), float(made) if made.isdigit() else 0.0))
    return out


def delete(client: Any, name: str) -> bool:
    """Delete the group ``name``: True when it is gone (or was already), False while an instance holds it."""
    try:
        ec2.call(client, "delete_placement_group", GroupName=name)
    except ec2.AWSError as e:
        if e.code == "InvalidPlacementGroup.Unknown":
            return True
        if e.code == "InvalidPlacementGroup.InUse":
            return False
        raise
    return True
