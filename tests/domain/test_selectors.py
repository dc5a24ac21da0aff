"""The ``instances`` option: selectors pin a run to existing instances by name, by address, or by fleet
and instance number (the fleet of the run's project unless qualified), and print as users wrote them."""

from __future__ import annotations

from corral.domain.selectors import FleetRef, InstanceIdentity, Selector, matches

INST = InstanceIdentity("gpu-1", 1, "Gpu", "main", addresses=("10.0.0.5", "Node-A.example.com"))


def test_a_name_matches_exactly() -> None:
    assert matches(Selector(name="gpu-1"), INST, "main")
    assert not matches(Selector(name="GPU-1"), INST, "main")


def test_a_hostname_or_address_matches_in_any_case() -> None:
    assert matches(Selector(hostname="node-a.EXAMPLE.com"), INST, "main")
    assert matches(Selector(hostname="10.0.0.5"), INST, "main")
    assert not matches(Selector(hostname="10.0.0.6"), INST, "main")


def test_a_fleet_and_number_match_in_the_runs_project_unless_the_fleet_is_qualified() -> None:
    assert matches(Selector(fleet=FleetRef("gpu"), instance_num=1), INST, "main")
    assert not matches(Selector(fleet=FleetRef("gpu"), instance_num=2), INST, "main")
    assert not matches(Selector(fleet=FleetRef("cpu"), instance_num=1), INST, "main")
    assert not matches(Selector(fleet=FleetRef("gpu"), instance_num=1), INST, "other")
    assert matches(Selector(fleet=FleetRef("gpu", "MAIN"), instance_num=1), INST, "other")


def test_an_empty_selector_matches_nothing() -> None:
    assert not matches(Selector(), INST, "main")


def test_selectors_print_as_the_option_names_them() -> None:
    assert str(Selector(name="gpu-1")) == "name: gpu-1"
    assert str(Selector(hostname="10.0.0.5")) == "hostname: 10.0.0.5"
    assert str(Selector(fleet=FleetRef("gpu"), instance_num=0)) == "fleet: gpu, instance: 0"
    assert str(Selector(fleet=FleetRef("gpu", "team"), instance_num=2)) == "fleet: team/gpu, instance: 2"
