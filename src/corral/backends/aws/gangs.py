"""Gangs on EC2: every new instance of one multi-node run launched together, all or nothing.

The instances worker hands the rows a gang's commit reserved (``workers.gangs``) to :func:`create_gang`:

1. Adopt: instances tagged ``corral_gang=<lead row id>`` (a server that crashed after the launch) are taken
   over when there is one per row; a partial set is terminated and the gang launched again.
2. ``reservation``: DescribeCapacityReservations gives its type and zone; the gang launches into it there.
3. ``placement: cluster``: a placement group ``dstack-<project>-<fleet>-<rand>`` (``placement``), unless the
   type is one EC2 refuses in a cluster group (``t2.``/``t3.``: launched without one, as a log says).
4. Launch, one zone at a time (capacity errors move on, bounded by ``MAX_LAUNCH_ATTEMPTS``): every node the
   same offer -> one RunInstances with ``MinCount = MaxCount = N`` (EC2 launches all or none), then each
   instance tagged with its row; otherwise one RunInstances per node in parallel, under a deadline. Client
   tokens ``corral-<row id>-<n>`` as the single-instance path has them. When no zone had room, the gang
   falls back as a single instance does (:func:`shapes`: every node's next offer together, in one region;
   the same attempts bound), unless a ``reservation`` fixes its type.
5. Bring every node up (SSH, the agent). If any launch or bring-up fails, every instance of the gang is
   terminated (confirmed by DescribeInstances), its group deleted, and :class:`GangError` says whether it
   was for capacity (the run waits as ``retry`` says) or not (it fails).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any, Literal

from corral.backends.aws import catalog, ec2, launch, placement, reservations
from corral.backends.aws import gang_cleanup as cleanup
from corral.backends.aws.session import AWSProject, AWSSession, FleetOptions, Region, candidate_offers
from corral.backends.base import Provisioned, ProvisioningError
from corral.domain import aws_tags
from corral.domain.provisioning import FailureKind
from corral.domain.records import InstanceRec
from corral.scheduler.types import Offer

log = logging.getLogger("corral.aws.gangs")

#: How long the parallel launches of a gang (nodes of different offers) may take together.
PARALLEL_DEADLINE = 120.0
TAG_PLACEMENT = cleanup.TAG_PLACEMENT

Path = Literal["count", "parallel"]


class GangError(ProvisioningError):
    """A gang could not be launched; nothing of it is left running. ``capacity``: EC2 had no room for it
    (the run may wait and try again), else a refusal that trying again will not change."""

    def __init__(self, message: str, capacity: bool, attempts: int = 0, kind: FailureKind | None = None) -> None:
        super().__init__(message, kind or ("no_capacity" if capacity else "refused"))
        self.capacity = capacity
        #: The RunInstances calls made for it (the gang's launches share ``MAX_LAUNCH_ATTEMPTS``).
        self.attempts = attempts


def shapes(candidates: Sequence[Sequence[Offer]], reservation: str | None) -> list[list[Offer]]:
    """The offers a gang may launch as, in order: every node's own offer, then each node's ``k``-th
    fallback (``scheduler.fallbacks``: same backend and blocks, cheapest first) together, where all of
    them are in one region (a gang never spans regions). A ``reservation`` fixes the type: no fallback."""
    out: list[list[Offer]] = []
    depth = 1 if reservation else min(len(c) for c in candidates)
    for k in range(depth):
        shape = [c[k] for c in candidates]
        if len({o.region for o in shape}) == 1 and shape not in out:
            out.append(shape)
    return out


def launch_path(offers: Sequence[Offer]) -> Path:
    """``count`` when every node is the same offer (type, region, spot or not): one RunInstances with
    ``MinCount = MaxCount = N``; else ``parallel``: one RunInstances per node."""
    first = offers[0]
    key = (first.instance_type, first.region, first.resources.spot)
    return "count" if all((o.instance_type, o.region, o.resources.spot) == key for o in offers) else "parallel"


def match_adopted(row_ids: Sequence[str], found: Sequence[dict[str, Any]]) -> dict[str, str] | None:
    """Row id -> EC2 id for instances a launch of the gang made before a crash: an instance tagged with its
    own row first, the rest (a count launch not yet tagged per row) by launch index; None unless there is
    exactly one per row."""
    if len(found) != len(row_ids):
        return None
    out: dict[str, str] = {}
    rest = []
    for i in found:
        row = str({t["Key"]: t["Value"] for t in i.get("Tags") or []}.get(launch.TAG_INSTANCE) or "")
        if row in row_ids and row != row_ids[0] and row not in out:
            out[row] = str(i["InstanceId"])
        else:
            rest.append(i)
    free = [r for r in row_ids if r not in out]
    for row, i in zip(free, sorted(rest, key=lambda i: int(i.get("AmiLaunchIndex") or 0)), strict=False):
        out[row] = str(i["InstanceId"])
    return out if len(out) == len(row_ids) else None


async def create_gang(
    session: AWSSession, rows: Sequence[InstanceRec], cluster: bool, reservation: str | None
) -> list[Provisioned]:
    """Launch and bring up ``rows`` (in order; the first is the gang's lead) together; their
    ``Provisioned`` in the same order, or :class:`GangError` with every instance of the gang terminated."""
    lead = rows[0]
    project = await session.project(lead.project_name)
    candidates = [candidate_offers(r, project) for r in rows]
    primary = [c[0] for c in candidates]
    offers = primary
    region = offers[0].region
    if any(o.region != region for o in offers):
        raise GangError("the nodes of a multi-node run must be in one region", capacity=False)
    client = await session.ec2(ec2.client, project.creds, region)
    found = await session.ec2(ec2.by_tag, client, launch.TAG_GANG, lead.id)
    adopted = match_adopted([r.id for r in rows], found)
    group: str | None = None
    if adopted is not None:
        ids = [adopted[r.id] for r in rows]
        tags = {t["Key"]: t["Value"] for t in found[0].get("Tags") or []}
        group = tags.get(TAG_PLACEMENT) or None
        types = {str(i["InstanceId"]): i.get("InstanceType") for i in found}
        offers = next(  # the shape it was launched as (a fallback, maybe), in this region
            (x for x in shapes(candidates, reservation) if [o.instance_type for o in x] == [types[i] for i in ids]),
            primary,
        )
        log.info("gang of %s: adopting %s, launched before a restart", lead.name, ", ".join(ids))
    else:
        if found:  # a partial launch: nothing of it is kept
            await cleanup.rollback(session, client, [str(i["InstanceId"]) for i in found], None)
        options = await session.fleet_options(lead)
        launched = await _launch_shapes(session, project, rows, candidates, client, (cluster, reservation), options)
        ids, group, offers, client = launched
    try:
        done = await _bring_up(session, project, rows, offers, client, ids, group)
    except ProvisioningError as e:
        await cleanup.rollback(session, client, ids, group)
        raise GangError(f"a node of the gang could not be brought up: {e}", capacity=False) from None
    # a gang that fell back on other offers: each row records the offer it launched
    return [
        p if o == mine else dataclasses.replace(p, offer=o) for p, o, mine in zip(done, offers, primary, strict=True)
    ]


async def _launch_shapes(
    session: AWSSession,
    project: AWSProject,
    rows: Sequence[InstanceRec],
    candidates: Sequence[Sequence[Offer]],
    client: Any,
    how: tuple[bool, str | None],
    options: FleetOptions,
) -> tuple[list[str], str | None, list[Offer], Any]:
    """Launch the gang as its own offers, else (EC2 had no room for them in any zone) as the next shape of
    :func:`shapes`, as a single instance falls back; the ids, group, offers launched and region's client.
    ``how``: in a cluster placement group or not, into which capacity reservation (or none)."""
    reservation = how[1]
    errors: list[str] = []
    attempts = 0
    for shape in shapes(candidates, reservation):
        if attempts >= launch.MAX_LAUNCH_ATTEMPTS:
            break
        if shape[0].region != candidates[0][0].region:
            here = await session.ec2(ec2.client, project.creds, shape[0].region)
        else:
            here = client
        try:
            ids, group = await _launch(session, project, rows, shape, here, how, options, attempts)
        except GangError as e:
            if not e.capacity:
                raise
            errors.append(str(e))
            attempts = max(e.attempts, attempts)
            continue
        return ids, group, shape, here
    raise GangError("; then ".join(errors) or "aws: no offer of the gang to launch", capacity=True, attempts=attempts)


async def _bring_up(
    session: AWSSession,
    project: AWSProject,
    rows: Sequence[InstanceRec],
    offers: Sequence[Offer],
    client: Any,
    ids: Sequence[str],
    group: str | None,
) -> list[Provisioned]:
    done = await asyncio.gather(
        *(session.bring_up(r, project, client, o, i) for r, o, i in zip(rows, offers, ids, strict=False)),
        return_exceptions=True,
    )
    errors = [d for d in done if isinstance(d, BaseException)]
    if errors:
        raise ProvisioningError("; ".join(str(e) for e in errors))
    out: list[Provisioned] = []
    for p in done:
        assert isinstance(p, Provisioned)
        conn = dict(p.agent.connection or {})
        conn["aws"] = {**conn.get("aws", {}), "gang": rows[0].id, "placement_group": group}
        out.append(dataclasses.replace(p, agent=dataclasses.replace(p.agent, connection=conn)))
    return out


async def _reservation_zones(
    session: AWSSession,
    client: Any,
    region: str,
    zones: dict[str, str],
    reservation: str | None,
    offers: Sequence[Offer],
    nodes: int,
) -> tuple[dict[str, str], dict[str, Any]]:
    """The zones (zone -> subnet) the gang may launch in and RunInstances' extra parameters: with a capacity
    ``reservation``, only its zone and its target, after checking it can hold the ``nodes``."""
    if not reservation:
        return zones, {}
    reserved = await session.ec2(reservations.lookup, client, region, reservation)
    types = sorted({o.instance_type for o in offers})
    if len(types) > 1:
        why: str | None = f"capacity reservation {reservation} holds one instance type, the nodes are {types}"
    else:
        why = reservations.problem(reserved, reservation, types[0], nodes)
    if why is not None:
        raise GangError(why, capacity=reservations.waits(reserved, nodes))
    assert reserved is not None
    if reserved.zone not in zones:
        raise GangError(
            f"capacity reservation {reservation} is in {reserved.zone}: the VPC has no subnet there", capacity=False
        )
    return {reserved.zone: zones[reserved.zone]}, dict(reservations.launch_params(reserved))


async def _placement_group(
    session: AWSSession,
    client: Any,
    project: AWSProject,
    rows: Sequence[InstanceRec],
    offers: Sequence[Offer],
    cluster: bool,
    owner: tuple[str, dict[str, str]],
) -> str | None:
    """The cluster placement group made for the gang, or None: not asked for, or a type EC2 refuses in one
    (launched without it, as a log line says)."""
    if not cluster:
        return None
    if not all(placement.supports_cluster(o.instance_type) for o in offers):
        log.info("gang of %s: %s cannot go into a cluster placement group; launched without one",
                 rows[0].name, offers[0].instance_type)  # fmt: skip
        return None
    group = placement.group_name(project.name, rows[0].fleet_name or "", None)
    try:
        server_id, tags = owner  # this server's id, and the backend's and the fleet's tags
        await session.ec2(placement.create, client, group, server_id, project.name, time.time(), tags)
    except ec2.AWSError as e:
        raise GangError(f"placement group {group}: {e}", capacity=False) from None
    return group


async def _launch(
    session: AWSSession,
    project: AWSProject,
    rows: Sequence[InstanceRec],
    offers: Sequence[Offer],
    client: Any,
    how: tuple[bool, str | None],
    options: FleetOptions,
    attempt: int = 0,
) -> tuple[list[str], str | None]:
    """RunInstances for the gang (``attempt`` calls made for it already) in the fleet's ``availability_zones``,
    with its tags; the EC2 ids in row order and the placement group (or None)."""
    region = offers[0].region
    zones, base = await _prepare(session, project, rows, offers, client, how, options)
    group = base.group
    path = launch_path(offers)
    errors: list[str] = []
    first = attempt
    capacity = True
    kind: FailureKind = "refused"
    for zone, subnet in zones.items():
        itypes = {launch.market_key(o.instance_type, o.resources.spot) for o in offers}
        now = time.time()
        if any(session.unavailable.quota_blocked(region, o.instance_type, o.resources.spot, now) for o in offers):
            errors.append(f"{region}: quota reached lately")
            break
        if any(session.unavailable.blocked(region, zone, t, now) for t in itypes):
            errors.append(f"{zone}: no capacity lately")
            continue
        if attempt >= launch.MAX_LAUNCH_ATTEMPTS:
            break
        attempt += 1
        base = dataclasses.replace(base, subnet=subnet)
        if path == "count":
            got = await _launch_count(session, base, rows, offers[0], attempt)
        else:
            got = await _launch_parallel(session, base, rows, offers, attempt)
        if isinstance(got, list):
            return got, group
        error, refused = got
        verdict = launch.classify(error.code)
        errors.append(f"{zone}: {error}")
        log.info("gang of %s: launch in %s: %s (%s)", rows[0].name, zone, error, verdict)
        _remember(session, verdict, region, zone, refused, offers)
        kind = launch.failure_kind(error.code)
        if launch.next_move(verdict) != "zone":
            capacity = verdict in ("quota", "wait")  # the next shape may launch; a Capacity Block soon will
            break
    if group is not None:
        await cleanup.delete_group(session, client, group)
    what = ", ".join(sorted({o.instance_type for o in offers}))
    raise GangError(
        f"aws: the {len(rows)} nodes ({what} in {region}) could not be launched together "
        f"({attempt - first} attempt(s)): {'; '.join(errors) or 'no zone to try'}",
        capacity=capacity,
        attempts=attempt,
        kind=None if capacity else kind,
    )


async def _prepare(
    session: AWSSession,
    project: AWSProject,
    rows: Sequence[InstanceRec],
    offers: Sequence[Offer],
    client: Any,
    how: tuple[bool, str | None],
    options: FleetOptions,
) -> tuple[dict[str, str], _Params]:
    """The zones (zone -> subnet) the gang may launch in -- the fleet's ``availability_zones``, the capacity
    reservation's zone -- and the launch's parameters but its subnet: the image, the placement group (made
    now), the reservation's target, the tags."""
    cluster, reservation = how
    region = offers[0].region
    try:
        where = await session.region(project, region, client)
    except ProvisioningError as e:
        raise GangError(str(e), capacity=False, kind=e.kind) from None
    allowed = launch.in_zone(dict(where.zones), "", options.zones)
    if not allowed:
        raise GangError(f"{region}: no usable subnet in the fleet's availability_zones", capacity=False, kind="network")
    zones, extra = await _reservation_zones(session, client, region, allowed, reservation, offers, len(rows))
    try:
        image = await session.ec2(ec2.image, where.client, project.config, bool(offers[0].resources.gpus))
    except ec2.AWSError as e:
        raise GangError(f"{region}: {e}", capacity=False, kind="image") from None
    server_id = await session.server_id()
    tags = session.tags(project, options)
    group = await _placement_group(session, client, project, rows, offers, cluster, (server_id, tags))
    if group is not None:
        extra["Placement"] = {**extra.get("Placement", {}), "GroupName": group}
    return zones, _Params(project, server_id, image, where, "", extra, group, rows[0].id, tags)


def _remember(
    session: AWSSession, verdict: launch.Verdict, region: str, zone: str, refused: list[str], offers: Sequence[Offer]
) -> None:
    """What later launches skip a while: the ``refused`` offerings of the zone (no capacity), or the market and
    quota group of ``offers`` in the region (a quota: never the whole region)."""
    if verdict == "capacity":
        for t in refused:
            session.unavailable.mark(region, zone, t, time.time())
    elif verdict == "quota":
        for o in offers:
            session.unavailable.mark_quota(region, o.instance_type, o.resources.spot, time.time())


@dataclasses.dataclass(frozen=True)
class _Params:
    project: AWSProject
    server_id: str
    image: ec2.Image
    where: Region
    subnet: str
    extra: dict[str, Any]
    group: str | None
    lead: str
    #: The backend's and the fleet's tags.
    tags: dict[str, str]

    def run(self, offer: Offer, row: InstanceRec, count: int, token: str) -> dict[str, Any]:
        tags = launch.instance_tags(self.server_id, self.project.name, row.fleet_name, row.id, row.name, self.tags)
        tags += [{"Key": launch.TAG_GANG, "Value": self.lead}]
        if self.group:
            tags.append({"Key": TAG_PLACEMENT, "Value": self.group})
        spec = launch.LaunchSpec(
            image=self.image.image_id,
            root_device=self.image.root_device,
            instance_type=offer.instance_type,
            spot=offer.resources.spot,
            security_group=self.where.group,
            tags=tags,
            public_key=self.project.ssh_public_key,
            public_ip=self.project.config.get("public_ips") is not False,
            iam_instance_profile=self.project.config.get("iam_instance_profile") or None,
            extra=self.extra,
        )
        return launch.run_params(spec, self.subnet, count, token, catalog.DISK_GIB)


#: A launch that failed: EC2's error, and the offerings (``launch.market_key``) it refused.
Refused = tuple[ec2.AWSError, list[str]]


async def _launch_count(
    session: AWSSession, p: _Params, rows: Sequence[InstanceRec], offer: Offer, attempt: int
) -> list[str] | Refused:
    """One RunInstances for every node, then each instance tagged with its own row (by launch index)."""
    params = p.run(offer, rows[0], len(rows), launch.client_token(rows[0].id, attempt))
    key = [launch.market_key(offer.instance_type, offer.resources.spot)]
    try:
        reply = await session.ec2(ec2.call, p.where.once, "run_instances", **params)
    except ec2.AWSError as e:
        return e, key
    launched = sorted(reply["Instances"], key=lambda i: int(i.get("AmiLaunchIndex") or 0))
    await _cancel_spot_requests(session, p.where.client, launched)
    ids = [str(i["InstanceId"]) for i in launched]
    if len(ids) != len(rows):  # EC2 promises MinCount or nothing; never keep a part
        await cleanup.rollback(session, p.where.client, ids, None)
        return ec2.AWSError("InsufficientInstanceCapacity", f"{len(ids)} of {len(rows)} instances launched"), key
    for row, ec2_id in zip(rows[1:], ids[1:], strict=False):
        tags = [
            {"Key": launch.TAG_INSTANCE, "Value": row.id},
            {"Key": aws_tags.NAME, "Value": aws_tags.name_tag(p.project.name, row.name)},
        ]
        await session.ec2(ec2.call, p.where.client, "create_tags", Resources=[ec2_id], Tags=tags)
    return ids


async def _launch_parallel(
    session: AWSSession, p: _Params, rows: Sequence[InstanceRec], offers: Sequence[Offer], attempt: int
) -> list[str] | Refused:
    """One RunInstances per node, at once, under ``PARALLEL_DEADLINE``; all terminated if any fails."""
    calls = [
        session.ec2(ec2.call, p.where.once, "run_instances", **p.run(o, r, 1, launch.client_token(r.id, attempt)))
        for r, o in zip(rows, offers, strict=False)
    ]
    tasks = [asyncio.ensure_future(c) for c in calls]
    _done, pending = await asyncio.wait(tasks, timeout=PARALLEL_DEADLINE)
    ids: list[str] = []
    error: ec2.AWSError | None = None
    refused: list[str] = []
    for t, o in zip(tasks, offers, strict=False):
        if t in pending:
            t.cancel()
            error = error or ec2.AWSError("RequestTimeout", f"no reply within {PARALLEL_DEADLINE:g}s")
        elif t.exception() is not None:
            exc = t.exception()
            error = error or (exc if isinstance(exc, ec2.AWSError) else ec2.AWSError("", str(exc)))
            refused.append(launch.market_key(o.instance_type, o.resources.spot))
        else:
            await _cancel_spot_requests(session, p.where.client, t.result()["Instances"])
            ids.append(str(t.result()["Instances"][0]["InstanceId"]))
    if error is None:
        return ids
    if ids:
        await cleanup.rollback(session, p.where.client, ids, None)
    return error, refused


async def _cancel_spot_requests(session: AWSSession, client: Any, launched: Sequence[dict[str, Any]]) -> None:
    """Cancel the one-time spot requests of ``launched`` so that they cannot be fulfilled again."""
    for i in launched:
        if i.get("SpotInstanceRequestId"):
            await session.cancel_spot_request(client, str(i["SpotInstanceRequestId"]))
