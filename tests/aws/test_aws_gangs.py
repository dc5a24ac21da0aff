"""Multi-node gangs on EC2 (moto behind the fault proxy, which plays placement groups and capacity
reservations): a 2-node run on a ``placement: cluster`` fleet with a ``reservation`` launches both nodes in
one RunInstances (``MinCount = MaxCount = 2``) in a placement group and into the reservation, and the group
is deleted once they are gone; a gang whose second launch fails leaves nothing running; a run whose gang
finds no capacity fails whole. Plus the pure parts: names, which launch path, adoption after a crash."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import facts
import pytest
import pytest_asyncio
from aws_server import fleet_server
from ec2_extras import Reservation
from moto_harness import REGION, VPC_NAME, FaultProxy, Hypervisor, MotoEC2, fault_proxy

from corral.backends.aws import ec2, gang_cleanup, gangs, launch, placement, reservations
from corral.backends.aws.compute import AWSCompute
from corral.backends.aws.session import FleetOptions
from corral.domain.records import InstanceRec
from corral.domain.statuses import InstanceStatus
from corral.scheduler.codec import offer_to_json
from corral.scheduler.fallbacks import FALLBACKS_KEY
from corral.scheduler.types import Offer
from corral.workers import gangs as worker_gangs
from server_harness import RunningServer, finished_run, wait_for

ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

CONFIG = f"""
projects:
  - name: main
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIAGANGS, secret_key: gangs-secret-value}}
        regions: [{REGION}]
        vpc_name: {VPC_NAME}
        public_ips: false
"""
RESERVATION = "cr-0123456789abcdef0"
#: Holds a type dearer than the cheapest offer that fits: the fleet's offers are narrowed to it.
RESERVED_C7I = "cr-0c7i0c7i0c7i0c7i0"
FLEET = {"type": "fleet", "name": "gangfl", "nodes": "0..2", "backends": ["aws"], "placement": "cluster",
         "instance_types": ["m7i.large"], "reservation": RESERVATION, "resources": {"cpu": "2.."},
         "tags": {"team": "gangs"}}  # fmt: skip


def _task(name: str) -> dict[str, Any]:
    conf = {"type": "task", "name": name, "nodes": 2, "commands": ["echo node $DSTACK_NODE_RANK"],
            "fleets": ["gangfl"], "resources": {"cpu": "2.."}}  # fmt: skip
    return {"force": True, "plan": {"run_spec": {"configuration": conf}}}


@pytest.fixture(scope="module")
def proxy(moto: MotoEC2, hypervisor: Hypervisor, vpc: tuple[str, str, str]) -> Iterator[FaultProxy]:
    """No capacity in zone a (no fake hosts there); the reservation is in zone b."""
    with fault_proxy(moto, [vpc[1]]) as fp:
        fp.extras.reservations[RESERVATION] = Reservation(RESERVATION, "m7i.large", f"{REGION}b", 2)
        fp.extras.reservations[RESERVED_C7I] = Reservation(
            RESERVED_C7I, "c7i.xlarge", f"{REGION}b", 1, reservation_type=facts.CAPACITY_BLOCK
        )
        yield fp


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory, proxy: FaultProxy) -> AsyncIterator[RunningServer]:
    async with fleet_server(
        tmp_path_factory.mktemp("gangs"), CONFIG, FLEET, cleanup="none", safety_net_interval=1.0
    ) as s:
        yield s


@pytest.fixture
def fresh_cache(server: RunningServer) -> None:
    """What an earlier test's refusals taught the compute is forgotten."""
    server.ctx.computes["aws"].session.unavailable = launch.Unavailable(ttl=60)


def _live(moto: MotoEC2, tag: str, value: str) -> list[dict[str, Any]]:
    return [
        i
        for i in moto.instances(instance_state_name=["pending", "running", "shutting-down"])
        if {"Key": tag, "Value": value} in (i.get("Tags") or [])
    ]


# ---- pure parts --------------------------------------------------------------------------------------


def _offer(itype: str, spot: bool = False, region: str = REGION) -> Offer:
    from corral.domain.resources import InstanceResources

    return Offer("aws", itype, region, 0.1, InstanceResources(cpus=2, memory_mib=8192, gpus=(), spot=spot))


