"""Where an SSH fleet spec and a host's connection document hold private keys (``domain.ssh_keys``), and
what clients see of a spec (``domain.fleets.without_ssh_keys``)."""

from __future__ import annotations

import copy
from typing import Any

from corral.domain.fleets import without_ssh_keys
from corral.domain.ssh_keys import (
    connection_private_keys,
    map_connection_keys,
    map_spec_keys,
    public_halves,
    spec_private_keys,
)


def _key(name: str) -> dict[str, str]:
    return {"public": f"ssh-ed25519 {name}", "private": f"PRIVATE {name}"}


def _spec() -> dict[str, Any]:
    """Keys at all four places: ssh_config, its proxy jump, a host, and that host's proxy jump."""
    jump = {"hostname": "j", "user": "root", "identity_file": "k", "ssh_key": _key("global-jump")}
    host_jump = {"hostname": "j2", "user": "root", "identity_file": "k", "ssh_key": _key("host-jump")}
    ssh = {
        "user": "root",
        "ssh_key": _key("global"),
        "proxy_jump": jump,
        "hosts": ["10.0.0.1", {"hostname": "10.0.0.2", "ssh_key": _key("host"), "proxy_jump": host_jump}],
    }
    return {"configuration": {"type": "fleet", "name": "f", "ssh_config": ssh}, "profile": {}}


ALL = ["PRIVATE global", "PRIVATE global-jump", "PRIVATE host", "PRIVATE host-jump"]


def test_every_place_of_a_spec_is_found_and_mapped_on_a_copy() -> None:
    spec = _spec()
    before = copy.deepcopy(spec)
    assert sorted(spec_private_keys(spec)) == ALL
    mapped = map_spec_keys(spec, lambda k: "sealed:" + k)
    assert sorted(spec_private_keys(mapped)) == ["sealed:" + k for k in ALL]
    assert spec == before  # the original is untouched
    assert mapped["configuration"]["ssh_config"]["ssh_key"]["public"] == "ssh-ed25519 global"


def test_a_cloud_fleet_has_no_keys_and_is_returned_as_is() -> None:
    cloud = {"configuration": {"type": "fleet", "name": "c", "nodes": 1, "ssh_config": None}}
    assert spec_private_keys(cloud) == []
    assert map_spec_keys(cloud, lambda k: "x") is cloud
    assert without_ssh_keys(cloud) is cloud and public_halves(cloud) is cloud


def test_clients_see_no_key_anywhere_not_even_a_proxy_jumps() -> None:
    shown = without_ssh_keys(_spec())
    assert "PRIVATE" not in str(shown)
    ssh = shown["configuration"]["ssh_config"]
    assert ssh["ssh_key"] is None and ssh["proxy_jump"]["ssh_key"] is None
    assert ssh["hosts"][1]["ssh_key"] is None and ssh["hosts"][1]["proxy_jump"]["ssh_key"] is None
    assert ssh["hosts"][0] == "10.0.0.1" and ssh["proxy_jump"]["hostname"] == "j"


def test_specs_compare_by_the_public_halves_of_their_keys() -> None:
    sealed = map_spec_keys(_spec(), lambda k: "enc:v1:" + k[::-1])
    assert public_halves(sealed) == public_halves(_spec())
    other = _spec()
    other["configuration"]["ssh_config"]["hosts"][1]["ssh_key"] = _key("another")
    assert public_halves(other) != public_halves(_spec())
    assert "PRIVATE" not in str(public_halves(_spec()))


def test_a_connection_holds_its_key_and_its_proxy_jumps() -> None:
    conn = {
        "host": "h",
        "port": 22,
        "user": "root",
        "private_key": "A",
        "proxy_jump": {"host": "j", "port": 22, "user": "root", "private_key": "B", "proxy_jump": None},
    }
    assert connection_private_keys(conn) == ["A", "B"]
    mapped = map_connection_keys(conn, str.lower)
    assert connection_private_keys(mapped) == ["a", "b"] and connection_private_keys(conn) == ["A", "B"]
    assert connection_private_keys({**conn, "proxy_jump": None}) == ["A"]


def test_places_without_a_key_or_with_a_key_of_another_shape_are_left_as_they_are() -> None:
    ssh = {
        "user": "root",
        "ssh_key": "not an object",
        "hosts": [
            {"hostname": "a"},
            {"hostname": "b", "ssh_key": {"public": "ssh-ed25519 b", "private": None}},
            {"hostname": "c", "ssh_key": _key("c"), "proxy_jump": "not an object"},
        ],
    }
    spec = {"configuration": {"type": "fleet", "ssh_config": ssh}}
    assert spec_private_keys(spec) == ["PRIVATE c"]
    mapped = map_spec_keys(spec, str.lower)
    hosts = mapped["configuration"]["ssh_config"]["hosts"]
    assert hosts[0] == {"hostname": "a"} and hosts[1]["ssh_key"]["private"] is None
    assert hosts[2]["ssh_key"]["private"] == "private c"
    assert mapped["configuration"]["ssh_config"]["ssh_key"] == "not an object"
    halves = public_halves(spec)["configuration"]["ssh_config"]
    assert halves["ssh_key"] == "not an object" and "ssh_key" not in halves["hosts"][0]
    assert halves["hosts"][1]["ssh_key"] == {"public": "ssh-ed25519 b"}
    seen = without_ssh_keys(spec)["configuration"]["ssh_config"]
    assert seen["ssh_key"] is None and "ssh_key" not in seen["hosts"][0]


def test_a_spec_whose_ssh_config_is_not_an_object_holds_no_keys() -> None:
    spec = {"configuration": {"ssh_config": "junk"}}
    assert spec_private_keys(spec) == [] and without_ssh_keys(spec) == spec


def test_a_connection_without_keys_is_copied_unchanged() -> None:
    conn = {"host": "h", "private_key": None, "proxy_jump": {"host": "j", "private_key": None}}
    assert map_connection_keys(conn, str.lower) == conn
    assert connection_private_keys(conn) == []
