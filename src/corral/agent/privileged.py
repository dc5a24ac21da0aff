"""Whether this host's Docker engine can start a privileged container, which ``privileged: true`` and
``docker: true`` ask for, and if not, how close it can come: found once per agent (one a host), by creating
and starting one container of the job's image that runs ``true``, and kept.

An engine whose root lacks some capability a privileged container gets (Docker running inside another
container, say) cannot start one: runc refuses with "unable to apply caps: operation not permitted" (runc's
``libcontainer/capabilities``). The agent then probes once more with the **fallback**: every capability
the engine knows except those missing from the host's bounding set (``CapAdd: ALL`` with ``CapDrop``),
seccomp, AppArmor and the masked ``/proc`` paths unconfined, the host's cgroup namespace and
``/sys/fs/cgroup`` mounted writable: privileged as far as the host allows. If that starts, such jobs run
with it and say once which capabilities the host cannot grant; if not (or ``CORRAL_AGENT_PRIVILEGED_FALLBACK``
is ``false``), they are refused naming both errors. An answer that is not clear (the image has no
``true``, the engine is away) is not kept: the job's own start says.
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .docker import Docker, DockerError

log = logging.getLogger("corral.agent")

#: What runc answers when the engine cannot give a container the capabilities it asks for.
CAPS_ERROR = "unable to apply caps"

#: The Linux capabilities by number (include/uapi/linux/capability.h, Linux 5.9+; ``CAP_LAST_CAP`` is 40).
CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
    "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
    "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
)  # fmt: skip

#: The engine's answer to a ``CapDrop`` it does not know (moby's ``oci/caps``: 'unknown capability: "CAP_BPF"').
_UNKNOWN_CAP = re.compile(r'unknown capability: "?(CAP_[A-Z_]+)')

#: The fallback's writable cgroup tree (what ``-v /sys/fs/cgroup:/sys/fs/cgroup:rw`` mounts).
CGROUP_MOUNT = {"Type": "bind", "Source": "/sys/fs/cgroup", "Target": "/sys/fs/cgroup", "ReadOnly": False}

FALLBACK_SETTING = "CORRAL_AGENT_PRIVILEGED_FALLBACK"


@dataclass(frozen=True)
class Privilege:
    """How this host runs a privileged container: with ``--privileged`` (``fallback`` False, ``refusal``
    None), with the fallback, without the ``missing`` capabilities, or not at all (``refusal``)."""

    refusal: str | None = None
    fallback: bool = False
    missing: tuple[str, ...] = ()

    def notice(self) -> str:
        """The job's line saying it runs with the fallback."""
        return (
            f"This host's Docker engine cannot grant {', '.join(self.missing) or 'every capability'}, so the "
            "privileged container runs with every other capability (seccomp, AppArmor and /proc's masked "
            "paths unconfined, the host's cgroups writable) instead of --privileged"
        )


# ---- pure parts ---------------------------------------------------------------------------------
def bounding_set(status: str) -> int | None:
    """The ``CapBnd`` mask of a ``/proc/<pid>/status`` text (None if it has none)."""
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == "CapBnd":
            try:
                return int(value.strip(), 16)
            except ValueError:
                return None
    return None


def missing_capabilities(cap_bnd: int, last_cap: int) -> tuple[str, ...]:
    """The capabilities (up to the kernel's ``cap_last_cap``) that the bounding set ``cap_bnd`` lacks."""
    return tuple(name for n, name in enumerate(CAPABILITIES[: last_cap + 1]) if not cap_bnd >> n & 1)


def unknown_capability(engine_error: str) -> str | None:
    """The capability an engine's error says it does not know, if it says so."""
    found = _UNKNOWN_CAP.search(engine_error)
    return found.group(1) if found else None


def fallback_host_config(missing: tuple[str, ...]) -> dict[str, Any]:
    """The ``HostConfig`` fields of the fallback, in place of ``Privileged`` (the cgroup mount aside)."""
    return {
        "Privileged": False,
        # every capability the engine knows but the dropped ones (moby's oci/caps TweakCapabilities)
        "CapAdd": ["ALL"],
        "CapDrop": list(missing),
        # `--security-opt seccomp=unconfined --security-opt apparmor=unconfined`; systempaths=unconfined is
        # empty MaskedPaths and ReadonlyPaths in the API (docker's CLI, cli/command/container/opts.go)
        "SecurityOpt": ["seccomp=unconfined", "apparmor=unconfined"],
        "MaskedPaths": [],
        "ReadonlyPaths": [],
        "CgroupnsMode": "host",
    }