def test_names_types_and_which_launch_path() -> None:
    assert placement.group_name("main", "my fleet", "abcd1234") == "dstack-main-my_fleet-abcd1234"
    assert len(placement.group_name("p" * 300, "f")) <= placement.NAME_LIMIT
    rand = placement.group_name("main", "f").rsplit("-", 1)[1]
    assert len(rand) == 8 and rand.isalnum() and rand == rand.lower()
    assert not placement.supports_cluster("t3.large") and not placement.supports_cluster("t2.small")
    assert placement.unused([("a", 0.0), ("b", 0.0), ("c", 90.0)], {"b"}, grace=60.0, now=100.0) == ["a"]
    assert placement.supports_cluster("p5.48xlarge")
    # every family EC2's placement group rules refuse, and none it accepts
    assert [t for t in facts.CLUSTER_REFUSED if placement.supports_cluster(t)] == []
    assert all(placement.supports_cluster(t) for t in facts.CLUSTER_ACCEPTED)
    same = [_offer("m7i.large"), _offer("m7i.large")]
    assert gangs.launch_path(same) == "count"
    assert gangs.launch_path([_offer("m7i.large"), _offer("c7i.xlarge")]) == "parallel"
    assert gangs.launch_path([_offer("m7i.large"), _offer("m7i.large", spot=True)]) == "parallel"
    # a gang refused for capacity waits while its run's retry (on no-capacity) lasts; else it fails
    assert worker_gangs.waits(True, reserved_at=100.0, wait=60.0, now=150.0)
    assert not worker_gangs.waits(True, reserved_at=100.0, wait=60.0, now=161.0)
    assert not worker_gangs.waits(True, reserved_at=100.0, wait=None, now=101.0)
    assert not worker_gangs.waits(False, reserved_at=100.0, wait=60.0, now=101.0)


def test_adoption_maps_instances_to_rows() -> None:
    def inst(iid: str, row: str, index: int = 0) -> dict[str, Any]:
        return {"InstanceId": iid, "AmiLaunchIndex": index, "Tags": [{"Key": "corral_instance", "Value": row}]}

    # a count launch crashed before its instances were tagged per row: by launch index
    assert gangs.match_adopted(["a", "b"], [inst("i-2", "a", 1), inst("i-1", "a", 0)]) == {"a": "i-1", "b": "i-2"}
    # tagged per row (parallel launches, or a count launch tagged), in any order
    assert gangs.match_adopted(["a", "b"], [inst("i-9", "b"), inst("i-8", "a")]) == {"a": "i-8", "b": "i-9"}
    assert gangs.match_adopted(["a", "b"], [inst("i-1", "a")]) is None  # a part: launched again


def test_the_shapes_a_gang_falls_back_on() -> None:
    m, c, west = _offer("m7i.large"), _offer("c7i.xlarge"), _offer("c7i.xlarge", region="us-west-2")
    assert gangs.shapes([[m, c], [m, c]], None) == [[m, m], [c, c]]  # each node's next offer, together
    assert gangs.shapes([[m, c], [m, west]], None) == [[m, m]]  # never across regions
    assert gangs.shapes([[m, c], [m]], None) == [[m, m]]  # a node with no fallback: none
    assert gangs.shapes([[m, c], [m, c]], RESERVATION) == [[m, m]]  # the reservation fixes the type


def test_reservation_rules() -> None:
    r = reservations.Reserved(RESERVATION, "m7i.large", f"{REGION}b", REGION, "active", 2)
    assert reservations.problem(r, RESERVATION, "m7i.large", 2) is None
    assert "holds m7i.large, not c7i.xlarge" in str(reservations.problem(r, RESERVATION, "c7i.xlarge", 1))
    assert "1 instance(s) free" in str(
        reservations.problem(dataclasses.replace(r, available=1), RESERVATION, "m7i.large", 2)
    )
    assert "not found" in str(reservations.problem(None, RESERVATION, "m7i.large", 1))
    offers = [_offer("m7i.large"), _offer("c7i.xlarge"), _offer("m7i.large", region="us-west-2")]
    assert reservations.narrowed(offers, [r]) == [offers[0]]
    target = reservations.launch_params(r)["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target == {
        "CapacityReservationId": RESERVATION
    } and "InstanceMarketOptions" not in reservations.launch_params(r)
    block = dataclasses.replace(r, reservation_type=facts.CAPACITY_BLOCK)
    assert reservations.launch_params(block)["InstanceMarketOptions"] == {"MarketType": facts.CAPACITY_BLOCK}
    # a Capacity Block before its start, or a reservation short of instances, is waited for; an expired one is not
    scheduled = dataclasses.replace(block, state="scheduled")
    assert "not active yet" in str(reservations.problem(scheduled, RESERVATION, "m7i.large", 1))
    assert reservations.waits(scheduled, 1) and reservations.waits(dataclasses.replace(r, available=1), 2)
    assert not reservations.waits(dataclasses.replace(r, state="expired"), 1) and not reservations.waits(None, 1)


