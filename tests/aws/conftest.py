"""Fixtures of the aws backend's tests: one moto EC2 server, one VPC, one set of fake hosts and their
hypervisor for the session, boto3 pointed at moto by its own ``AWS_ENDPOINT_URL``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from moto_harness import FaultProxy, Hypervisor, MotoEC2, fault_proxy

from fakehosts import FakeHosts


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoEC2]:
    m = MotoEC2(tmp_path_factory.mktemp("moto")).start()
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_EC2_METADATA_DISABLED")}
    os.environ["AWS_ENDPOINT_URL"] = m.url
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    try:
        yield m
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        m.stop()


@pytest.fixture(scope="session")
def cloud_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHosts]:
    if os.geteuid() != 0:
        pytest.fail("the aws backend's tests need root (network namespaces for the instances); CI runs them as root")
    fh = FakeHosts({}, tmp_path_factory.mktemp("cloudhosts")).start()
    try:
        yield fh
    finally:
        fh.stop()


@pytest.fixture(scope="session")
def vpc(moto: MotoEC2, cloud_hosts: FakeHosts) -> tuple[str, str, str]:
    """The test VPC (see ``MotoEC2.make_vpc``): (VPC, zone a's subnet, zone b's subnet)."""
    return moto.make_vpc(cloud_hosts.subnet)


@pytest.fixture(scope="session")
def hypervisor(moto: MotoEC2, cloud_hosts: FakeHosts, vpc: tuple[str, str, str]) -> Iterator[Hypervisor]:
    hv = Hypervisor(moto, cloud_hosts).start()
    try:
        yield hv
    finally:
        hv.stop()


@pytest.fixture(scope="module")
def proxy(moto: MotoEC2, hypervisor: Hypervisor, vpc: tuple[str, str, str]) -> Iterator[FaultProxy]:
    """corral reaches EC2 through the fault proxy, which has no capacity in zone a (the VPC's first zone: no fake
    hosts there). A module that needs other faults defines its own ``proxy``."""
    _vpc, zone_a, _zone_b = vpc
    with fault_proxy(moto, [zone_a]) as fp:
        yield fp
