"""A real Slurm cluster (Debian's slurm-wlm 22.05) on fake hosts (``fakehosts``), for the Slurm backend's tests.

Seven hosts on one private /24, each with its own network, mount, UTS and PID namespaces and its own root:

* ``ctl``: ``slurmctld``;
* ``login``: the login node, reached over SSH as the cluster user (:data:`USER`, uid :data:`UID`, its own key);
* ``n1``..``n4``: ``slurmd`` in partition ``cpu`` (the default); ``g1``: ``slurmd`` in partition ``gpu`` with
  ``Gres=gpu:a100:2`` (two character devices made with ``mknod`` inside the host, and a fake ``nvidia-smi``);
  each node is 4 CPUs and 16000 MB to Slurm (``SlurmdParameters=config_overrides``), whatever this machine has.

Every host runs its own ``munged`` with one shared key and has the same ``/etc/slurm`` (``slurm.conf``,
``gres.conf``, ``cgroup.conf``), ``/etc/hosts`` and ``/etc/passwd``; the cluster user's home is one directory of this
machine mounted at ``/home/<user>`` on every host, as an NFS ``/home`` is. ``KillWait=5``, ``ReturnToService=2``.
Python 3 on the nodes is this machine's (the hosts see ``/`` through a copy-on-write overlay).

Needs root and the packages ``slurmctld slurmd slurm-client munge`` (``scripts/test.sh`` installs them when missing).
Facts used here (Slurm 22.05 on Debian 12): slurmd needs ``CgroupPlugin=cgroup/v1`` where ``/sys/fs/cgroup`` is not
mounted, does not create its spool directory, and takes ``gres.conf``'s ``File=`` only for character or block
devices (https://slurm.schedmd.com/gres.conf.html: "File: Fully qualified pathname of the device files").

``SlurmTestCluster(base).start()`` prints its bring-up time; ``stop()`` leaves no process, namespace or bridge.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import time

from fakehosts import FakeHosts, Host, HostSpec, sh

USER = "hpc"
UID = 4242
HOME = f"/home/{USER}"
CONTROLLER = "ctl"
LOGIN = "login"
CPU_NODES = ("n1", "n2", "n3", "n4")
GPU_NODES = ("g1",)
NODES = CPU_NODES + GPU_NODES
NODE_CPUS = 4
NODE_MEMORY_MB = 16000
GPU_GRES = "gpu:a100:2"
CLUSTER_NAME = "testcluster"

SLURM_CONF = """ClusterName={cluster}
SlurmctldHost={ctl}({ctl_ip})
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmctldPidFile=/run/slurmctld.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdSpoolDir=/var/spool/slurmd
SlurmdPidFile=/run/slurmd.pid
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
SlurmdTimeout=30
GresTypes=gpu
{nodes}
PartitionName=cpu Nodes={cpu_nodes} Default=YES MaxTime=60 State=UP
PartitionName=gpu Nodes={gpu_nodes} MaxTime=60 State=UP
"""
GPU_DEVICES = "/var/lib/fakegpu"


class SlurmTestCluster:
    """The cluster; :attr:`hosts` are its fake hosts (``hosts.exec`` runs a command as root inside one)."""

    def __init__(self, base: pathlib.Path) -> None:
        self.base = pathlib.Path(base)
        self.home = self.base / "home"
        self.user_key = self.base / f"{USER}_ed25519"
        specs = {CONTROLLER: HostSpec(), LOGIN: HostSpec(binds={HOME: str(self.home)})}
        for node in CPU_NODES:
            specs[node] = HostSpec(binds={HOME: str(self.home)})
        for node in GPU_NODES:
            specs[node] = HostSpec(gpus=2, binds={HOME: str(self.home)})
        self.hosts = _SlurmHosts(self, specs, self.base / "hosts")
        self.bring_up_s = 0.0

    # -- addresses and credentials ------------------------------------------------------------
    @property
    def login_ip(self) -> str:
        return self.hosts.ip(LOGIN)

    def key_pem(self) -> str:
        """The cluster user's private key (OpenSSH format)."""
        return self.user_key.read_text()

    def wrong_key_pem(self) -> str:
        """A key no host authorises."""
        return self.hosts.wrong_key.read_text()

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> SlurmTestCluster:
        t0 = time.monotonic()
        self.base.mkdir(parents=True, exist_ok=True)
        self._prepare_home()
        self.hosts.start()
        try:
            for name in self.hosts.hosts:
                self.root(name, "mkdir -p /run/munge && /usr/sbin/munged --force >/var/log/munged.out 2>&1")
            for node in GPU_NODES:
                self.root(
                    node, f"mkdir -p {GPU_DEVICES} && for i in 0 1; do mknod -m 666 {GPU_DEVICES}/nvidia$i c 1 3; done"
                )
            self.root(CONTROLLER, "/usr/sbin/slurmctld >/var/log/slurm/slurmctld.out 2>&1")
            for node in NODES:
                self.root(node, f"/usr/sbin/slurmd -N {node} >/var/log/slurm/slurmd.out 2>&1")
            self.wait_nodes(NODES, "idle", timeout=60)
        except BaseException:
            self.stop()
            raise
        self.bring_up_s = time.monotonic() - t0
        print(f"slurm test cluster up in {self.bring_up_s:.2f} s ({len(self.hosts.hosts)} hosts)")
        return self

    def stop(self) -> None:
        self.hosts.stop()
        shutil.rmtree(self.home, ignore_errors=True)

    def _prepare_home(self) -> None:
        if not self.user_key.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", USER, "-f", str(self.user_key))
        ssh = self.home / ".ssh"
        ssh.mkdir(parents=True, exist_ok=True)
        (ssh / "authorized_keys").write_text(pathlib.Path(f"{self.user_key}.pub").read_text())
        for name in (".profile", ".bashrc"):
            (self.home / name).write_text("# cluster user\n")
        for path in (self.home, ssh, ssh / "authorized_keys", self.home / ".profile", self.home / ".bashrc"):
            os.chown(path, UID, UID)
        os.chmod(self.home, 0o755)
        os.chmod(ssh, 0o700)
        os.chmod(ssh / "authorized_keys", 0o600)

    # -- commands -----------------------------------------------------------------------------
    def root(self, host: str, command: str, timeout: float = 60) -> str:
        """``command`` as root inside ``host`` (no SSH); raises with its output on failure."""
        out = self.hosts.exec(host, command, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(
                f"{command!r} on {host} exited {out.returncode}: "
                f"{out.stderr.decode(errors='replace').strip()} {out.stdout.decode(errors='replace').strip()}"
            )
        return out.stdout.decode()

    def as_user(self, command: str, host: str = LOGIN, timeout: float = 60) -> str:
        """``command`` in a login shell of the cluster user on ``host`` (no SSH)."""
        return self.root(host, f"runuser -l {USER} -c {shlex.quote(command)}", timeout=timeout)

    def squeue(self) -> list[dict[str, str]]:
        """Every job Slurm knows (``-t all``), as root: id, name, state, nodes, reason (the test's own sampling)."""
        out = self.root(LOGIN, "squeue -h -t all -o '%i|%j|%T|%N|%r'")
        keys = ("id", "name", "state", "nodes", "reason")
        return [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines() if line]

    def node_states(self) -> dict[str, str]:
        """Each node's state as ``sinfo -N`` names it (``idle``, ``drained``, ``alloc``...)."""
        out = self.root(LOGIN, "sinfo -h -N -o '%N %T'")
        return {n: s for n, s in (line.split() for line in out.splitlines() if line)}

    def wait_nodes(self, nodes: tuple[str, ...], state: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                states = self.node_states()
            except RuntimeError:
                states = {}
            if all(states.get(n) == state for n in nodes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes {nodes} not {state} within {timeout} s: {states}")
            time.sleep(0.2)

    def drain(self, node: str, reason: str = "maintenance") -> None:
        self.root(LOGIN, f"scontrol update nodename={node} state=drain reason={shlex.quote(reason)}")

    def set_max_time(self, partition: str, max_time: str) -> None:
        """A partition's ``MaxTime`` (Slurm's time format: ``1`` minute, ``60``, ``UNLIMITED``), as an administrator
        sets it; the configuration's is ``60``."""
        self.root(LOGIN, f"scontrol update partitionname={partition} maxtime={shlex.quote(max_time)}")

    def resume(self, node: str) -> None:
        self.root(LOGIN, f"scontrol update nodename={node} state=resume")
        self.wait_nodes((node,), "idle")

    def stop_controller(self) -> None:
        """Stop ``slurmctld`` (its state stays): the cluster's commands fail until :meth:`start_controller`."""
        self.root(CONTROLLER, "kill $(cat /run/slurmctld.pid); while [ -e /run/slurmctld.pid ]; do sleep 0.05; done")

    def start_controller(self) -> None:
        self.root(CONTROLLER, "/usr/sbin/slurmctld >>/var/log/slurm/slurmctld.out 2>&1")
        self.wait_nodes(NODES, "idle", timeout=60)

    def cancel_all(self) -> None:
        """Cancel every job (a test's own leftovers) and wait until no job holds a node."""
        self.root(LOGIN, "scancel -u " + USER + " || true")
        deadline = time.monotonic() + 30
        while any(j["state"] in ("RUNNING", "PENDING", "COMPLETING") for j in self.squeue()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"jobs left after scancel: {self.squeue()}")
            time.sleep(0.2)


class _SlurmHosts(FakeHosts):
    """Fake hosts whose disks also get the cluster's configuration, the munge key and the cluster user."""

    def __init__(self, cluster: SlurmTestCluster, specs: dict[str, HostSpec], base: pathlib.Path) -> None:
        super().__init__(specs, base)
        self.cluster = cluster
        self.munge_key = os.urandom(1024)

    def _prepare_disk(self, host: Host) -> None:
        super()._prepare_disk(host)
        upper = host.upper_root / "upper"
        ips = {name: f"{self.subnet}.{10 + i}" for i, name in enumerate(self.specs, start=1)}
        etc = upper / "etc"
        for d in ("slurm", "munge"):
            (etc / d).mkdir(parents=True, exist_ok=True)
        for d in ("var/spool/slurmctld", "var/spool/slurmd", "var/log/slurm", "var/log/munge", "var/lib/munge"):
            (upper / d).mkdir(parents=True, exist_ok=True)
        key = etc / "munge/munge.key"
        key.write_bytes(self.munge_key)
        key.chmod(0o400)
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={ips[n]} CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB}"
            + (f" Gres={GPU_GRES}" if n in GPU_NODES else "")
            for n in NODES
        )
        (etc / "slurm/slurm.conf").write_text(
            SLURM_CONF.format(
                cluster=CLUSTER_NAME,
                ctl=CONTROLLER,
                ctl_ip=ips[CONTROLLER],
                nodes=nodes,
                cpu_nodes=",".join(CPU_NODES),
                gpu_nodes=",".join(GPU_NODES),
            )
        )
        (etc / "slurm/cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        (etc / "slurm/gres.conf").write_text(
            "AutoDetect=off\n"
            + "".join(f"NodeName={n} Name=gpu Type=a100 File={GPU_DEVICES}/nvidia[0-1]\n" for n in GPU_NODES)
        )
        hosts = pathlib.Path("/etc/hosts").read_text() + "".join(f"{ip} {name}\n" for name, ip in ips.items())
        (etc / "hosts").write_text(hosts)
        for name, line in (
            ("passwd", f"{USER}:x:{UID}:{UID}::{HOME}:/bin/bash\n"),
            ("shadow", f"{USER}:*:19000:0:99999:7:::\n"),
            ("group", f"{USER}:x:{UID}:\n"),
        ):
            target = etc / name
            if not target.exists():
                shutil.copy(f"/etc/{name}", target)
            with open(target, "a") as f:
                f.write(line)


def installed() -> bool:
    """Whether this machine has Slurm's daemons, its client and munge."""
    return all(shutil.which(p) for p in ("slurmctld", "slurmd", "sinfo", "munged"))