# ---- against moto ----------------------------------------------------------------------------------------


def _row(offer: Offer, num: int) -> InstanceRec:
    return InstanceRec(
        id=str(uuid.uuid4()), project_id="p", project_name="main", fleet_id=None, fleet_name="pargang",
        name=f"pargang-{num}", instance_num=num, status=InstanceStatus.PENDING, unreachable=False, backend="aws",
        region=REGION,
        price=offer.price, offer=offer_to_json(offer), total_blocks=1, busy_blocks=0, hostname=None, agent=None,
        created_at=0.0, started_at=None, finished_at=None, last_job_finished_at=None, idle_duration=None,
        termination_reason=None, termination_reason_message=None,
    )  # fmt: skip


@ON_MODULE_LOOP
async def test_a_gang_whose_second_launch_fails_leaves_nothing_running(
    server: RunningServer, proxy: FaultProxy, hypervisor: Hypervisor, vpc: tuple[str, str, str]
) -> None:
    """Two nodes of different types: parallel launches; the second is refused for capacity, so the first,
    which EC2 launched, is terminated (confirmed) and the placement group deleted."""
    compute: AWSCompute = server.ctx.computes["aws"]
    by_type = {o.instance_type: o for o in compute.offers() if o.region == REGION and not o.resources.spot}
    rows = [_row(by_type["m7i.large"], 0), _row(by_type["c7i.xlarge"], 1)]
    before = len(proxy.launches)
    proxy.fault = lambda lt: "InsufficientInstanceCapacity" if lt.instance_type == "c7i.xlarge" else None
    try:
        with pytest.raises(gangs.GangError) as failed:
            await compute.create_gang(rows, True, None)
    finally:
        proxy.fault = None
    assert failed.value.capacity
    made = proxy.launches[before:]
    in_b = [(m.instance_type, m.error) for m in made if m.subnet == vpc[2]]
    assert sorted(in_b) == [("c7i.xlarge", "InsufficientInstanceCapacity"), ("m7i.large", "")]
    groups = {m.group for m in made}
    assert len(groups) == 1 and next(iter(groups)).startswith("dstack-main-pargang-")
    assert not _live(hypervisor.moto, "corral_gang", rows[0].id)  # nothing left running
    assert hypervisor.moto.instances(tag_key=["corral_gang"], tag_value=[rows[0].id])  # but it was launched
    assert next(iter(groups)) in proxy.extras.deleted and not proxy.extras.groups


@ON_MODULE_LOOP
async def test_a_run_whose_gang_finds_no_capacity_fails_whole(
    fresh_cache: None, server: RunningServer, proxy: FaultProxy
) -> None:
    before = len(proxy.launches)
    proxy.fault = lambda lt: "InsufficientInstanceCapacity"
    try:
        async with server.client() as c:
            r = await c.post("/api/project/main/runs/apply", json=_task("gang-nocap"))
            assert r.status_code == 200, r.text
            run = await finished_run(c, "gang-nocap", timeout=60)
            instances = (await c.post("/api/instances/list", json={})).json()
    finally:
        proxy.fault = None
    assert run["status"] == "failed"
    subs = [j["job_submissions"][-1] for j in run["jobs"]]
    assert [s["termination_reason"] for s in subs] == ["failed_to_start_due_to_no_capacity"] * 2
    assert all("could not be launched whole" in s["termination_reason_message"] for s in subs)
    made = proxy.launches[before:]
    assert [(m.count, m.reservation, m.error) for m in made] == [(2, RESERVATION, "InsufficientInstanceCapacity")]
    assert all(i["status"] == "terminated" for i in instances if i["fleet_name"] == "gangfl")
    assert made[0].group in proxy.extras.deleted


