"""A job's scheduling facts derived from its run's typed spec and its job spec (``config.job_facts``): the run's
options as it gave them, its resources as requirements, and how long it may wait from its ``retry``."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from corral import config
from corral.config import run_spec
from corral.config.job_facts import derive, requirements_of
from corral.domain.job_facts import WaitRule, decode, encode
from corral.domain.resources import Range
from corral.domain.selectors import FleetRef, Selector

RESOURCES = {"cpu": "2..4", "memory": "1GB..", "gpu": "A100:2"}


def _facts(conf: dict[str, Any], profile: dict[str, Any] | None = None) -> Any:
    spec = run_spec.read({"configuration": {"type": "task", "commands": ["true"], **conf}, "profile": profile})
    return derive(spec, {"requirements": {"resources": RESOURCES}, "replica_num": 0})


def test_the_options_as_the_run_gives_them() -> None:
    facts = _facts(
        {
            "nodes": 2,
            "image": "ubuntu",
            "fleets": ["gpus"],
            "backends": ["aws"],
            "regions": ["eu-west-1"],
            "instance_types": ["p4d.24xlarge"],
            "max_price": 3,
            "spot_policy": "spot",
            "reservation": "cr-1",
            "creation_policy": "reuse",
            "instances": ["gpus-0", {"hostname": "10.0.0.1"}, {"fleet": "team/gpus", "instance": 1}],
            "volumes": [{"name": "data", "path": "/data"}],
        }
    )
    assert facts.nodes == 2 and facts.has_image and facts.run_type == "task"
    assert facts.fleet_names == ("gpus",) and facts.creation_policy == "reuse"
    assert (facts.backends, facts.regions, facts.instance_types) == (("aws",), ("eu-west-1",), ("p4d.24xlarge",))
    assert (facts.max_price, facts.spot_policy, facts.reservation) == (3.0, "spot", "cr-1")
    assert facts.selectors == (
        Selector(name="gpus-0"),
        Selector(hostname="10.0.0.1"),
        Selector(fleet=FleetRef("gpus", "team"), instance_num=1),
    )
    assert facts.volumes == (("data",),)
    assert facts.requirements.cpu_count == Range(2, 4) and facts.requirements.gpu is not None
    assert decode(encode(facts)) == facts


def test_a_run_without_options() -> None:
    facts = _facts({})
    assert facts.fleet_names is None and facts.selectors is None and facts.backends is None
    assert facts.max_price is None and facts.reservation is None and facts.volumes == () and not facts.has_image
    assert decode(encode(facts)) == facts


@pytest.mark.parametrize(
    ("retry", "rule"),
    [
        (None, WaitRule(True, None, server_bound=True)),
        (False, WaitRule(False)),
        (True, WaitRule(True, 3600.0)),
        ({"on_events": ["error"]}, WaitRule(False)),
        ({"on_events": ["no-capacity"], "duration": "10m"}, WaitRule(True, 600.0)),
        ({"on_events": ["no-capacity", "error"]}, WaitRule(True, 3600.0)),
    ],
)
def test_how_long_it_may_wait_comes_from_its_retry(retry: Any, rule: WaitRule) -> None:
    assert _facts({} if retry is None else {"retry": retry}).wait == rule


def test_a_profile_spot_policy_applies_when_the_configuration_sets_none() -> None:
    assert _facts({}, {"spot_policy": "auto"}).spot_policy == "auto"


def test_jobs_with_the_same_resources_share_their_parsed_requirements() -> None:
    spec = run_spec.read({"configuration": {"type": "task", "commands": ["true"]}, "profile": None})
    first = derive(spec, {"requirements": {"resources": dict(RESOURCES)}})
    # the same values in another order, in another dict: parsed once
    again = derive(spec, {"requirements": {"resources": dict(reversed(list(RESOURCES.items())))}})
    assert again.requirements is first.requirements
    other = derive(spec, {"requirements": {"resources": {**RESOURCES, "cpu": "8.."}}})
    assert other.requirements.cpu_count == Range(8, None) and first.requirements.cpu_count == Range(2, 4)
    # values that are not plain JSON are still read, and a bad value is refused every time
    parsed_cpu = config.ResourcesSpec.model_validate(RESOURCES).cpu
    assert requirements_of({**RESOURCES, "cpu": parsed_cpu}) == first.requirements
    for _ in range(2):
        with pytest.raises(ValidationError, match="cpu"):
            derive(spec, {"requirements": {"resources": {**RESOURCES, "cpu": "lots"}}})
