"""Launch fallbacks against moto, errors injected by the fault proxy: no capacity moves to the next zone,
then to the reservation's next offer; a quota or limit error skips the region (remembered a while); refused
parameters skip the offer; at most ``MAX_LAUNCH_ATTEMPTS`` RunInstances per reservation, each with a new
client token. The launches here are the compute's own (``run_instances``): the instances never need to run."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import facts
import pytest
import pytest_asyncio
from moto_harness import REGION, VPC_NAME, FaultProxy, Hypervisor, Launch, MotoEC2, fault_proxy

from corral.backends.aws import ec2, launch
from corral.backends.aws.compute import AWSCompute
from corral.backends.base import ProvisioningError
from corral.domain.records import InstanceRec
from corral.domain.statuses import InstanceStatus
from corral.scheduler.types import Offer
from corral.store.accounts import get_project
from corral.store.fleets import get_fleet
from server_harness import RunningServer, finished_run, make_settings, running_server, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")

WEST = "us-west-2"
CONFIG = f"""
projects:
  - name: main
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIAFALLBACK, secret_key: fallback-secret}}
        regions: [{REGION}, {WEST}]
        vpc_name: {VPC_NAME}
        public_ips: false
  - name: public
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIAPUBLIC, secret_key: public-secret}}
        regions: [{REGION}]
        vpc_name: {VPC_NAME}
        public_ips: true
  - name: narrow
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIANARROW, secret_key: narrow-secret}}
        regions: [{REGION}]
