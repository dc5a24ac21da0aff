"""The AWS backend's pure rules: launch errors classified, client tokens, tags, the UserData script, the
unavailable-offerings cache, the orphan rule, the catalogue's reader, the live catalogue's setting, and the
profile's offer filters."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from pathlib import Path

import facts
import pytest

from corral.backends.aws import catalog, ec2, launch
from corral.backends.aws.interruptions import lost
from corral.backends.aws.orphans import Tagged, orphans
from corral.config.server_config import ServerConfigError, load_server_config
from corral.scheduler.offer_filters import allowed


def test_errors_are_classified() -> None:
    assert launch.classify(facts.INSUFFICIENT_CAPACITY) == "capacity"
    assert launch.classify(facts.RESERVATION_FULL) == "capacity"  # a race after the reservation's pre-check
    assert launch.classify(facts.VCPU_LIMIT) == launch.classify("InstanceLimitExceeded") == "quota"
    assert launch.classify(facts.SPOT_COUNT_LIMIT) == "quota"
    assert launch.classify("InvalidParameterValue") == "invalid"
    assert launch.classify("RequestLimitExceeded") == "transient"
    # EC2's own trouble is transient; a full subnet is the zone's, not the region's
    for code in (facts.SERVER_INTERNAL, facts.INTERNAL_FAILURE, facts.INSUFFICIENT_ADDRESS_CAPACITY,
                 facts.INSUFFICIENT_SUBNET_ADDRESSES):  # fmt: skip
        assert launch.classify(code) == "transient", code
    assert launch.classify(facts.RESERVATION_PENDING) == "wait"
    # other *LimitExceeded codes are no quota of the region: no other offer would do better
    assert launch.classify(facts.TAG_LIMIT_EXCEEDED) == launch.classify(facts.SECURITY_GROUPS_LIMIT) == "other"
    # the configuration's image, subnet or group: every offer would be refused alike
    for code in (facts.AMI_NOT_FOUND, facts.SUBNET_NOT_FOUND, facts.GROUP_NOT_FOUND, facts.AUTH_FAILURE):
        assert launch.classify(code) == "other", code


def test_quota_groups_follow_ec2s_on_demand_and_spot_quotas() -> None:
    groups = {
        t: launch.quota_group(t)
        for t in (
            "m7i.large",
            "c5.2xlarge",
            "t3.micro",
            "r7i.large",
            "g5.xlarge",
            "g6e.12xlarge",
            "vt1.3xlarge",
            "p4d.24xlarge",
            "p5.48xlarge",
            "inf2.xlarge",
            "trn1.2xlarge",
            "x2idn.16xlarge",
            "f1.2xlarge",
        )
    }
    assert groups == {"m7i.large": "standard", "c5.2xlarge": "standard", "t3.micro": "standard",
                      "r7i.large": "standard", "g5.xlarge": "g", "g6e.12xlarge": "g", "vt1.3xlarge": "g",
                      "p4d.24xlarge": "p", "p5.48xlarge": "p", "inf2.xlarge": "inf", "trn1.2xlarge": "trn",
                      "x2idn.16xlarge": "x", "f1.2xlarge": "f"}  # fmt: skip
    assert launch.quota_key("m7i.large", False) == launch.quota_key("c5.large", False)
    assert launch.quota_key("m7i.large", True) != launch.quota_key("m7i.large", False)


def test_client_token_names_row_and_attempt() -> None:
    row = "0b6f3a52-52b6-4d0e-9a5f-0f1b8c5f3f21"
    assert launch.client_token(row, 2) == f"corral-{row}-2"
    assert len(launch.client_token(row, 999)) <= 64
    with pytest.raises(ValueError, match="64"):
        launch.client_token("x" * 60, 1)


def test_tags_name_server_project_fleet_row_and_admin_tags_cannot_override() -> None:
    tags = {
        t["Key"]: t["Value"]
        for t in launch.instance_tags("srv", "main", "fl", "row", "fl-0", {"corral_server": "x", "team": "ml"})
    }
    assert tags["corral_server"] == "srv" and tags["corral_instance"] == "row" and tags["corral_fleet"] == "fl"
    assert tags["team"] == "ml" and tags["owner"] == "corral"


def test_user_data_is_a_small_shell_script_that_authorises_the_key() -> None:
    script = launch.user_data(["ssh-ed25519 AAAA test"])
    assert script.startswith("#!/bin/sh\n") and "ssh-ed25519 AAAA test" in script and "/root/.ssh" in script
    with pytest.raises(ValueError, match="16384"):
        launch.user_data(["k" * 20000])


def test_unavailable_offerings_and_regions_expire() -> None:
    cache = launch.Unavailable(ttl=10)
    cache.mark("us-east-1", "us-east-1a", "g5.xlarge", now=100)
    assert cache.blocked("us-east-1", "us-east-1a", "g5.xlarge", now=105)
    assert not cache.blocked("us-east-1", "us-east-1b", "g5.xlarge", now=105)
    assert not cache.blocked("us-east-1", "us-east-1a", "g5.2xlarge", now=105)
    assert not cache.blocked("us-east-1", "us-east-1a", "g5.xlarge", now=111)
    cache.mark_quota("eu-west-1", "m5.large", False, now=100)
    assert cache.quota_blocked("eu-west-1", "c5.xlarge", False, now=105)
    assert not cache.quota_blocked("eu-west-1", "c5.xlarge", True, now=105)  # spot: another quota
    assert not cache.quota_blocked("eu-west-1", "g5.xlarge", False, now=105)  # G and VT: another quota
    assert not cache.quota_blocked("us-east-1", "c5.xlarge", False, now=105)
    assert not cache.quota_blocked("eu-west-1", "c5.xlarge", False, now=111)


def test_where_a_launch_goes_after_an_error() -> None:
    moves = {c: launch.next_move(launch.classify(c)) for c in
             ("InsufficientInstanceCapacity", "RequestLimitExceeded", "InvalidParameterCombination",
              "VcpuLimitExceeded", "InstanceLimitExceeded", "AuthFailure")}  # fmt: skip
    assert moves == {"InsufficientInstanceCapacity": "zone", "RequestLimitExceeded": "zone",
                     "InvalidParameterCombination": "offer", "VcpuLimitExceeded": "offer",
                     "InstanceLimitExceeded": "offer", "AuthFailure": "stop"}  # fmt: skip
    assert launch.next_move(launch.classify(facts.INSUFFICIENT_SUBNET_ADDRESSES)) == "zone"
    assert launch.next_move(launch.classify(facts.RESERVATION_PENDING)) == "stop"


def test_fallbacks_are_the_next_offers_that_hold_the_job_alike() -> None:
    from corral.domain.resources import Range, Requirements
    from corral.scheduler.fallbacks import MAX_FALLBACKS, fallbacks

    offers = catalog.offers(catalog.load(), frozenset({"us-east-1", "eu-west-1"}))
    chosen = next(o for o in offers if o.instance_type == "m7i.large" and o.region == "us-east-1")
    got = fallbacks(chosen, reversed(offers), None, 1, 1, Requirements())
    assert 0 < len(got) <= MAX_FALLBACKS and chosen not in got
    assert [o.price for o in got] == sorted(o.price for o in got)
    assert fallbacks(dataclasses.replace(chosen, host_blocks=1), offers, None, 1, 1, None) == ()
    # blocks: 2 -- an offer whose half does not hold the job needs other blocks: not a stand-in
    two = fallbacks(chosen, offers, 2, 1, 2, Requirements(cpu_count=Range(3, None)))
    assert two and all(o.resources.cpus >= 6 and o.resources.memory_mib >= 16 * 1024 for o in two)


def test_orphan_rule() -> None:
    tagged = [
        Tagged("i-1", "gone", "running", 0.0),
        Tagged("i-2", "live", "running", 0.0),
        Tagged("i-3", "done", "running", 0.0),
        Tagged("i-4", "gone-young", "pending", 95.0),
        Tagged("i-5", "gone", "shutting-down", 0.0),
    ]
    found = orphans(tagged, {"live": "busy", "done": "terminated"}, grace=10, now=100)
    assert [t.instance_id for t in found] == ["i-1", "i-3"]


def test_shipped_catalogue_and_its_errors(tmp_path: Path) -> None:
    rows = catalog.load()
    # every row names the published catalogue its price comes from, and the day
    assert {r.source.split(" @ ")[0] for r in rows} == {"skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv"}
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d", r.date) for r in rows)
    offers = catalog.offers(rows, frozenset({"eu-west-1"}))
    assert offers and {o.region for o in offers} == {"eu-west-1"}
    # on-demand and spot rows alike; a type's spot offer is the cheaper one
    assert {o.resources.spot for o in offers} == {True, False}
    by_market = {(o.instance_type, o.resources.spot): o.price for o in offers}
    assert by_market[("g5.xlarge", True)] < by_market[("g5.xlarge", False)]
    assert [o.price for o in offers] == sorted(o.price for o in offers)
    g5 = next(o for o in offers if o.instance_type == "g5.xlarge" and not o.resources.spot)
    assert g5.resources.gpus[0].name == "A10G" and g5.resources.cpus == 4
    bad = tmp_path / "c.csv"
    bad.write_text("instance_name,location\nx,y\n")
    with pytest.raises(catalog.CatalogError, match="missing column"):
        catalog.load(bad)
    bad.write_text(catalog.SHIPPED.read_text().splitlines()[0] + "\nm5.large,us-east-1,cheap,2,8,0,,,False,,,,x86,\n")
    with pytest.raises(catalog.CatalogError, match="row 2"):
        catalog.load(bad)
    # gpuhunt's Graviton rows are skipped (amd64 images only); a catalogue of nothing else is refused
    header = catalog.SHIPPED.read_text().splitlines()[0]
    bad.write_text(header + "\nm6g.large,us-east-1,0.077,2,8,0,,,False,,,,arm64,\n")
    with pytest.raises(catalog.CatalogError, match="no usable row"):
        catalog.load(bad)
    bad.write_text(header + "\nm5.large,us-east-1,0.096,2,8,0,,,False,,,,x86,\n")  # no provider_data
    assert catalog.read(bad, "mine").info == catalog.CatalogInfo(
        "mine", dt.datetime.now(dt.timezone.utc).date().isoformat()
    )


def test_live_catalogue_setting() -> None:
    from corral.settings import Settings, SettingsError

    # gpuhunt's public bucket (gpuhunt _internal/catalog.py: CATALOG_URL), unless told otherwise
    assert Settings.from_env({}).aws_live_catalog == "https://dstack-gpu-pricing.s3.eu-west-1.amazonaws.com/v3"
    assert Settings.from_env({"CORRAL_AWS_LIVE_CATALOG": "off"}).aws_live_catalog is None
    assert (
        Settings.from_env({"CORRAL_AWS_LIVE_CATALOG": "file:///srv/gpuhunt"}).aws_live_catalog == "file:///srv/gpuhunt"
    )
    with pytest.raises(SettingsError, match="CORRAL_AWS_LIVE_CATALOG='s3://bucket' must be off or a base URL"):
        Settings.from_env({"CORRAL_AWS_LIVE_CATALOG": "s3://bucket"})


def test_profile_filters() -> None:
    offers = catalog.offers(catalog.load(), frozenset({"us-east-1"}))
    offer = next(o for o in offers if not o.resources.spot)
    spot = next(o for o in offers if o.resources.spot)
    assert allowed(offer, {}) and not allowed(spot, {})  # on-demand unless the spot_policy says otherwise
    assert allowed(spot, {"spot_policy": "spot"}) and not allowed(offer, {"spot_policy": "spot"})
    assert allowed(spot, {"spot_policy": "auto"}) and allowed(offer, {"spot_policy": "auto"})
    assert not allowed(offer, {"max_price": offer.price / 2})
    assert not allowed(offer, {"regions": ["eu-west-1"]})
    assert not allowed(offer, {"instance_types": ["p5.48xlarge"]})
    assert not allowed(offer, {"backends": ["remote"]}) and allowed(offer, {"backends": ["aws"]})


def test_aws_block_in_config_yml_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    path.write_text(
        "projects:\n  - name: main\n    backends: [{type: aws, creds: {type: default}, regions: [mars-1]}]\n"
    )
    with pytest.raises(ServerConfigError, match="regions"):
        load_server_config(path)
    path.write_text("projects:\n  - name: main\n    backends: [{type: aws}]\n")
    with pytest.raises(ServerConfigError, match="creds"):
        load_server_config(path)
    # AWS's 50 tags per resource, less corral's own: the admin's tags past what is left are refused
    too_many = ", ".join(f"k{i}: v" for i in range(facts.TAGS_PER_RESOURCE))
    path.write_text(
        f"projects:\n  - name: main\n    backends: [{{type: aws, creds: {{type: default}}, tags: {{{too_many}}}}}]\n"
    )
    with pytest.raises(ServerConfigError, match=r"tags: 50 tags, at most \d+"):
        load_server_config(path)
    path.write_text(
        "projects:\n  - name: main\n    backends: [{type: aws, creds: {type: default}, tags: {aws:x: y}}]\n"
    )
    with pytest.raises(ServerConfigError, match="reserved for AWS"):
        load_server_config(path)


def test_what_ec2_took_away_and_how_spot_is_asked_for() -> None:
    watched = {"i-1": "row-1", "i-2": "row-2", "i-3": "row-3"}
    described = [
        {"InstanceId": "i-1", "State": {"Name": "terminated"}, "InstanceLifecycle": "spot",
         "StateReason": {"Code": "Server.SpotInstanceTermination"}},
        {"InstanceId": "i-2", "State": {"Name": "running"}},
        {"InstanceId": "i-3", "State": {"Name": "shutting-down"}},
        {"InstanceId": "i-9", "State": {"Name": "terminated"}},  # no row watches it: the reaper's business
    ]  # fmt: skip
    gone = lost(watched, described)
    assert [(g.row_id, g.state, g.spot) for g in gone] == [
        ("row-1", "terminated", True),
        ("row-3", "shutting-down", False),
    ]
    assert "spot instance i-1" in gone[0].message and "Server.SpotInstanceTermination" in gone[0].message
    assert lost(watched, []) == []  # not listed (yet): not taken for gone
    assert launch.SPOT_MARKET["MarketType"] == "spot"
    assert launch.SPOT_MARKET["SpotOptions"] == {
        "SpotInstanceType": "one-time",
        "InstanceInterruptionBehavior": "terminate",
    }
    assert launch.market_key("g5.xlarge", True) != launch.market_key("g5.xlarge", False) == "g5.xlarge"
    assert launch.classify("SpotMaxPriceTooLow") == "capacity"


def test_subnets_of_a_custom_vpc_are_kept_by_their_route_out() -> None:
    def table(subnet: str | None, **route: str) -> dict[str, object]:
        assoc = {"SubnetId": subnet} if subnet else {"Main": True}
        return {"Associations": [assoc], "Routes": [{"DestinationCidrBlock": "10.0.0.0/16", "GatewayId": "local"},
                                                    {"DestinationCidrBlock": "0.0.0.0/0", **route}]}  # fmt: skip

    subnets = [{"SubnetId": f"subnet-{z}", "AvailabilityZone": f"us-east-1{z}"} for z in "abcdef"]
    tables = [
        table("subnet-a", GatewayId="igw-1"),
        table("subnet-b", NatGatewayId="nat-1"),
        table("subnet-c", TransitGatewayId="tgw-1"),
        table("subnet-d", VpcPeeringConnectionId="pcx-1"),
        table("subnet-e", GatewayId="vgw-1"),  # a VPN gateway: no way out for either
        table(None, NatGatewayId="nat-2"),  # the main table: subnet-f has no table of its own
    ]
    assert ec2.usable_subnets(subnets, tables, public_ips=True) == {"us-east-1a": "subnet-a"}
    assert ec2.usable_subnets(subnets, tables, public_ips=False) == {
        "us-east-1b": "subnet-b", "us-east-1c": "subnet-c", "us-east-1d": "subnet-d", "us-east-1f": "subnet-f"
    }  # fmt: skip
    assert len(ec2.usable_subnets(subnets, [], public_ips=None)) == 6  # the default VPC: not checked
    assert ec2.usable_subnets(subnets, [], public_ips=False) == {}


def test_what_a_launch_error_tells_the_user() -> None:
    kinds = {code: launch.failure_kind(code) for code in (
        facts.INSUFFICIENT_CAPACITY, facts.RESERVATION_PENDING, facts.SERVER_INTERNAL, facts.VCPU_LIMIT,
        facts.AMI_NOT_FOUND, facts.SUBNET_NOT_FOUND, facts.GROUP_NOT_FOUND, facts.AUTH_FAILURE, facts.UNAUTHORIZED,
        "InvalidParameterCombination", facts.TAG_LIMIT_EXCEEDED)}  # fmt: skip
    assert kinds == {
        facts.INSUFFICIENT_CAPACITY: "no_capacity", facts.RESERVATION_PENDING: "no_capacity",
        facts.SERVER_INTERNAL: "no_capacity", facts.VCPU_LIMIT: "quota", facts.AMI_NOT_FOUND: "image",
        facts.SUBNET_NOT_FOUND: "network", facts.GROUP_NOT_FOUND: "network", facts.AUTH_FAILURE: "credentials",
        facts.UNAUTHORIZED: "credentials", "InvalidParameterCombination": "refused",
        facts.TAG_LIMIT_EXCEEDED: "refused",
    }  # fmt: skip
