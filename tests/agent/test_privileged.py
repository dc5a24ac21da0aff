"""A privileged container as far as the host allows: the pure decisions (the bounding set read, the
capabilities it lacks, the fallback's create body, the messages) and the probe against a real engine."""

from __future__ import annotations

from typing import Any

import pytest

from corral.agent.containers import container_config
from corral.agent.docker import Docker
from corral.agent.privileged import (
    Privilege,
    PrivilegedProbe,
    bounding_set,
    fallback_allowed,
    missing_capabilities,
    refusal_message,
    unknown_capability,
)
from corral.agent.protocol import JobSubmission
from docker_harness import UBUNTU, DockerEngine

#: include/uapi/linux/capability.h: CAP_SYS_ADMIN 21, CAP_SYS_RESOURCE 24, CAP_AUDIT_READ 37 (the last
#: before Linux 5.8), CAP_BPF 39, CAP_CHECKPOINT_RESTORE 40 (the last since Linux 5.9).
SYS_ADMIN, SYS_RESOURCE, AUDIT_READ, BPF, CHECKPOINT_RESTORE = 21, 24, 37, 39, 40
#: proc(5): the CapBnd line of /proc/<pid>/status, here a root without CAP_SYS_RESOURCE.
STATUS = "Name:\tpython3\nCapPrm:\t000001fffeffffff\nCapBnd:\t000001fffeffffff\nCapAmb:\t0000000000000000\n"
#: moby's oci/caps answer to a CapDrop it does not know (Docker 20.10).
UNKNOWN = 'invalid CapDrop: unknown capability: "CAP_BPF"'


def _all(last: int) -> int:
    return (1 << (last + 1)) - 1


def test_the_bounding_set_and_what_it_lacks() -> None:
    assert bounding_set(STATUS) == _all(CHECKPOINT_RESTORE) & ~(1 << SYS_RESOURCE)
    assert bounding_set("Name:\tx\n") is None
    assert bounding_set("CapBnd:\tnot-hex\n") is None
    assert missing_capabilities(_all(CHECKPOINT_RESTORE), CHECKPOINT_RESTORE) == ()
    assert missing_capabilities(_all(CHECKPOINT_RESTORE) & ~(1 << SYS_RESOURCE), CHECKPOINT_RESTORE) == (
        "CAP_SYS_RESOURCE",
    )
    both = _all(CHECKPOINT_RESTORE) & ~(1 << SYS_ADMIN) & ~(1 << BPF)
    assert missing_capabilities(both, CHECKPOINT_RESTORE) == ("CAP_SYS_ADMIN", "CAP_BPF")
    # a kernel before 5.8 has no CAP_BPF: its absence from the set is not a lack
    assert missing_capabilities(_all(AUDIT_READ), AUDIT_READ) == ()


def test_the_engine_s_unknown_capability() -> None:
    assert unknown_capability(UNKNOWN) == "CAP_BPF"
    assert unknown_capability("unable to apply caps: operation not permitted") is None


def test_the_setting_that_forbids_the_fallback(caplog: pytest.LogCaptureFixture) -> None:
    assert fallback_allowed({}) is True
    assert fallback_allowed({"CORRAL_AGENT_PRIVILEGED_FALLBACK": "false"}) is False
    assert fallback_allowed({"CORRAL_AGENT_PRIVILEGED_FALLBACK": "True"}) is True
    assert fallback_allowed({"CORRAL_AGENT_PRIVILEGED_FALLBACK": "maybe"}) is True
    assert "CORRAL_AGENT_PRIVILEGED_FALLBACK='maybe' must be true or false" in caplog.text


def _sub(container: dict[str, Any]) -> JobSubmission:
    return JobSubmission.from_dict(
        {"job_id": "j1", "run_name": "r", "commands": ["true"], "image": "img:1", "container": container}
    )