"""


@pytest.fixture(scope="module")
def proxy(moto: MotoEC2, vpc: tuple[str, str, str]) -> Iterator[FaultProxy]:
    moto.make_region_vpc(WEST)
    with fault_proxy(moto) as fp:
        yield fp


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory, proxy: FaultProxy) -> AsyncIterator[RunningServer]:
    # passes every half second: a termination that failed is tried again soon
    settings = make_settings(
        tmp_path_factory.mktemp("awsfallbacks"), safety_net_interval=0.5, termination_stuck_tries=2
    )
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(CONFIG)
    async with running_server(settings) as s:
        yield s


def _offer(compute: AWSCompute, itype: str, region: str, spot: bool = False) -> Offer:
    return next(
        o for o in compute.offers() if o.instance_type == itype and o.region == region and o.resources.spot == spot
    )


def _rec() -> InstanceRec:
    return InstanceRec(
        id=str(uuid.uuid4()), project_id="p", project_name="main", fleet_id=None, fleet_name="fb", name="fb-0",
        instance_num=0, status=InstanceStatus.PENDING, unreachable=False, backend="aws", region=REGION, price=0.0,
        offer=None,
        total_blocks=1, busy_blocks=0, hostname=None, agent=None, created_at=0.0, started_at=None,
        finished_at=None, last_job_finished_at=None, idle_duration=None, termination_reason=None,
        termination_reason_message=None,
    )  # fmt: skip


async def _launch(
    server: RunningServer,
    proxy: FaultProxy,
    rule: Any,
    *offers: Offer,
    project_name: str = "main",
    rec: InstanceRec | None = None,
) -> tuple[Any, list[Launch]]:
    """Launch a fresh row (or ``rec``) with ``offers`` (the first its own) under the fault ``rule``; what came of
    it (the launched offer, or the ProvisioningError) and the RunInstances calls it made."""
    compute: AWSCompute = server.ctx.computes["aws"]
    project = await compute.project(project_name)
    rec = rec or _rec()
    client = await compute.session.ec2(ec2.client, project.creds, offers[0].region)
    before = len(proxy.launches)
    proxy.fault = rule
    try:
        offer, c, ec2_id = await compute.run_instances(rec, project, list(offers), client)
        await compute.session.ec2(ec2.terminate, c, ec2_id)
        assert offer.zone.startswith(offer.region)  # the zone it was launched in (placement follows volumes)
        got: Any = dataclasses.replace(offer, zone="")  # compared with the catalogue's offers
    except ProvisioningError as e:
        got = e
    finally:
        proxy.fault = None
    made = proxy.launches[before:]
    assert [m.token for m in made] == [f"corral-{rec.id}-{n}" for n in range(1, len(made) + 1)]  # a new one each
    return got, made


@pytest.fixture(autouse=True)
def fresh_cache(server: RunningServer) -> None:
    server.ctx.computes["aws"].session.unavailable = launch.Unavailable(ttl=60)


async def test_a_custom_vpcs_subnets_are_chosen_by_their_route_to_the_internet(
    server: RunningServer, proxy: FaultProxy, moto: MotoEC2, vpc: tuple[str, str, str]
) -> None:
    """The test VPC has private subnets (zones a and b, 0.0.0.0/0 through a NAT gateway) and a public one
    (zone c, routed to an internet gateway): instances with public IPs go to the public one only, those
    without to the private ones only, as dstack picks them."""
    compute = server.ctx.computes["aws"]
    large = _offer(compute, "m7i.large", REGION)
    got, made = await _launch(server, proxy, lambda lt: "InsufficientInstanceCapacity", large, project_name="public")
    assert isinstance(got, ProvisioningError) and [m.subnet for m in made] == [moto.public_subnet]
    compute.session.unavailable = launch.Unavailable(ttl=60)
    got, made = await _launch(server, proxy, lambda lt: "InsufficientInstanceCapacity", large)
    assert isinstance(got, ProvisioningError) and [m.subnet for m in made] == [vpc[1], vpc[2]]


async def test_no_capacity_moves_to_the_next_zone_then_the_next_offer(server: RunningServer, proxy: FaultProxy) -> None:
    compute = server.ctx.computes["aws"]
    large, xlarge = _offer(compute, "m7i.large", REGION), _offer(compute, "c7i.xlarge", REGION)
    got, made = await _launch(
        server, proxy, lambda lt: "InsufficientInstanceCapacity" if lt.instance_type == "m7i.large" else None,
        large, xlarge,
    )  # fmt: skip
    assert got == xlarge
    assert [(m.instance_type, m.subnet != made[0].subnet, m.error) for m in made] == [
        ("m7i.large", False, "InsufficientInstanceCapacity"),
        ("m7i.large", True, "InsufficientInstanceCapacity"),
        ("c7i.xlarge", False, ""),
    ]
    # remembered: the next launch of m7i.large goes straight to its fallback
    got, made = await _launch(server, proxy, None, large, xlarge)
    assert got == xlarge and [m.instance_type for m in made] == ["c7i.xlarge"]


async def test_a_quota_error_skips_that_market_and_quota_group_of_the_region_and_is_remembered(
    server: RunningServer, proxy: FaultProxy
) -> None:
    """EC2's quotas are per market (on-demand, spot) and family group (Standard, G and VT, P...) in a region:
    a quota error skips the offers that share it, never the region's other groups or markets."""
    compute = server.ctx.computes["aws"]
    east, east2, east_g = (
        _offer(compute, "m7i.large", REGION),
        _offer(compute, "c7i.xlarge", REGION),  # the same Standard on-demand quota
        _offer(compute, "g4dn.xlarge", REGION),  # the G and VT quota
    )
    west = _offer(compute, "m7i.large", WEST)
    east_spot = _offer(compute, "m7i.large", REGION, spot=True)

    def standard_on_demand_in_east(lt: Launch) -> str | None:
        standard = lt.instance_type.startswith(("m7i.", "c7i."))
        return facts.VCPU_LIMIT if lt.region == REGION and standard and not lt.market else None

    got, made = await _launch(server, proxy, standard_on_demand_in_east, east, east2, east_g)
    assert got == east_g
    assert [(m.instance_type, m.error) for m in made] == [("m7i.large", facts.VCPU_LIMIT), ("g4dn.xlarge", "")]
    got, made = await _launch(server, proxy, None, east2, west)
    assert got == west and [m.region for m in made] == [WEST]  # remembered a while
    got, made = await _launch(server, proxy, None, east_spot)
    assert got == east_spot and [m.region for m in made] == [REGION]  # spot has its own quota


async def test_refused_parameters_skip_the_offer_and_attempts_are_bounded(
    server: RunningServer, proxy: FaultProxy
) -> None:
    compute = server.ctx.computes["aws"]
    large, xlarge = _offer(compute, "m7i.large", REGION), _offer(compute, "c7i.xlarge", REGION)
    got, made = await _launch(
        server, proxy, lambda lt: "InvalidParameterCombination" if lt.instance_type == "m7i.large" else None,
        large, xlarge,
    )  # fmt: skip
    assert got == xlarge and [m.instance_type for m in made] == ["m7i.large", "c7i.xlarge"]
    many = [_offer(compute, t, REGION) for t in ("m7i.large", "c7i.xlarge", "t3.large", "m7i.xlarge")]
    got, made = await _launch(server, proxy, lambda lt: "InsufficientInstanceCapacity", *many)
    assert isinstance(got, ProvisioningError) and "InsufficientInstanceCapacity" in str(got)
    assert len(made) == launch.MAX_LAUNCH_ATTEMPTS  # 4 offers x 2 zones would be 8
    compute.session.unavailable = launch.Unavailable(ttl=60)
    got, made = await _launch(server, proxy, lambda lt: "AuthFailure", large, xlarge)
    assert isinstance(got, ProvisioningError) and len(made) == 1  # nothing else would do better


