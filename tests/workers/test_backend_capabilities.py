"""The backends' capabilities (``backends.base``): which backend has which, as the workers find them
(``isinstance`` on a ``runtime_checkable`` Protocol), and what a compute without one gets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from corral.backends.aws.compute import AWSCompute
from corral.backends.base import (
    GangLauncher,
    GatewayProvisioner,
    InterruptionSource,
    PortOpener,
    SharedHost,
    is_shared_host,
    sandbox_reason,
)
from corral.backends.local import LocalCompute
from corral.backends.replica_port import open_replica
from corral.backends.ssh import SSHCompute


def test_each_backend_has_its_capabilities() -> None:
    assert issubclass(AWSCompute, GangLauncher) and issubclass(AWSCompute, InterruptionSource)
    assert not issubclass(AWSCompute, PortOpener)
    assert issubclass(SSHCompute, PortOpener)
    assert not issubclass(SSHCompute, GangLauncher) and not issubclass(SSHCompute, InterruptionSource)
    assert issubclass(LocalCompute, PortOpener)
    assert not issubclass(LocalCompute, GangLauncher) and not issubclass(LocalCompute, InterruptionSource)
    assert issubclass(AWSCompute, GatewayProvisioner)  # a VM of its own per gateway
    for cls in (SSHCompute, LocalCompute):
        assert not issubclass(cls, GatewayProvisioner)  # their gateways take a fleet's host


class _Host:
    def __init__(self, reason: str | None) -> None:
        self.sandbox_reason = reason

    def host_blocks(self) -> int:
        return 4


def test_a_shared_host_says_whether_its_jobs_have_a_sandbox() -> None:
    assert isinstance(_Host(None), SharedHost)
    assert sandbox_reason(_Host("no user namespaces")) == "no user namespaces"  # type: ignore[arg-type]
    assert sandbox_reason(_Host(None)) is None  # type: ignore[arg-type]
    # no shared host, or none at all: nothing says its jobs lack a sandbox
    assert not isinstance(SimpleNamespace(sandbox_reason="x"), SharedHost)
    assert sandbox_reason(SimpleNamespace(sandbox_reason="x")) is None  # type: ignore[arg-type]
    assert sandbox_reason(None) is None
    # the quick check agrees with the protocol's own
    for compute in (_Host(None), _Host("x"), SimpleNamespace(sandbox_reason="x"), SimpleNamespace(), None):
        assert is_shared_host(compute) == isinstance(compute, SharedHost)


def test_a_replica_on_a_backend_without_ports_is_refused() -> None:
    instance: Any = SimpleNamespace(backend="aws")
    with pytest.raises(ConnectionRefusedError, match="cannot reach a replica's port"):
        asyncio.run(open_replica({"aws": SimpleNamespace()}, instance, 8000, 1.0))  # type: ignore[dict-item]