@ON_MODULE_LOOP
async def test_a_gang_waits_for_capacity_then_launches_together_in_a_placement_group_and_the_reservation(
    server: RunningServer,
    proxy: FaultProxy,
    hypervisor: Hypervisor,
    vpc: tuple[str, str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``retry`` on ``no-capacity``: the refused gang keeps its reservation and is launched again, whole,
    once EC2 has room: one RunInstances for both nodes, in the reservation's zone, in a cluster placement
    group, into the reservation. The groups are deleted: the refused launch's at once, the other's once
    its instances are terminated."""
    server.ctx.computes["aws"].session.unavailable = launch.Unavailable(ttl=0)  # the refusal is not remembered
    monkeypatch.setattr(worker_gangs, "RETRY_INTERVAL", 2.5)  # two passes of the worker wait
    refusals = ["InsufficientInstanceCapacity"]
    before = len(proxy.launches)
    proxy.fault = lambda lt: refusals.pop() if refusals else None
    body = _task("gang-ok")
    body["plan"]["run_spec"]["configuration"]["retry"] = {"on_events": ["no-capacity"], "duration": 120}
    async with server.client() as c:
        try:
            r = await c.post("/api/project/main/runs/apply", json=body)
            assert r.status_code == 200, r.text
            run = await finished_run(c, "gang-ok", timeout=120)
        finally:
            proxy.fault = None
        sub = run["jobs"][0]["job_submissions"][-1]
        assert run["status"] == "done", sub.get("termination_reason_message")
        assert [len(j["job_submissions"]) for j in run["jobs"]] == [1, 1]  # the same submissions waited
        made = proxy.launches[before:]
        assert [(m.count, m.subnet, m.reservation, m.error) for m in made] == [
            (2, vpc[2], RESERVATION, "InsufficientInstanceCapacity"),
            (2, vpc[2], RESERVATION, ""),
        ]
        refused, group = made[0].group, made[1].group
        assert group.startswith("dstack-main-gangfl-") and group in proxy.extras.groups
        # the fleet's tags are on the group it made and on its instances, beside corral's
        assert proxy.extras.group_tags[group]["team"] == "gangs" and proxy.extras.group_tags[group]["corral_server"]
        nodes = [
            i
            for i in hypervisor.moto.instances()
            if {"Key": "corral_placement_group", "Value": group} in (i.get("Tags") or [])
        ]
        assert len(nodes) == 2 and all({"Key": "team", "Value": "gangs"} in i["Tags"] for i in nodes)
        assert refused != group and refused in proxy.extras.deleted
        hosts = {j["job_submissions"][-1]["job_provisioning_data"]["internal_ip"] for j in run["jobs"]}
        assert len(hosts) == 2
        r = await c.post("/api/project/main/fleets/delete", json={"names": ["gangfl"]})
        assert r.status_code == 200, r.text

        async def deleted() -> bool:
            return group in proxy.extras.deleted and not _live(hypervisor.moto, "corral_fleet", "gangfl")

        await wait_for(deleted, timeout=60)


@ON_MODULE_LOOP
async def test_a_gang_with_no_room_for_its_type_falls_back_on_its_next_offer_whole(
    fresh_cache: None, server: RunningServer, proxy: FaultProxy, hypervisor: Hypervisor
) -> None:
    """EC2 has no m7i.large in any zone: the gang launches as its nodes' next offer (c7i.xlarge), both
    nodes in one RunInstances, and each row records the offer it launched."""
    compute: AWSCompute = server.ctx.computes["aws"]
    by_type = {o.instance_type: o for o in compute.offers() if o.region == REGION and not o.resources.spot}
    rows = [_row(by_type["m7i.large"], n) for n in (0, 1)]
    rows = [dataclasses.replace(r, offer={**(r.offer or {}), FALLBACKS_KEY: [offer_to_json(by_type["c7i.xlarge"])]})
            for r in rows]  # fmt: skip
    before = len(proxy.launches)
    proxy.fault = lambda lt: "InsufficientInstanceCapacity" if lt.instance_type == "m7i.large" else None
    try:
        provisioned = await compute.create_gang(rows, True, None)
    finally:
        proxy.fault = None
    made = [(m.instance_type, m.count, bool(m.error)) for m in proxy.launches[before:]]
    assert made[-1] == ("c7i.xlarge", 2, False) and all(failed for _, _, failed in made[:-1])
    assert {t for t, _, _ in made[:-1]} == {"m7i.large", "c7i.xlarge"}  # (zone a never has room here)
    assert [p.offer for p in provisioned] == [by_type["c7i.xlarge"]] * 2
    for r, p in zip(rows, provisioned, strict=True):
        await compute.terminate_instance(r.id, p.agent)
    assert not _live(hypervisor.moto, "corral_gang", rows[0].id)


@ON_MODULE_LOOP
async def test_a_gang_launched_before_a_crash_is_adopted_not_launched_again(
    fresh_cache: None, server: RunningServer, proxy: FaultProxy, hypervisor: Hypervisor
) -> None:
    """The server launched the gang (one RunInstances) and died before it recorded anything: the next
    provisioning finds the instances by their gang tag and brings them up, with no RunInstances."""
    compute: AWSCompute = server.ctx.computes["aws"]
    offer = next(o for o in compute.offers() if o.instance_type == "m7i.large" and o.region == REGION)
    rows = [_row(offer, 0), _row(offer, 1)]
    project = await compute.project("main")
    client = await compute.session.ec2(ec2.client, project.creds, REGION)
    ids, group = await gangs._launch(
        compute.session, project, rows, [offer, offer], client, (True, None), FleetOptions()
    )
    # the reaper's sweep deletes this server's groups no live instance names (a launch that never came); the group
    # was made 30 s ago: past the 10 s grace these sweeps are given, within the server's own reaper's (60 s), which
    # runs beside this test every second and would otherwise delete it between the two sweeps
    server_id = await compute.session.server_id()
    made = time.time() - 30.0
    await compute.session.ec2(placement.create, client, "dstack-main-adopt-unused0", server_id, "main", made)
    session = compute.session
    assert server.ctx.settings.orphan_grace > 30.0
    assert "dstack-main-adopt-unused0" in await gang_cleanup.sweep_groups(session, project, [REGION], 10.0, report=True)
    assert "dstack-main-adopt-unused0" in proxy.extras.groups  # "report": only logged
    await gang_cleanup.sweep_groups(session, project, [REGION], 10.0, report=False)
    assert "dstack-main-adopt-unused0" in proxy.extras.deleted
    assert group in proxy.extras.groups  # its instances live
    before = len(proxy.launches)
    provisioned = await compute.create_gang(rows, True, None)
    assert len(proxy.launches) == before
    assert [p.agent.connection["aws"]["instance_id"] for p in provisioned] == ids  # type: ignore[index]
    for r, p in zip(rows, provisioned, strict=True):
        await compute.terminate_instance(r.id, p.agent)
    assert not _live(hypervisor.moto, "corral_gang", rows[0].id)
    assert group in proxy.extras.deleted


@ON_MODULE_LOOP
async def test_a_single_node_run_on_a_reserved_fleet_launches_into_the_reservation(
    fresh_cache: None, server: RunningServer, proxy: FaultProxy, hypervisor: Hypervisor, vpc: tuple[str, str, str]
) -> None:
    """A fleet's ``reservation`` applies to every instance it launches, a lone one too, and narrows its
    offers to the reservation's type (dearer than the cheapest that fits) in its region."""
    fleet = {"type": "fleet", "name": "resfl", "nodes": "0..1", "backends": ["aws"], "reservation": RESERVED_C7I,
             "resources": {"cpu": "2.."}}  # fmt: skip
    task = {"type": "task", "name": "res-one", "commands": ["true"], "fleets": ["resfl"], "resources": {"cpu": "2.."}}
    before = len(proxy.launches)
    async with server.client() as c:
        r = await c.post("/api/project/main/fleets/get_plan", json={"spec": {"configuration": fleet, "profile": {}}})
        assert r.status_code == 200, r.text
        listed = {(o["instance"]["name"], o["region"]) for o in r.json()["offers"]}
        assert listed == {("c7i.xlarge", REGION)}  # the plan lists what placement may launch
        r = await c.post(
            "/api/project/main/fleets/apply",
            json={"plan": {"spec": {"configuration": fleet, "profile": {}}}, "force": True},
        )
        assert r.status_code == 200, r.text
        r = await c.post(
            "/api/project/main/runs/apply", json={"force": True, "plan": {"run_spec": {"configuration": task}}}
        )
        assert r.status_code == 200, r.text
        run = await finished_run(c, "res-one", timeout=120)
        assert run["status"] == "done", run["jobs"][0]["job_submissions"][-1].get("termination_reason_message")
        made = proxy.launches[before:]
        # a Capacity Block: the launch names its market, as EC2 requires
        assert [(m.instance_type, m.count, m.subnet, m.reservation, m.group, m.market) for m in made] == [
            ("c7i.xlarge", 1, vpc[2], RESERVED_C7I, "", facts.CAPACITY_BLOCK)
        ]
        await c.post("/api/project/main/fleets/delete", json={"names": ["resfl"]})
        await wait_for(lambda: _none_live(hypervisor.moto, "resfl"), timeout=60)


async def _none_live(moto: MotoEC2, fleet: str) -> bool:
    return not _live(moto, "corral_fleet", fleet)


@ON_MODULE_LOOP
async def test_a_runs_own_reservation_narrows_its_plan_and_its_new_instance_launches_into_it(
    fresh_cache: None, server: RunningServer, proxy: FaultProxy, hypervisor: Hypervisor, vpc: tuple[str, str, str]
) -> None:
    """A run's ``reservation`` (dstack's run option): its plan lists the reservation's type in its region
    only, a fleet naming another reservation offers it nothing (so does ``corral offer``, through the same
    plan), and its new instance launches into the reservation, in its zone."""
    free = {"type": "fleet", "name": "runresfl", "nodes": "0..1", "backends": ["aws"], "resources": {"cpu": "2.."}}
    other = {**free, "name": "otherres", "reservation": RESERVATION}
    task = {"type": "task", "name": "run-res", "commands": ["true"], "fleets": ["runresfl"],
            "resources": {"cpu": "2.."}, "reservation": RESERVED_C7I}  # fmt: skip
    before = len(proxy.launches)
    async with server.client() as c:
        for fleet in (free, other):
            r = await c.post(
                "/api/project/main/fleets/apply",
                json={"plan": {"spec": {"configuration": fleet, "profile": {}}}, "force": True},
            )
            assert r.status_code == 200, r.text
        r = await c.post("/api/project/main/runs/get_plan", json={"run_spec": {"configuration": task}})
        assert r.status_code == 200, r.text
        assert r.json()["corral_plan_error"] is None
        listed = {(o["instance"]["name"], o["region"]) for o in r.json()["job_plans"][0]["offers"]}
        assert listed == {("c7i.xlarge", REGION)}
        # the fleet's own reservation narrows a plan too; a run's other reservation leaves it nothing
        for conf, offers in (({**task, "reservation": None, "fleets": ["otherres"]}, {("m7i.large", REGION)}),
                             ({**task, "fleets": ["otherres"]}, set())):  # fmt: skip
            r = await c.post(
                "/api/project/main/runs/get_plan", json={"run_spec": {"configuration": conf}, "for_offers_only": True}
            )
            assert r.status_code == 200, r.text
            assert {(o["instance"]["name"], o["region"]) for o in r.json()["job_plans"][0]["offers"]} == offers
        assert "`reservation` leave(s) none" in r.json()["corral_plan_error"]
        r = await c.post(
            "/api/project/main/runs/apply", json={"force": True, "plan": {"run_spec": {"configuration": task}}}
        )
        assert r.status_code == 200, r.text
        run = await finished_run(c, "run-res", timeout=120)
        assert run["status"] == "done", run["jobs"][0]["job_submissions"][-1].get("termination_reason_message")
        made = proxy.launches[before:]
        # a Capacity Block: the launch names its market, as EC2 requires
        assert [(m.instance_type, m.count, m.subnet, m.reservation, m.group, m.market) for m in made] == [
            ("c7i.xlarge", 1, vpc[2], RESERVED_C7I, "", facts.CAPACITY_BLOCK)
        ]
        await c.post("/api/project/main/fleets/delete", json={"names": ["runresfl", "otherres"]})
        await wait_for(lambda: _none_live(hypervisor.moto, "runresfl"), timeout=60)
