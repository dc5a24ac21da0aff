"""Rules over a fleet's stored spec: its node bounds, blocks and placement, the spec clients see, and the
message of an instance whose termination is not confirmed."""

from __future__ import annotations

from typing import Any

from corral.domain.fleets import fleet_blocks, fleet_placement, nodes_bounds, stuck_message, without_ssh_keys


def conf(**configuration: Any) -> dict[str, Any]:
    return {"configuration": configuration}


def test_an_ssh_fleet_has_exactly_one_node_per_host() -> None:
    assert nodes_bounds(conf(ssh_config={"hosts": ["a", "b", "c"]}, nodes=9)) == (3, 3)
    assert nodes_bounds(conf(ssh_config={"user": "ubuntu"})) == (0, 0)


def test_nodes_are_a_number_a_range_or_none() -> None:
    assert nodes_bounds({}) == (0, 0)
    assert nodes_bounds({"configuration": None}) == (0, 0)
    assert nodes_bounds(conf(nodes=2)) == (2, 2)
    assert nodes_bounds(conf(nodes={"min": 1, "max": 4})) == (1, 4)
    assert nodes_bounds(conf(nodes={"min": None, "max": None})) == (0, None)
    assert nodes_bounds(conf(nodes={"max": "3"})) == (0, 3)


def test_blocks_default_to_one_and_auto_is_none() -> None:
    assert fleet_blocks({}) == 1
    assert fleet_blocks(conf(blocks=None)) == 1
    assert fleet_blocks(conf(blocks=4)) == 4
    assert fleet_blocks(conf(blocks="auto")) is None


def test_placement_defaults_to_any() -> None:
    assert fleet_placement({}) == "any"
    assert fleet_placement(conf(placement=None)) == "any"
    assert fleet_placement(conf(placement="cluster")) == "cluster"


def test_clients_never_see_an_ssh_fleets_private_keys() -> None:
    spec = conf(
        ssh_config={
            "ssh_key": {"private": "K0"},
            "proxy_jump": {"hostname": "j", "ssh_key": {"private": "K1"}},
            "hosts": [{"hostname": "h", "ssh_key": {"private": "K2"}}, "plain-host"],
        }
    )
    seen = without_ssh_keys(spec)
    assert "K0" not in repr(seen) and "K1" not in repr(seen) and "K2" not in repr(seen)
    assert seen["configuration"]["ssh_config"]["hosts"][1] == "plain-host"
    assert seen["configuration"]["ssh_config"]["proxy_jump"]["hostname"] == "j"


def test_a_stuck_termination_is_reported_once_when_the_tries_reach_the_limit() -> None:
    assert stuck_message(4, 5, 0.0, "boom") is None
    assert stuck_message(6, 5, 0.0, "boom") is None
    assert stuck_message(5, 5, 86400.0, "InvalidInstanceID") == (
        "Termination not confirmed after 5 tries (since 1970-01-02 00:00:00 UTC): InvalidInstanceID. The instance"
        " counts against its fleet's nodes.max until the cloud confirms it is terminated; corral keeps trying"
    )
