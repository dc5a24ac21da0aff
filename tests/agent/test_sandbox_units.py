"""The sandbox's pure parts: its settings, wire format and the job's paths (no root needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.agent import sandbox_layout, sandbox_net
from corral.agent.fields import ProtocolError
from corral.agent.protocol import FileArchiveRef, JobState, JobSubmission
from corral.agent.protocol_sandbox import AddressReply, SandboxInfo
from corral.agent.sandbox import SandboxConfig, Sandboxes, parse_uid_range
from corral.agent.workdir import layout
from corral.settings import Settings, SettingsError


def test_uid_range_and_subnet_settings() -> None:
    assert parse_uid_range("200000-265535") == (200000, 265535)
    for bad in ("200000", "a-b", "5-1", "0-10"):
        with pytest.raises(ValueError, match="CORRAL_JOB_UID_RANGE"):
            parse_uid_range(bad)
    cfg = SandboxConfig.from_env({"CORRAL_JOB_UID_RANGE": "300000-300009", "CORRAL_SANDBOX_SUBNET": "10.9.0.0/24"})
    sbs = Sandboxes("/nonexistent", cfg)
    assert sbs.slots.size == 10 and sbs.slots.uid(3) == 300003 and sbs.slots.address(0) == "10.9.0.2"
    with pytest.raises(ValueError, match="CORRAL_SANDBOX_SUBNET"):
        SandboxConfig.from_env({"CORRAL_SANDBOX_SUBNET": "10.9.0.0/30"})
    with pytest.raises(ValueError, match="--sandbox"):
        SandboxConfig.from_env({}, mode="maybe")
    assert Settings.from_env({"CORRAL_SANDBOX": "off"}).sandbox == "off"
    with pytest.raises(SettingsError, match="CORRAL_SANDBOX"):
        Settings.from_env({"CORRAL_SANDBOX": "yes"})
    with pytest.raises(SettingsError, match="CORRAL_JOB_UID_RANGE"):
        Settings.from_env({"CORRAL_JOB_UID_RANGE": "1-x"})


def test_wire_format_round_trip_and_errors() -> None:
    info = SandboxInfo(address="10.247.0.2", uid=200000, ports={8000: 41234})
    state = JobState("j", "running", sandbox=info)
    assert JobState.from_dict(state.to_dict()).sandbox == info
    with pytest.raises(ProtocolError, match=r"JobState\.sandbox\.ports"):
        SandboxInfo.from_dict({"ports": {"8000": 0}})
    sub = JobSubmission("j", "r", ["true"], ports=[8000], host_network=True)
    assert JobSubmission.from_dict(sub.to_dict()) == sub
    with pytest.raises(ProtocolError, match=r"JobSubmission\.ports"):
        JobSubmission.from_dict({**sub.to_dict(), "ports": [70000]})
    assert AddressReply.from_dict({"address": None}).address is None


def test_the_job_sees_its_paths_where_the_configuration_puts_them(tmp_path: Path) -> None:
    sub = sandbox_layout.submission(
        JobSubmission(
            "j",
            "r",
            ["true"],
            file_archives=[FileArchiveRef("0" * 64, "/workflow/data"), FileArchiveRef("0" * 64, "/opt/x")],
        )
    )
    assert sub.working_dir == "/workflow"
    assert (
        sandbox_layout.submission(JobSubmission("j", "r", ["true"], working_dir="src")).working_dir == "/workflow/src"
    )
    lay = layout(str(tmp_path), sub)
    binds = sandbox_layout.binds(lay, sub)
    # the outermost of the job's paths: /workflow/data comes with /workflow
    assert binds == {
        "/tmp": str(tmp_path / "tmp"),
        "/opt/x": str(tmp_path / "opt" / "x"),
        "/root": str(tmp_path / "root"),
        "/workflow": str(tmp_path / "workflow"),
    }
    assert (tmp_path / "tmp").stat().st_mode & 0o1777 == 0o1777
    assert sandbox_layout.inside(lay, str(tmp_path / "workflow" / "a")) == "/workflow/a"


def test_the_server_hides_its_state_and_its_sqlite_database(tmp_path: Path) -> None:
    from corral.server import _state_paths

    settings = Settings(server_dir=tmp_path / "srv", database_url=f"sqlite+aiosqlite:///{tmp_path}/db/c.db")
    assert _state_paths(settings) == (tmp_path / "srv", tmp_path / "db")
    pg = Settings(server_dir=tmp_path / "srv", database_url="postgresql+asyncpg://u:p@h/db")
    assert _state_paths(pg) == (tmp_path / "srv",)


def test_a_namespace_is_quiet_only_when_its_sockstat_counts_no_socket() -> None:
    quiet = (
        "sockets: used 0\nTCP: inuse 0 orphan 3 tw 0 alloc 40 mem 2\nUDP: inuse 0 mem 0\nUDPLITE: inuse 0\n"
        "RAW: inuse 0\nFRAG: inuse 0 memory 0\nTCP6: inuse 0\nUDP6: inuse 0\nUDPLITE6: inuse 0\nRAW6: inuse 0\n"
        "FRAG6: inuse 0 memory 0\n"
    )
    assert sandbox_net.sockstat_quiet(quiet), "orphan, alloc and mem count the whole host"
    assert not sandbox_net.sockstat_quiet(quiet.replace("tw 0", "tw 1")), "a port in TIME_WAIT"
    assert sandbox_net.sockstat_quiet(quiet.replace("used 0", "used 2")), "netlink and unix sockets are not counted"
    assert not sandbox_net.sockstat_quiet(quiet.replace("TCP: inuse 0", "TCP: inuse 1")), "a socket still open"
    assert not sandbox_net.sockstat_quiet(quiet.replace("UDP6: inuse 0", "UDP6: inuse 1"))
    assert not sandbox_net.sockstat_quiet(quiet.replace(" tw 0", "")), "a kernel that does not count TIME_WAIT"
    assert not sandbox_net.sockstat_quiet("")