async def test_a_run_lands_on_the_reservations_next_offer_when_its_own_has_no_capacity(
    server: RunningServer, proxy: FaultProxy, hypervisor: Hypervisor, vpc: tuple[str, str, str]
) -> None:
    """End to end: the scheduler's reservation carries its fallbacks; the row ends up with the type it
    launched, its price and its resources."""
    proxy.blocked_subnets = {vpc[1]}  # zone a has no fake hosts
    fleet = {"type": "fleet", "name": "fbfl", "nodes": "0..1", "backends": ["aws"], "regions": [REGION],
             "resources": {"cpu": "2.."}}  # fmt: skip
    task = {"type": "task", "name": "fb-run", "commands": ["echo fell-back"], "fleets": ["fbfl"],
            "resources": {"cpu": "2.."}}  # fmt: skip
    async with server.client() as c:
        r = await c.post(
            "/api/project/main/fleets/apply",
            json={"plan": {"spec": {"configuration": fleet, "profile": {}}}, "force": True},
        )
        assert r.status_code == 200, r.text
        proxy.fault = lambda lt: "InsufficientInstanceCapacity" if lt.instance_type == "t3.large" else None
        try:
            r = await c.post(
                "/api/project/main/runs/apply", json={"force": True, "plan": {"run_spec": {"configuration": task}}}
            )
            assert r.status_code == 200, r.text
            run = await finished_run(c, "fb-run", timeout=120)
        finally:
            proxy.fault = None
            proxy.blocked_subnets = set()
        sub = run["jobs"][0]["job_submissions"][-1]
        assert run["status"] == "done", sub.get("termination_reason_message")
        (inst,) = [i for i in (await c.post("/api/instances/list", json={})).json() if i["fleet_name"] == "fbfl"]
        # the cheapest type with 2 CPUs and 8 GB is t3.large; its next, in price order, m5.large
        fell_back = _offer(server.ctx.computes["aws"], "m5.large", REGION)
        assert inst["instance_type"]["name"] == "m5.large" and inst["price"] == fell_back.price
        assert inst["instance_type"]["resources"]["cpus"] == 2
        jpd = sub["job_provisioning_data"]
        assert jpd["instance_type"]["name"] == "m5.large" and jpd["price"] == fell_back.price
        await c.post("/api/project/main/fleets/delete", json={"names": ["fbfl"]})

        async def gone() -> bool:
            return not hypervisor.moto.instances(instance_state_name=["pending", "running", "shutting-down"])

        await wait_for(gone, timeout=60)


async def test_plans_list_the_projects_own_regions_and_honour_the_runs_options(server: RunningServer) -> None:
    """Offers come from the regions of the project's own backend (not every project's), and a run's
    ``regions`` and ``instance_types`` narrow them (as they narrow placement: one filter)."""

    async def offers(project: str, **options: Any) -> list[dict[str, Any]]:
        conf = {"type": "task", "commands": ["true"], "resources": {"cpu": "2.."}, **options}
        async with server.client() as c:
            body = {"run_spec": {"configuration": conf}, "for_offers_only": True}  # as `dstack offer` asks
            r = await c.post(f"/api/project/{project}/runs/get_plan", json=body)
        assert r.status_code == 200, r.text
        return list(r.json()["job_plans"][0]["offers"])

    assert {o["region"] for o in await offers("main")} == {REGION, WEST}
    assert {o["region"] for o in await offers("narrow")} == {REGION}
    got = await offers("main", regions=[WEST.upper()], instance_types=["m7i.large", "C7I.XLARGE"])
    assert {(o["region"], o["instance"]["name"]) for o in got} == {(WEST, "m7i.large"), (WEST, "c7i.xlarge")}
    assert not await offers("narrow", regions=[WEST])
    async with server.client() as c:
        spec = {
            "configuration": {"type": "task", "commands": ["true"], "resources": {"gpu": "A10G"}, "regions": [WEST]}
        }
        gpus = (await c.post("/api/project/main/gpus/list", json={"run_spec": spec})).json()["gpus"]
    assert gpus and all(g["name"] == "A10G" and g["regions"] == [WEST] and g["backends"] == ["aws"] for g in gpus)


