"""``agent.container_sessions``: the user, cgroups and address of a container as a session joins it, on
files laid out as ``/proc/<pid>/root`` and ``/sys/fs/cgroup`` would be."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.agent.container_sessions import UNAVAILABLE, cgroup_procs, resolve_user, session_info


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1001:Alice:/home/alice:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\nstaff:x:50:alice\n")
    return root


def test_resolve_user_forms(tmp_path: Path) -> None:
    root = str(_root(tmp_path))
    assert resolve_user(root, "") == (0, 0, "/root")
    assert resolve_user(root, "alice") == (1000, 1001, "/home/alice")
    assert resolve_user(root, "alice:staff") == (1000, 50, "/home/alice")
    assert resolve_user(root, "1000") == (1000, 1001, "/home/alice")  # a known uid: its passwd entry
    assert resolve_user(root, "4242:7") == (4242, 7, "/")  # numeric ids need no entry
    with pytest.raises(ValueError, match="'bob' is not in the container's /etc/passwd"):
        resolve_user(root, "bob")
    with pytest.raises(ValueError, match="group 'wheel'"):
        resolve_user(root, "alice:wheel")


def test_cgroup_procs_v2_and_v1(tmp_path: Path) -> None:
    proc, sysfs = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "7").mkdir(parents=True)
    (proc / "7/cgroup").write_text("0::/system.slice/docker-abc.scope\n")
    (sysfs / "system.slice/docker-abc.scope").mkdir(parents=True)
    (sysfs / "system.slice/docker-abc.scope/cgroup.procs").write_text("")
    assert cgroup_procs(7, str(proc), str(sysfs)) == [str(sysfs / "system.slice/docker-abc.scope/cgroup.procs")]
    (proc / "8").mkdir()
    (proc / "8/cgroup").write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n")
    v1 = ("memory", "cpu", "cpuacct", "systemd")
    for c in v1:
        (sysfs / c / "docker/abc").mkdir(parents=True)
        (sysfs / c / "docker/abc/cgroup.procs").write_text("")
    got = cgroup_procs(8, str(proc), str(sysfs))
    assert sorted(got) == sorted(
        str(sysfs / c / "docker/abc/cgroup.procs") for c in ("memory", "cpu", "cpuacct", "systemd")
    )
    assert cgroup_procs(9, str(proc), str(sysfs)) == []  # no such process


def test_session_info(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    root = _root(proc / "5")
    (proc / "5/ns").mkdir()
    (proc / "5/ns/mnt").write_text("")
    (proc / "5/cgroup").write_text("")
    assert root == proc / "5/root"
    inspected = {
        "State": {"Running": True, "Pid": 5},
        "Config": {"User": "alice", "Env": ["PATH=/bin", "A=b=c"], "WorkingDir": "/srv"},
        "NetworkSettings": {"IPAddress": "", "Networks": {"bridge": {"IPAddress": "172.30.0.2"}}},
    }
    info = session_info(inspected, str(proc))
    assert (info["pid"], info["uid"], info["gid"], info["cwd"], info["shell"]) == (5, 1000, 1001, "/srv", "/bin/sh")
    assert info["env"] == {"PATH": "/bin", "A": "b=c", "HOME": "/home/alice"}
    assert info["address"] == "172.30.0.2" and info["pidns"] is True
    (root / "bin").mkdir()
    (root / "bin/bash").write_text("")
    assert session_info(inspected, str(proc))["shell"] == "/bin/bash"
    host_net = {**inspected, "NetworkSettings": {"Networks": {"host": {"IPAddress": ""}}}}
    assert session_info(host_net, str(proc))["address"] == "127.0.0.1"
    stopped = {**inspected, "State": {"Running": False, "Pid": 0}}
    assert session_info(stopped, str(proc)) == {UNAVAILABLE: "the job's container is not running"}
    elsewhere = {**inspected, "State": {"Running": True, "Pid": 6}}  # a remote engine's process: not here
    assert "need the Docker engine on the job's host" in session_info(elsewhere, str(proc))[UNAVAILABLE]
    nobody = {**inspected, "Config": {"User": "bob"}}
    assert "cannot run a session as the container's user" in session_info(nobody, str(proc))[UNAVAILABLE]
