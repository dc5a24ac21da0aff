"""Fake SSH hosts for the SSH-fleet tests: real sshd servers in network namespaces on this machine.

Each host is a network namespace on a private /24 that this module creates (and only there), with
its own mount, UTS and PID namespaces and a chroot into a copy-on-write overlay of ``/`` (upper dir on
/dev/shm): its own hostname, its own processes, its own writes, its own sshd on port 22 (key auth as
root), with a fresh ``/tmp`` and ``/run`` (tmpfs, as at boot). Needs root, iproute2, util-linux (``unshare``) and
openssh-server.

Parallel runs on one machine cannot collide: each ``FakeHosts`` claims a free /24 (``bridge_net``) by creating
its bridge (``cfh<N>br``, 10.213.N.0/24) -- creating the bridge is the atomic claim -- and records its pid
under /run/corral-fakehosts; leftovers of a crashed run (its pid is gone) are removed at the next start.

A host can be killed (every process of it dies at once, like a power cut: the address then refuses
connections) and revived (a new sshd on the same address and the same disk, i.e. a reboot).

A host with ``HostSpec(docker=True)`` also runs its own ``dockerd``, started at each boot inside the
host's namespaces, with its socket at the default /var/run/docker.sock, so that whatever logs in finds
it the normal way (see ``fakehost_docker``); registries on the host's /24 speak plain HTTP to it.
:meth:`FakeHosts.stop` removes its containers, stops it, and removes its cgroups and data root.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import bridge_net
import fakehost_docker
from bridge_net import sh as sh  # re-exported: the SSH tests run commands with it too

OWNERS = pathlib.Path("/run/corral-fakehosts")
TAG = "cfh"  # bridge cfh<N>br, namespaces cfh<N>h<name> (bridge_net)
SSHD = "/usr/sbin/sshd -D -f /etc/ssh/fakehost/sshd_config -E /var/log/sshd.log"
FIRST_NET, LAST_NET = 40, 250

NVIDIA_SMI = """#!/bin/sh
# fake nvidia-smi: {count} x {name} ({memory_mib} MiB)
for i in $(seq {count}); do echo "{name}, {memory_mib}, 535.104.05"; done
"""


AMD_SMI = """#!/bin/sh
# fake amd-smi: answers `amd-smi static --asic --vram --driver --json` with {count} x MI300X (192 GB)
gpu='{{"gpu": 0, "asic": {{"market_name": "AMD Instinct MI300X"}}, '\
'"vram": {{"size": {{"value": 196592, "unit": "MB"}}}}, "driver": {{"version": "6.8.5"}}}}'
printf '['; i=1; while [ $i -le {count} ]; do [ $i -gt 1 ] && printf ','; printf '%s' "$gpu"; i=$((i+1)); done; echo ']'
"""


@dataclass
class HostSpec:
    """What is special about one fake host."""

    gpus: int = 0
    gpu_name: str = "NVIDIA A100-SXM4-80GB"
    gpu_memory_mib: int = 81920
    #: AMD GPUs a fake ``amd-smi`` reports (MI300X, 192 GB each).
    amd_gpus: int = 0
    #: No ``python3`` anywhere on the login PATH (an overlay whiteout hides /usr/bin/python3).
    no_python: bool = False
    #: Extra sshd_config lines; ``{subnet}`` is the /24's prefix (``AllowUsers root@{subnet}.11``).
    sshd_extra: str = ""
    #: An account ``nologin`` with the test key authorised and /usr/sbin/nologin as its shell.
    nologin_user: bool = False
    #: Its own ``dockerd`` at /var/run/docker.sock (see the module's docstring).
    docker: bool = False
    #: Directories of this machine mounted into the host at each boot, ``{path inside: path here}``: a file
    #: system every host shares (an NFS ``/home``).
    binds: dict[str, str] = field(default_factory=dict)


@dataclass
class Host:
    name: str
    ip: str
    spec: HostSpec
    upper_root: pathlib.Path
    proc: subprocess.Popen[bytes] | None = None
    alive: bool = field(default=False)


def _remove_net(n: int) -> None:
    """Tear down everything of net ``n``: its namespaces (and their processes), its bridge, its disks."""
    bridge_net.remove(TAG, n)
    # a host's veth outlives its namespace while a killed process still holds it: a later run of net n could not
    # make its own (``ip link add cfh<n>v<i>``: "File exists")
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(f"cfh{n}v") and name[len(f"cfh{n}v") :].isdigit():
            sh("ip", "link", "del", name, check=False)
    fakehost_docker.remove_cgroups(f"cfh{n}-")
    shutil.rmtree(f"/dev/shm/corral-fakehosts-{n}", ignore_errors=True)
    (OWNERS / str(n)).unlink(missing_ok=True)


def reap_stale() -> None:
    """Remove the nets of runs that died without cleaning up (their owner pid is gone)."""
    for n in bridge_net.stale_nets(TAG, OWNERS):
        _remove_net(n)


class FakeHosts:
    def __init__(self, specs: dict[str, HostSpec], base: pathlib.Path) -> None:
        self.specs = specs
        self.base = pathlib.Path(base)
        self.key = self.base / "id_ed25519"
        self.wrong_key = self.base / "wrong_ed25519"
        self.hosts: dict[str, Host] = {}
        self.n = -1

    # -- addresses ------------------------------------------------------------------------------
    @property
    def subnet(self) -> str:
        return f"10.213.{self.n}"

    @property
    def gateway(self) -> str:
        return f"{self.subnet}.1"

    def ip(self, name: str) -> str:
        return self.hosts[name].ip

    def unused_ip(self) -> str:
        """An address inside our /24 where no host lives (connections time out or find no route)."""
        return f"{self.subnet}.250"

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> FakeHosts:
        reap_stale()
        self.base.mkdir(parents=True, exist_ok=True)
        for key in (self.key, self.wrong_key):
            if not key.exists():
                sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "corral-test", "-f", str(key))
        self.n = bridge_net.claim(TAG, "10.213", OWNERS, range(FIRST_NET, LAST_NET), "fake hosts")
        bridge = f"{TAG}{self.n}br"
        up = pathlib.Path(f"/dev/shm/corral-fakehosts-{self.n}")  # not on the '/' file system
        for i, (name, spec) in enumerate(self.specs.items(), start=1):
            host = Host(name=name, ip=f"{self.subnet}.{10 + i}", spec=spec, upper_root=up / name)
            self.hosts[name] = host
            self._prepare_disk(host)
            bridge_net.plug(self._ns(host), f"cfh{self.n}v{i}", bridge, host.ip)
            self._boot(host)
        for host in self.hosts.values():
            self._wait_sshd(host)
            self._wait_docker(host)
        return self

    def _ns(self, host: Host) -> str:
        return f"cfh{self.n}h{host.name}"

    def netns(self, name: str) -> str:
        """The network namespace of host ``name`` (to run a process with its address: ``ip netns exec NS``)."""
        return self._ns(self.hosts[name])

    def add(self, name: str, ip: str, spec: HostSpec | None = None, wait: bool = True) -> Host:
        """A new host at ``ip`` (inside this /24) while the others run: a machine a cloud just started.
        ``name`` is at most 4 characters (interface names are short); root's key is the test key until
        whatever runs on it (a cloud's user data) adds others."""
        assert ip.startswith(self.subnet + ".") and len(name) <= 4 and name not in self.hosts
        host = Host(
            name=name,
            ip=ip,
            spec=spec or HostSpec(),
            upper_root=pathlib.Path(f"/dev/shm/corral-fakehosts-{self.n}") / name,
        )
        self.hosts[name] = host
        self._prepare_disk(host)
        bridge_net.plug(self._ns(host), f"cfh{self.n}x{name}", f"cfh{self.n}br", ip)
        self._boot(host)
        if wait:
            self._wait_sshd(host)
        return host

    def remove(self, name: str) -> None:
        """The host is gone for good: its processes, its namespace and its disk."""
        host = self.hosts.pop(name)
        if host.proc is not None and host.proc.poll() is None:
            host.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                host.proc.wait(timeout=10)
        sh("ip", "netns", "del", self._ns(host), check=False)
        # The namespace (and its end of the link, with the address) goes only once the kernel has reaped
        # it, which may be seconds later: take the link off the bridge now, so that a host added at the
        # same address next is the only one answering there.
        sh("ip", "link", "del", f"cfh{self.n}x{name}", check=False)
        sh("ip", "neigh", "flush", "to", host.ip, "dev", f"cfh{self.n}br", check=False)
        shutil.rmtree(host.upper_root, ignore_errors=True)

    def _prepare_disk(self, host: Host) -> None:
        """The host's private writes: its name, sshd config and keys, root's authorised key."""
        upper = host.upper_root / "upper"
        for d in (
            "work",
            "merged",
            "upper/root/.ssh",
            "upper/etc/ssh/fakehost",
            "upper/usr/local/bin",
        ):
            (host.upper_root / d).mkdir(parents=True, exist_ok=True)
        pub = (self.base / "id_ed25519.pub").read_text()
        os.chmod(upper / "root/.ssh", 0o700)
        (upper / "root/.ssh/authorized_keys").write_text(pub)
        # A fresh machine's shell: no pyenv or cargo from the build machine's root account.
        (upper / "root/.bashrc").write_text("# fake host\n")
        (upper / "root/.profile").write_text("# fake host\n")
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(upper / "etc/ssh/fakehost/host_key"))
        (upper / "etc/hostname").write_text(host.name + "\n")
        (upper / "etc/ssh/fakehost/sshd_config").write_text(
            "Port 22\nHostKey /etc/ssh/fakehost/host_key\nPidFile /run/sshd.pid\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nAuthorizedKeysFile %h/.ssh/authorized_keys\nSubsystem sftp internal-sftp\n"
            + host.spec.sshd_extra.format(subnet=self.subnet)
            + "\n"
        )
        python_on_path = any(os.path.exists(f"{d}/python3") for d in ("/usr/local/bin", "/usr/bin", "/bin"))
        if host.spec.no_python:
            for d in ("usr/bin", "usr/local/bin"):
                if os.path.exists(f"/{d}/python3"):
                    (upper / d).mkdir(parents=True, exist_ok=True)
                    os.mknod(upper / d / "python3", 0o600 | 0o020000, os.makedev(0, 0))  # overlay whiteout
        elif not python_on_path:  # a build machine without a system python3: lend it ours
            (upper / "usr/local/bin/python3").symlink_to(os.path.realpath(sys.executable))
        if host.spec.gpus:
            smi = upper / "usr/local/bin/nvidia-smi"
            smi.write_text(
                NVIDIA_SMI.format(count=host.spec.gpus, name=host.spec.gpu_name, memory_mib=host.spec.gpu_memory_mib)
            )
            smi.chmod(0o755)
        if host.spec.amd_gpus:
            smi = upper / "usr/local/bin/amd-smi"
            smi.write_text(AMD_SMI.format(count=host.spec.amd_gpus))
            smi.chmod(0o755)
        if host.spec.nologin_user:
            home = upper / "home/nologin"
            (home / ".ssh").mkdir(parents=True, exist_ok=True)
            (home / ".ssh/authorized_keys").write_text(pub)
            shutil.chown(home, 4242, 4242)
            for name, line in (
                ("passwd", "nologin:x:4242:4242::/home/nologin:/usr/sbin/nologin\n"),
                ("shadow", "nologin:*:19000:0:99999:7:::\n"),
                ("group", "nologin:x:4242:\n"),
            ):
                target = upper / "etc" / name
                shutil.copy(f"/etc/{name}", target)
                with open(target, "a") as f:
                    f.write(line)

    def _boot(self, host: Host) -> None:
        u = host.upper_root
        m = u / "merged"
        script = (
            f"mount -t overlay overlay -o lowerdir=/,upperdir={u / 'upper'},workdir={u / 'work'} {m} && "
            f"mount --rbind /dev {m}/dev && mount -t proc proc {m}/proc && mount -t sysfs sysfs {m}/sys && "
            f"mount -t tmpfs tmpfs {m}/tmp && "
            # a /run of its own, as a machine gets at boot: the build machine's (its job sandbox's slots,
            # sockets, pid files) would show through the overlay and change under it
            f"mount -t tmpfs -o mode=755 tmpfs {m}/run && mkdir -p {m}/run/sshd {m}/run/lock && "
            f"hostname {host.name} && "
            + "".join(
                f"mkdir -p {m}{inside} && mount --bind {shlex.quote(here)} {m}{inside} && "
                for inside, here in host.spec.binds.items()
            )
        ) + (
            fakehost_docker.boot_script(
                m, self.docker_data(host.name), f"/cfh{self.n}-{host.name}", f"{self.subnet}.0/24", SSHD
            )
            if host.spec.docker
            else f"exec chroot {m} {SSHD}"
        )
        err = open(self.base / f"{host.name}.err", "a")  # noqa: SIM115 - handed to the child
        try:
            host.proc = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    self._ns(host),
                    "unshare",
                    "--mount",
                    "--uts",
                    "--pid",
                    "--fork",
                    "--kill-child",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    script,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        finally:
            err.close()
        host.alive = True

    def _wait_sshd(self, host: Host, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection((host.ip, 22), timeout=0.5).close()
                return
            except OSError:
                if host.proc is not None and host.proc.poll() is not None:
                    raise RuntimeError(f"fake host {host.name} exited: {(self.base / f'{host.name}.err').read_text()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on {host.name} ({host.ip}) did not come up") from None
                time.sleep(0.02)

    # -- inside a host ------------------------------------------------------------------------
    def exec(
        self, name: str, command: str, input: bytes | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[bytes]:
        """``sh -c command`` inside the host (its namespaces and root), without SSH."""
        host = self.hosts[name]
        assert host.proc is not None and host.alive, f"fake host {name} is not running"
        children = pathlib.Path(f"/proc/{host.proc.pid}/task/{host.proc.pid}/children").read_text().split()
        init = children[0]  # unshare's child: the PID namespace's init (sshd)
        argv = ["nsenter", "-t", init, "-m", "-u", "-n", "-p", "-r", "-w", "sh", "-c", command]
        return subprocess.run(argv, input=input, capture_output=True, timeout=timeout, check=False)

    def docker_data(self, name: str) -> pathlib.Path:
        return self.base / f"{name}-docker"

    def docker(self, name: str, *args: str, input: bytes | None = None) -> str:
        """The host's ``docker`` CLI against its own engine; raises with its stderr on failure."""
        out = self.exec(name, " ".join(["docker", *(shlex.quote(a) for a in args)]), input=input, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} on {name}: {out.stderr.decode(errors='replace').strip()}")
        return out.stdout.decode()

    def _wait_docker(self, host: Host, timeout: float = 30.0) -> None:
        if not host.spec.docker:
            return
        deadline = time.monotonic() + timeout
        while self.exec(host.name, "docker version", timeout=10).returncode != 0:
            if time.monotonic() > deadline:
                log = self.exec(host.name, "tail -n 20 /var/log/dockerd.log").stdout.decode(errors="replace")
                raise RuntimeError(f"dockerd on fake host {host.name} did not come up: {log}")
            time.sleep(0.1)

    def _stop_docker(self, host: Host) -> None:
        """Remove the host's containers and stop its dockerd cleanly (it then removes their cgroups)."""
        if not (host.spec.docker and host.alive and host.proc is not None and host.proc.poll() is None):
            return
        self.exec(host.name, "docker ps -aq | xargs -r docker rm -f", timeout=60)
        self.exec(
            host.name,
            "pid=$(cat /var/run/docker.pid 2>/dev/null) && kill $pid && "
            "n=0; while kill -0 $pid 2>/dev/null && [ $n -lt 200 ]; do n=$((n+1)); sleep 0.05; done",
            timeout=30,
        )

    def kill(self, name: str) -> None:
        """Power cut: every process of the host dies at once; its address now refuses connections."""
        host = self.hosts[name]
        if host.proc is not None:
            host.proc.kill()  # unshare --kill-child: the namespace's init dies, and with it everything
            host.proc.wait(timeout=10)
        host.alive = False

    def revive(self, name: str) -> None:
        """Boot the host again: same address, same disk (its overlay upper), nothing running."""
        host = self.hosts[name]
        assert not host.alive
        self._boot(host)
        self._wait_sshd(host)
        self._wait_docker(host)

    def stop(self) -> None:
        for host in self.hosts.values():
            with contextlib.suppress(Exception):  # best effort: what is left dies with the host below
                self._stop_docker(host)
        for host in self.hosts.values():
            if host.proc is not None and host.proc.poll() is None:
                host.proc.kill()
        for host in self.hosts.values():
            if host.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    host.proc.wait(timeout=10)
        if self.n >= 0:
            _remove_net(self.n)
        for host in self.hosts.values():
            if host.spec.docker:
                shutil.rmtree(self.docker_data(host.name), ignore_errors=True)