async def test_a_termination_ec2_never_confirms_is_reported_and_keeps_counting(
    server: RunningServer, proxy: FaultProxy, hypervisor: Hypervisor, vpc: tuple[str, str, str]
) -> None:
    compute = server.ctx.computes["aws"]
    fleet = {"type": "fleet", "name": "stuckfl", "nodes": "1..1", "backends": ["aws"], "regions": [REGION],
             "resources": {"cpu": "2.."}}  # fmt: skip
    proxy.blocked_subnets = {vpc[1]}  # zone a has no fake hosts
    async with server.client() as c:

        async def instance() -> dict[str, Any] | None:
            found = [i for i in (await c.post("/api/instances/list", json={})).json() if i["fleet_name"] == "stuckfl"]
            return found[0] if found else None

        try:
            r = await c.post(
                "/api/project/main/fleets/apply",
                json={"plan": {"spec": {"configuration": fleet, "profile": {}}}, "force": True},
            )
            assert r.status_code == 200, r.text
            assert await wait_for(lambda: _with_status(instance, "idle"), timeout=60)
            compute.session.terminate_timeout = 0.2
            proxy.swallow = {"TerminateInstances"}  # EC2 takes the call, and the instance runs on
            await c.post("/api/project/main/fleets/delete", json={"names": ["stuckfl"]})

            async def reported() -> dict[str, Any] | None:
                got = await instance()
                return got if got and "Termination not confirmed" in (got["termination_reason_message"] or "") else None

            stuck = await wait_for(reported, timeout=30)
            assert (
                "after 2 tries" in stuck["termination_reason_message"]
                and "not terminated" in stuck["termination_reason_message"]
            )
            assert stuck["status"] == "terminating"  # still counted against nodes.max
            async with server.ctx.db.read() as conn:
                events = (await conn.exec_driver_sql("SELECT message FROM events")).scalars().all()
            assert sum("Termination not confirmed after 2 tries" in m for m in events) == 1  # reported once
            ec2_id = hypervisor.moto.instances(tag_key=["corral_fleet"], tag_value=["stuckfl"])
            assert {i["State"]["Name"] for i in ec2_id} == {"running"}
            proxy.swallow = set()  # EC2 terminates it now: confirmed, the row is terminated
            assert await wait_for(lambda: _with_status(instance, "terminated"), timeout=60)
        finally:
            proxy.swallow = set()
            proxy.blocked_subnets = set()
            compute.session.terminate_timeout = 60.0


async def _with_status(get: Any, status: str) -> dict[str, Any] | None:
    got = await get()
    return got if got and got["status"] == status else None


