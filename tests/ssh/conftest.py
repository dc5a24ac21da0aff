"""Fixtures of the SSH fleet tests: the fake hosts for the whole session (see ``fakehosts`` and
``ssh_harness``), each test starting with no corral agent on any host and leaving none behind, a
second GPU host beside ``gpu`` for the tests that need four one-GPU slots, and a server with short SSH
timeouts whose fleets are deleted (by corral itself) after each test.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from ssh_harness import CLEAN_HOST, HOSTS, SSH_SETTINGS, delete_all_fleets, host_run

from fakehosts import FakeHosts, HostSpec
from server_harness import RunningServer, make_settings, running_server


@pytest.fixture(scope="session")
def fakehosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHosts]:
    if os.geteuid() != 0:
        pytest.fail("the SSH fleet tests need root (network namespaces); CI runs them as root")
    fh = FakeHosts(HOSTS, tmp_path_factory.mktemp("fakehosts")).start()
    try:
        yield fh
    finally:
        fh.stop()


@pytest.fixture
async def hosts(fakehosts: FakeHosts) -> AsyncIterator[FakeHosts]:
    """The fake hosts, every one alive and free of corral's agent before and after the test."""
    for name, host in fakehosts.hosts.items():
        if not host.alive:
            fakehosts.revive(name)
    yield fakehosts
    for name, host in fakehosts.hosts.items():
        if not host.alive:
            fakehosts.revive(name)
    await asyncio.gather(*(host_run(fakehosts, name, CLEAN_HOST) for name in fakehosts.hosts))


@pytest.fixture
async def two_gpu_hosts(hosts: FakeHosts) -> AsyncIterator[list[str]]:
    """The harness's ``gpu`` host and one more like it, added for this test and removed after."""
    hosts.add("gpu2", hosts.unused_ip(), HostSpec(gpus=2))
    try:
        yield [hosts.ip("gpu"), hosts.ip("gpu2")]
    finally:
        hosts.remove("gpu2")


@pytest.fixture
async def server(tmp_path: Path, hosts: FakeHosts) -> AsyncIterator[RunningServer]:
    async with running_server(make_settings(tmp_path, **SSH_SETTINGS)) as s:
        yield s
        # Delete what the test left, so that the hosts are cleaned by corral itself where it can.
        async with s.client() as c:
            await delete_all_fleets(c)
