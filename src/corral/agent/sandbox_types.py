"""The job sandbox's values: its configuration (:class:`SandboxConfig`, from the agent's options and
environment), one job's sandbox (:class:`JobSandbox`: its slot, address, uid, namespace and port relays), and
:class:`SandboxError`, the reason a job cannot have one. Every part of the sandbox (``sandbox``,
``sandbox_slots``, ``sandbox_spare``, ``sandbox_launch``) uses them; they use none of those.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

from .portfwd import Forwarder

DEFAULT_UID_RANGE = (200000, 265535)
DEFAULT_SUBNET = "10.247.0.0/16"
DEFAULT_BRIDGE = "corral0"
DEFAULT_STATE_DIR = "/run/corral-sandbox"
#: dstack's working dir in a container, and so in a sandbox when the configuration names none
DEFAULT_WORKING_DIR = "/workflow"
MODES = ("auto", "on", "off")


class SandboxError(Exception):
    """The sandbox could not be set up; the message is meant for the user."""


def parse_uid_range(text: str) -> tuple[int, int]:
    try:
        lo_s, hi_s = text.split("-")
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        raise ValueError(f"CORRAL_JOB_UID_RANGE: {text!r} is not a range like 200000-265535") from None
    if not 0 < lo <= hi < 2**32 - 1:
        raise ValueError(f"CORRAL_JOB_UID_RANGE: {text!r}: expected 0 < first <= last < 4294967295")
    return lo, hi


@dataclass(frozen=True)
class SandboxConfig:
    mode: str = "auto"
    uid_range: tuple[int, int] = DEFAULT_UID_RANGE
    subnet: str = DEFAULT_SUBNET
    bridge: str = DEFAULT_BRIDGE
    state_dir: str = DEFAULT_STATE_DIR
    #: host paths no job may see (besides the agent's work dir): the server's state directory
    hide: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: dict[str, str], mode: str = "auto", hide: tuple[str, ...] = ()) -> SandboxConfig:
        """``CORRAL_JOB_UID_RANGE``, ``CORRAL_SANDBOX_SUBNET``, ``CORRAL_SANDBOX_BRIDGE``,
        ``CORRAL_SANDBOX_STATE_DIR``, ``CORRAL_SANDBOX_HIDE`` (``:``-separated); ValueError names the bad one."""
        if mode not in MODES:
            raise ValueError(f"--sandbox: {mode!r} is not one of auto, on, off")
        uids = parse_uid_range(environ["CORRAL_JOB_UID_RANGE"]) if environ.get("CORRAL_JOB_UID_RANGE") else None
        subnet = environ.get("CORRAL_SANDBOX_SUBNET") or DEFAULT_SUBNET
        try:
            net = ipaddress.IPv4Network(subnet)
        except ValueError as e:
            raise ValueError(f"CORRAL_SANDBOX_SUBNET: {subnet!r}: {e}") from None
        if net.num_addresses < 8:
            raise ValueError(f"CORRAL_SANDBOX_SUBNET: {subnet!r} is too small (at least a /29)")
        extra = tuple(p for p in (environ.get("CORRAL_SANDBOX_HIDE") or "").split(":") if p)
        return cls(
            mode=mode,
            uid_range=uids or DEFAULT_UID_RANGE,
            subnet=str(net),
            bridge=environ.get("CORRAL_SANDBOX_BRIDGE") or DEFAULT_BRIDGE,
            state_dir=environ.get("CORRAL_SANDBOX_STATE_DIR") or DEFAULT_STATE_DIR,
            hide=tuple(os.path.abspath(p) for p in (*hide, *extra)),
        )


@dataclass
class JobSandbox:
    slot: int
    #: None when the job keeps the host's network
    address: str | None
    uid: int
    netns: str | None
    #: whether the job gets a user namespace (where it is root, or its ``user``)
    userns: bool = False
    forwarders: dict[int, Forwarder] = field(default_factory=dict)
    #: The job whose slot it is (its record's ``job_id``).
    job_id: str = ""

    def ports(self) -> dict[int, int]:
        return {p: f.port for p, f in self.forwarders.items()}