async def test_a_fleets_availability_zones_and_tags_shape_its_launches_and_bad_ones_are_refused(
    server: RunningServer, proxy: FaultProxy, moto: MotoEC2, vpc: tuple[str, str, str]
) -> None:
    """``availability_zones`` restricts the zones (subnets) a fleet's instances launch in; ``tags`` go on
    every instance and its root volume with the backend's and corral's; both are checked at apply, naming
    the field."""

    async def apply(**conf: Any) -> Any:
        fleet = {"type": "fleet", "name": "zonefl", "nodes": "0..1", "backends": ["aws"], **conf}
        async with server.client() as c:
            body = {"plan": {"spec": {"configuration": fleet, "profile": {}}}, "force": True}
            return await c.post("/api/project/main/fleets/apply", json=body)

    r = await apply(availability_zones=["mars-1a"])
    assert r.status_code == 400 and "availability_zones: 'mars-1a' is not an availability zone name" in r.text
    r = await apply(availability_zones=["eu-west-1a"])  # the backend's regions: us-east-1, us-west-2
    assert r.status_code == 400 and "availability_zones: eu-west-1a is in eu-west-1" in r.text
    too_many = {f"k{i}": "v" for i in range(facts.TAGS_PER_RESOURCE - 7)}  # 43: over what corral's 8 leave
    r = await apply(tags=too_many)
    assert r.status_code == 400 and "tags: 43 tags, at most" in r.text, r.text
    tags = {"team": "research", "cost-center": "ml-42"}
    r = await apply(availability_zones=[f"{REGION}b"], tags=tags)
    assert r.status_code == 200, r.text
    async with server.ctx.db.read() as conn:
        project = await get_project(conn, "main")
        assert project is not None
        fleet = await get_fleet(conn, project.id, name="zonefl")
    assert fleet is not None
    compute = server.ctx.computes["aws"]
    large = _offer(compute, "m7i.large", REGION)
    row = dataclasses.replace(_rec(), project_id=project.id, fleet_id=fleet.id, fleet_name="zonefl")
    got, made = await _launch(server, proxy, lambda lt: "InsufficientInstanceCapacity", large, rec=row)
    assert isinstance(got, ProvisioningError) and [m.subnet for m in made] == [vpc[2]]  # zone b only
    compute.session.unavailable = launch.Unavailable(ttl=60)
    row = dataclasses.replace(row, id=str(uuid.uuid4()))
    before = {i["InstanceId"] for i in moto.instances()}
    got, made = await _launch(server, proxy, None, large, rec=row)
    assert got == large and [m.subnet for m in made] == [vpc[2]]
    (inst,) = [i for i in moto.instances() if i["InstanceId"] not in before]
    on_instance = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert on_instance["team"] == "research" and on_instance["cost-center"] == "ml-42"
    assert on_instance["corral_fleet"] == "zonefl" and on_instance["corral_instance"] == row.id
    # the root volume (detached now: the instance was terminated at once) carries the same tags
    made_for = moto.client().describe_volumes(Filters=[{"Name": "tag:corral_instance", "Values": [row.id]}])
    (on_volume,) = [{t["Key"]: t["Value"] for t in v.get("Tags") or []} for v in made_for["Volumes"]]
    assert on_volume["team"] == "research" and on_volume["corral_instance"] == row.id
    async with server.client() as c:
        await c.post("/api/project/main/fleets/delete", json={"names": ["zonefl"]})


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (facts.VCPU_LIMIT, "quota reached"),
        (facts.SUBNET_NOT_FOUND, "network misconfigured"),
        (facts.AUTH_FAILURE, "credentials refused"),
    ],
)
async def test_a_run_whose_every_launch_is_refused_for_another_reason_than_capacity_says_that_reason(
    server: RunningServer, proxy: FaultProxy, code: str, words: str
) -> None:
    """Not "no capacity": the job's status and termination message, its instance's and fleet's messages and the
    events carry EC2's reason (a quota, the network, credentials)."""
    name = f"why-{words.split()[0]}"
    fleet = {"type": "fleet", "name": name, "nodes": "0..1", "backends": ["aws"], "regions": [REGION],
             "resources": {"cpu": "2.."}}  # fmt: skip
    task = {"type": "task", "name": name, "commands": ["true"], "fleets": [name], "resources": {"cpu": "2.."}}
    async with server.client() as c:
        r = await c.post(
            "/api/project/main/fleets/apply",
            json={"plan": {"spec": {"configuration": fleet, "profile": {}}}, "force": True},
        )
        assert r.status_code == 200, r.text
        proxy.fault = lambda lt: code
        try:
            r = await c.post(
                "/api/project/main/runs/apply", json={"force": True, "plan": {"run_spec": {"configuration": task}}}
            )
            assert r.status_code == 200, r.text
            run = await finished_run(c, name, timeout=120)
        finally:
            proxy.fault = None
        sub = run["jobs"][0]["job_submissions"][-1]
        assert run["status"] == "failed" and sub["termination_reason"] == "failed_to_start_due_to_no_capacity"
        assert sub["status_message"] == words, sub
        assert f"aws: {words}: " in sub["termination_reason_message"] and code in sub["termination_reason_message"]
        (inst,) = [i for i in (await c.post("/api/instances/list", json={})).json() if i["fleet_name"] == name]
        assert (
            inst["termination_reason_message"].startswith(f"aws: {words}: ")
            and code in inst["termination_reason_message"]
        )
        got = (await c.post("/api/project/main/fleets/get", json={"name": name})).json()
        assert code in (got["status_message"] or ""), got["status_message"]
        await c.post("/api/project/main/fleets/delete", json={"names": [name]})
    async with server.ctx.db.read() as conn:
        events = (await conn.exec_driver_sql("SELECT message FROM events")).scalars().all()
    assert any(code in m and words in m for m in events), events[-5:]
