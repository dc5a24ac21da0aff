"""A job's scheduling facts: the stored document reads back as written, a version this code does not know reads
as None (the job's facts are then derived again), and the wait rule's deadline."""

from __future__ import annotations

import json

import pytest

from corral.domain.job_facts import PREFIX, JobFacts, WaitRule, decode, encode
from corral.domain.resources import GpuSpec, Range, Requirements
from corral.domain.selectors import FleetRef, Selector

FULL = JobFacts(
    requirements=Requirements(
        cpu_arch="x86",
        cpu_count=Range(4, 8),
        memory=Range(16.0, None),
        disk=None,
        shm_size=2.0,
        gpu=GpuSpec(
            vendor="nvidia",
            names=("A100", "H100"),
            count=Range(1, 2),
            memory=Range(40.0, 80.0),
            total_memory=Range(80.0, None),
            compute_capability=(8, 0),
        ),
    ),
    fleet_names=("gpus", "other/shared"),
    creation_policy="reuse",
    wait=WaitRule(True, 600.0),
    nodes=2,
    selectors=(
        Selector(name="gpus-0"),
        Selector(hostname="10.0.0.1"),
        Selector(fleet=FleetRef("gpus", "team"), instance_num=1),
        Selector(fleet=FleetRef("gpus"), instance_num=0),
    ),
    backends=("aws", "local"),
    regions=("eu-west-1",),
    instance_types=("p4d.24xlarge",),
    max_price=3.5,
    spot_policy="auto",
    reservation="cr-1",
    volumes=(("data",), ("near", "far")),
    has_image=True,
    run_type="task",
)

BARE = JobFacts(
    requirements=Requirements(gpu=None),
    fleet_names=None,
    creation_policy="reuse-or-create",
    wait=WaitRule(True, None, server_bound=True),
    nodes=1,
    selectors=None,
    backends=None,
    regions=None,
    instance_types=None,
    max_price=None,
    spot_policy=None,
    reservation=None,
    volumes=(),
    has_image=False,
    run_type="service",
)


@pytest.mark.parametrize("facts", [FULL, BARE, JobFacts(**{**BARE.__dict__, "requirements": Requirements()})])
def test_the_document_reads_back_as_written(facts: JobFacts) -> None:
    text = encode(facts)
    assert text.startswith(PREFIX) and ", " not in text and ": " not in text  # compact
    assert decode(text) == facts


def test_no_document_or_another_version_reads_as_none() -> None:
    assert decode(None) is None
    doc = json.loads(encode(BARE))
    assert decode(json.dumps({**doc, "v": 2})) is None
    assert decode("[1, 2]") is None


def test_a_damaged_document_is_an_error() -> None:
    with pytest.raises(KeyError):
        decode('{"v":1}')
    with pytest.raises(ValueError):
        decode('{"v":1,')


def test_the_wait_rule_deadline() -> None:
    assert WaitRule(True, 60.0).deadline(100.0, 5.0) == 160.0  # its own bound, whatever the server's
    assert WaitRule(True, None, server_bound=True).deadline(100.0, 5.0) == 105.0
    assert WaitRule(True, None, server_bound=True).deadline(100.0, None) is None
    assert WaitRule(True, None).deadline(100.0, 5.0) is None  # (a service's later replicas)