def refusal_message(engine_error: str, fallback_error: str | None = None) -> str:
    """The job's failure on a host whose engine cannot start privileged containers, and what to change."""
    tried = (
        f"; nor with every capability the host has instead of --privileged: {fallback_error.strip()}"
        if fallback_error
        else ""
    )
    return (
        "This host cannot run a privileged container, which `docker: true` and `privileged: true` need: its "
        "Docker engine lacks capabilities such a container gets (as when Docker itself runs inside a container; "
        f"the engine said: {engine_error.strip()}{tried}); run the job in a fleet whose hosts' Docker has every "
        "capability, or remove `docker` (`privileged`)"
    )


def fallback_allowed(environ: Mapping[str, str]) -> bool:
    """``CORRAL_AGENT_PRIVILEGED_FALLBACK``: true (the default) or false; anything else keeps the default."""
    raw = environ.get(FALLBACK_SETTING, "true").strip().lower()
    if raw not in ("true", "false", "1", "0", "yes", "no"):
        log.error("%s=%r must be true or false; the fallback stays allowed", FALLBACK_SETTING, raw)
    return raw not in ("false", "0", "no")


def host_missing_capabilities() -> tuple[str, ...]:
    """What this process's bounding set lacks (the agent runs as the engine's root does, as a rule)."""
    try:
        with open("/proc/self/status") as f:
            cap_bnd = bounding_set(f.read())
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last_cap = int(f.read().strip())
    except (OSError, ValueError):
        return ()
    return () if cap_bnd is None else missing_capabilities(cap_bnd, last_cap)


# ---- the probe ----------------------------------------------------------------------------------
class PrivilegedProbe:
    """The cached answer for this agent's Docker engine (see the module's docstring)."""

    def __init__(
        self,
        docker: Docker,
        labels: dict[str, str],
        allow_fallback: bool = True,
        host_missing: Callable[[], tuple[str, ...]] = host_missing_capabilities,
    ) -> None:
        self.docker = docker
        #: Put on the probe's container, so that a sweep removes one an agent's crash left.
        self.labels = labels
        self.allow_fallback = allow_fallback
        #: The capabilities the host cannot grant (read from the bounding set when the fallback is tried).
        self.host_missing = host_missing
        self._lock = threading.Lock()
        self._answer: Privilege | None = None
        #: How many containers the probe started (once or twice, unless the answers were not clear).
        self.probes = 0

    def privilege(self, image: str) -> Privilege:
        """How a privileged container of ``image`` runs on this host (``--privileged`` when not clear)."""
        with self._lock:
            if self._answer is None:
                self._answer = self._probe(image)
            return self._answer or Privilege()

    def _probe(self, image: str) -> Privilege | None:
        """The answer, or None when it is not clear."""
        error = self._try(image, {"Privileged": True})
        if error is None or CAPS_ERROR not in error:
            return Privilege() if error is None else None
        log.warning("this host's Docker engine cannot start privileged containers: %s", error)
        if not self.allow_fallback:
            return Privilege(refusal=refusal_message(error, f"{FALLBACK_SETTING}=false forbids it"))
        missing = self.host_missing()
        fallback_error = self._try(image, {**fallback_host_config(missing), "Mounts": [CGROUP_MOUNT]})
        while fallback_error is not None and unknown_capability(fallback_error) in missing:
            missing = tuple(m for m in missing if m != unknown_capability(fallback_error))  # the engine lacks it too
            fallback_error = self._try(image, {**fallback_host_config(missing), "Mounts": [CGROUP_MOUNT]})
        if fallback_error is None:
            log.warning("privileged containers run without %s instead", ", ".join(missing))
            return Privilege(fallback=True, missing=missing)
        return Privilege(refusal=refusal_message(error, fallback_error))

    def _try(self, image: str, host: dict[str, Any]) -> str | None:
        """Start a container of ``image`` running ``true`` with ``host``: None if it started, else the error."""
        config = {
            "Image": image, "Entrypoint": ["true"], "Cmd": [], "Labels": self.labels, "NetworkDisabled": True,
            "HostConfig": {**host, "NetworkMode": "none"},
        }  # fmt: skip
        try:
            cid = self.docker.create(f"corral-privileged-probe-{uuid.uuid4().hex[:12]}", config)
        except DockerError as e:
            log.info("cannot create the privileged probe's container: %s", e.message)
            return e.message
        self.probes += 1
        try:
            self.docker.start(cid)
            return None
        except DockerError as e:
            log.info("the privileged probe's container did not start: %s", e.message)
            return e.message
        finally:
            try:
                self.docker.remove(cid)
            except DockerError as e:
                log.info("removing the privileged probe's container %s: %s", cid[:12], e.message)
