"""A job's network made over netlink in the agent's process (``corral.agent.netlink``): the namespace, veth,
address, route and links it leaves are those ``ip`` made, checked with ``ip`` itself; a failure leaves
nothing mounted and says which step; ``sandbox_net`` falls back to ``ip`` where netlink fails. Real
namespaces, veths and a bridge: needs root (CI runs as root)."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from corral.agent import netlink, sandbox_net


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.fail("these tests make network namespaces, veths and a bridge: they need root (CI runs them as root)")


NETWORK = ipaddress.IPv4Network("10.251.0.0/24")
GATEWAY = "10.251.0.1"


def _ip(*args: str) -> Any:
    out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out or "[]")


@pytest.fixture
def bridge() -> Iterator[str]:
    """A bridge of this test's own holding the gateway's address (a bridge an interrupted run left with that
    address would take the replies: it is removed first)."""
    for link in _ip("link", "show", "type", "bridge"):
        if link["ifname"].startswith("crnl"):
            subprocess.run(["ip", "link", "del", link["ifname"]], check=False)
    name = f"crnl{os.getpid() % 100000}"
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{GATEWAY}/24", "dev", name], check=True)
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
        os.makedirs(sandbox_net.NETNS_DIR, exist_ok=True)
        if not sandbox_net._netns_dir_shared():  # what the first ``ip netns add`` on a host does
            subprocess.run(["ip", "netns", "add", "crnl-setup"], check=True)
            subprocess.run(["ip", "netns", "del", "crnl-setup"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "link", "del", name], check=False)


def _names(tag: str) -> tuple[str, str]:
    suffix = f"{os.getpid() % 100000}{tag}"
    return os.path.join(sandbox_net.NETNS_DIR, f"crnl-{suffix}"), f"crnv{suffix}"


def _own_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slots' namespaces and veths named apart from agents' (an agent's reap, in a test beside this one,
    removes every ``corral-s<n>`` namespace no slot record claims)."""
    monkeypatch.setattr(sandbox_net, "netns_name", lambda slot: f"crnl-s{slot}")
    monkeypatch.setattr(sandbox_net, "veth_name", lambda slot: f"crnlv{slot}")


def _remove(path: str, veth: str) -> None:
    if os.path.exists(path):
        subprocess.run(["umount", "-l", path], check=False)
        os.unlink(path)
    subprocess.run(["ip", "link", "del", veth], check=False, capture_output=True)


def test_the_namespace_has_what_ip_would_have_made(bridge: str) -> None:
    path, veth = _names("a")
    try:
        netlink.make_job_network(path, veth, bridge, "02:cc:0a:fb:00:05", "10.251.0.5", 24, GATEWAY)
        ns = os.path.basename(path)
        links = {link["ifname"]: link for link in _ip("-n", ns, "link")}
        assert set(links) == {"lo", "eth0"}
        assert links["eth0"]["address"] == "02:cc:0a:fb:00:05"
        assert "UP" in links["eth0"]["flags"] and "UP" in links["lo"]["flags"]
        addrs = [
            a for link in _ip("-n", ns, "addr", "show", "eth0") for a in link["addr_info"] if a["family"] == "inet"
        ]
        assert [(a["local"], a["prefixlen"]) for a in addrs] == [("10.251.0.5", 24)]
        routes = _ip("-n", ns, "route")
        assert {"dst": "default", "gateway": GATEWAY} in [{k: r.get(k) for k in ("dst", "gateway")} for r in routes]
        (host_end,) = _ip("link", "show", veth)
        assert host_end["master"] == bridge and "UP" in host_end["flags"]
        # the job reaches the host through the gateway (a listener on the bridge's address answers)
        with socket.socket() as listener:
            listener.bind((GATEWAY, 0))
            listener.listen()
            port = listener.getsockname()[1]
            accepted: list[str] = []
            t = threading.Thread(target=lambda: accepted.append(listener.accept()[1][0]), daemon=True)
            t.start()
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "python3",
                    "-c",
                    f"import socket; socket.create_connection(('{GATEWAY}', {port}), 5)",
                ],
                check=True,
                timeout=30,
            )
            t.join(5)
        assert accepted == ["10.251.0.5"]
    finally:
        _remove(path, veth)


def test_a_failed_step_is_named_and_leaves_no_namespace(bridge: str) -> None:
    path, veth = _names("b")
    subprocess.run(["ip", "link", "add", veth, "type", "bridge"], check=True)  # the veth's name is taken
    try:
        with pytest.raises(netlink.NetlinkError, match=f"create the veth pair {veth}: File exists"):
            netlink.make_job_network(path, veth, bridge, "02:cc:0a:fb:00:06", "10.251.0.6", 24, GATEWAY)
        assert not os.path.exists(path)
        with pytest.raises(netlink.NetlinkError, match="create"):
            netlink.make_job_network(path, veth + "x", "no-such-bridge", "02:cc:0a:fb:00:06", "10.251.0.6", 24, GATEWAY)
        assert not os.path.exists(path)
    finally:
        _remove(path, veth)


def test_a_refused_request_carries_the_kernels_errno() -> None:
    with pytest.raises(netlink.NetlinkError) as e:
        netlink.delete_link("crnl-missing0")
    assert e.value.code == 19  # ENODEV
    assert "delete crnl-missing0" in str(e.value)


def test_job_net_up_falls_back_to_ip_where_netlink_fails(
    bridge: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    def refused(path: str, *args: Any, **kwargs: Any) -> None:
        calls.append(path)
        raise netlink.NetlinkError("create the network namespace: Operation not permitted", 1)

    monkeypatch.setattr(netlink, "make_job_network", refused)
    monkeypatch.setattr(sandbox_net, "_netlink_failures", [0])
    _own_names(monkeypatch)
    slot = 4000 + os.getpid() % 1000
    try:
        for attempt in range(sandbox_net.NETLINK_TRIES + 1):
            path = sandbox_net.job_net_up(slot, "10.251.0.7", bridge, NETWORK)
            ns = os.path.basename(path)
            addrs = [a["local"] for link in _ip("-n", ns, "addr", "show", "eth0") for a in link["addr_info"]]
            assert "10.251.0.7" in addrs, attempt
            sandbox_net.job_net_down(slot)
    finally:
        sandbox_net.job_net_down(slot)
    # tried until it failed NETLINK_TRIES times in a row, then ip only; each failure said so
    assert len(calls) == sandbox_net.NETLINK_TRIES
    assert "Operation not permitted" in caplog.text and "with ip from now on" in caplog.text
    assert not os.path.exists(os.path.join(sandbox_net.NETNS_DIR, sandbox_net.netns_name(slot)))


def test_a_namespace_with_mounts_stacked_on_it_is_removed_without_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mounts stacked on the namespace's file (propagated back from other mount namespaces) make ``unlink``
    refuse it until every one is detached: done in the agent's process, as for a plain one."""
    _own_names(monkeypatch)
    slot = 5000 + os.getpid() % 1000
    ns = sandbox_net.netns_name(slot)
    path = os.path.join(sandbox_net.NETNS_DIR, ns)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    for _ in range(2):
        subprocess.run(["mount", "--bind", path, path], check=True)

    def no_ip(args: list[str], stdin: str = "", check: bool = True) -> str:
        raise AssertionError(f"{args[0]} started")

    monkeypatch.setattr(sandbox_net, "_run", no_ip)
    sandbox_net.job_net_down(slot)
    assert not os.path.exists(path)
    with open("/proc/self/mountinfo") as f:
        assert path not in f.read()