def test_the_fallback_s_create_body() -> None:
    fallback = Privilege(fallback=True, missing=("CAP_SYS_RESOURCE",))
    volume = {"instance_path": "/data", "path": "/mnt/data"}
    host = container_config(_sub({"privileged": True, "volumes": [volume]}), {}, "host", [], privilege=fallback)[
        "HostConfig"
    ]
    assert host["Privileged"] is False
    assert (host["CapAdd"], host["CapDrop"]) == (["ALL"], ["CAP_SYS_RESOURCE"])
    assert host["SecurityOpt"] == ["seccomp=unconfined", "apparmor=unconfined"]
    assert (host["MaskedPaths"], host["ReadonlyPaths"], host["CgroupnsMode"]) == ([], [], "host")
    assert [m["Target"] for m in host["Mounts"]] == ["/mnt/data", "/sys/fs/cgroup"]
    assert host["Mounts"][1]["ReadOnly"] is False
    # --privileged where the engine can, and a job that did not ask for it gets neither
    plain = container_config(_sub({"privileged": True}), {}, "host", [], privilege=Privilege())["HostConfig"]
    assert plain["Privileged"] is True and "CapAdd" not in plain
    unasked = container_config(_sub({}), {}, "host", [], privilege=fallback)["HostConfig"]
    assert unasked["Privileged"] is False and "CapAdd" not in unasked and unasked["Mounts"] == []


def test_the_messages_name_what_the_host_lacks_and_both_errors() -> None:
    notice = Privilege(fallback=True, missing=("CAP_SYS_RESOURCE", "CAP_BPF")).notice()
    assert "cannot grant CAP_SYS_RESOURCE, CAP_BPF" in notice and "every other capability" in notice
    assert "cannot grant every capability" in Privilege(fallback=True).notice()
    both = refusal_message("unable to apply caps: x\n", "permission denied\n")
    assert "the engine said: unable to apply caps: x; nor with every capability" in both
    assert "permission denied)" in both and "remove `docker` (`privileged`)" in both
    assert "nor with" not in refusal_message("unable to apply caps: x")


def test_the_probe_drops_only_what_the_engine_knows(docker_engine: DockerEngine) -> None:
    """A host lacking a capability this engine does not know (Docker 20.10 knows none past CAP_AUDIT_READ)
    runs the fallback without naming it; the answer is kept."""
    probe = PrivilegedProbe(
        Docker(docker_engine.host),
        {"corral.agent": "/nonexistent"},
        host_missing=lambda: ("CAP_SYS_RESOURCE", "CAP_BPF"),
    )
    first = probe.privilege(UBUNTU)
    privileged = docker_engine.cli("run", "--rm", "--privileged", UBUNTU, "true", check=False).returncode == 0
    if privileged:
        assert first == Privilege() and probe.probes == 1
    else:
        known_bpf = docker_engine.cli("create", "--cap-drop", "CAP_BPF", UBUNTU, "true", check=False)
        expected = ("CAP_SYS_RESOURCE", "CAP_BPF") if known_bpf.returncode == 0 else ("CAP_SYS_RESOURCE",)
        if known_bpf.returncode == 0:
            docker_engine.cli("rm", known_bpf.stdout.strip())
        assert first == Privilege(fallback=True, missing=expected), first
    assert probe.privilege(UBUNTU) is first  # kept: no second probe
    assert docker_engine.containers("corral.agent") == []


def test_a_forbidden_fallback_refuses_with_the_engine_s_error(docker_engine: DockerEngine) -> None:
    probe = PrivilegedProbe(Docker(docker_engine.host), {"corral.agent": "/nonexistent"}, allow_fallback=False)
    got = probe.privilege(UBUNTU)
    privileged = docker_engine.cli("run", "--rm", "--privileged", UBUNTU, "true", check=False).returncode == 0
    if privileged:
        assert got == Privilege()
    else:
        assert got.refusal is not None and "unable to apply caps" in got.refusal, got
        assert "CORRAL_AGENT_PRIVILEGED_FALLBACK=false forbids it" in got.refusal
    assert probe.probes == 1
