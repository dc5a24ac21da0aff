"""One Slurm cluster as the server reaches it: one SSH connection to its login node (``backends.ssh_conn.HostLink``:
made on first use, reused by every command and channel, made again after it drops), commands run in a login shell
(``bash -lc``: the site's ``module``/profile setup applies; a banner or MOTD is cut off), and the cluster's state
as one pass of ``sinfo`` and ``squeue`` that every caller shares.

Polling is bounded: a pass runs at most every ``min_interval`` seconds (2 s) however many callers ask, callers
asking while one runs share it, and ``scontrol show -o node`` runs at most once a minute unless asked for.
:meth:`SlurmCluster.calls_per_minute` counts the commands run in the last minute, by name.

:func:`check_cluster` is the check made when a backend is configured: the login node reached with the key,
``scontrol ping`` answered, the partitions the configuration names present; each failure names its field. It also
looks for the cluster's container runtimes (:meth:`SlurmCluster.detect_runtimes`: Pyxis, Apptainer, Singularity),
which plans of runs with an ``image`` name.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.backends.slurm import parse
from corral.backends.slurm.model import SlurmClusterConfig
from corral.backends.ssh_conn import HostLink, SshError, SshTarget

#: Printed (to stdout and stderr) before each command: what a login shell prints before it is cut off.
BOUNDARY = "--corral-slurm-begin--"
_SEPARATOR = "--corral-slurm-squeue--"
CONNECT_TIMEOUT = 10.0
#: The shortest time between two passes of ``sinfo``/``squeue`` (one per cluster, whoever asks).
MIN_INTERVAL = 2.0
#: Commands run at once on the connection: OpenSSH's sshd allows 10 sessions per connection (``MaxSessions``,
#: sshd_config(5)) and counts a finished command's session until its close is through, so 8 at a time was refused
#: ("Session request failed") under load on the test cluster; the channels to agents are not sessions.
MAX_SESSIONS = 4
#: Tries of a command whose session the login node refused.
SESSION_TRIES = 8
#: ``scontrol show -o node`` is asked at most this often unless a caller asks for fresher.
DETAILS_MAX_AGE = 60.0


class SlurmError(Exception):
    """A Slurm command failed or the cluster could not be reached; the message says which and why."""


class SlurmConfigError(SlurmError):
    """A cluster's configuration does not work; the message starts with the field (``clusters[0].hostname``)."""


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str


def _after_boundary(data: bytes | str | None) -> str:
    text = data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
    head, sep, rest = text.partition(BOUNDARY + "\n")
    return rest if sep else head


async def _no_agent_port(link: HostLink) -> int:
    raise SshError(f"{link.target.label()}: a login node runs no agent")


class SlurmCluster:
    def __init__(
        self,
        config: SlurmClusterConfig,
        key_pem: str,
        connect_timeout: float = CONNECT_TIMEOUT,
        min_interval: float = MIN_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.connect_timeout = connect_timeout
        self.min_interval = min_interval
        self._clock = clock
        target = SshTarget(config.hostname, config.port, config.user, key_pem)
        self._link = HostLink(target, connect_timeout, _no_agent_port, open_key=lambda key: key)
        self._snapshot: parse.ClusterSnapshot | None = None
        self._pass: asyncio.Future[parse.ClusterSnapshot] | None = None
        self._details: tuple[float, tuple[parse.NodeDetail, ...]] | None = None
        self._calls: dict[str, deque[float]] = {}
        self._sessions = asyncio.Semaphore(MAX_SESSIONS)
        #: The container runtimes found (``parse.RUNTIMES``); None: not looked for yet, or the login node did not say.
        self.runtimes: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        return self.config.name

    # ---- commands ------------------------------------------------------------------------------
    def _count(self, *names: str) -> None:
        now = self._clock()
        for name in names:
            self._calls.setdefault(name, deque()).append(now)

    def calls_per_minute(self) -> dict[str, float]:
        """Commands run on the login node in the last minute, by name (``sinfo``, ``squeue``, ``sbatch``...)."""
        since = self._clock() - 60.0
        out = {}
        for name, times in self._calls.items():
            while times and times[0] < since:
                times.popleft()
            out[name] = float(len(times))
        return out

    async def run(self, cmd: str, input: str | None = None, timeout: float = 30) -> CommandResult:
        """``cmd`` in a login shell of the cluster user on the login node. Raises :class:`SshError` when the
        login node cannot be reached; a failing command is a result with its exit status."""
        self._count(cmd.split(maxsplit=1)[0] if cmd.strip() else "")
        return await self._run(cmd, input, timeout)

    async def _run(self, cmd: str, input: str | None, timeout: float) -> CommandResult:
        script = f"echo {BOUNDARY}; echo {BOUNDARY} >&2; {cmd}"
        for attempt in range(SESSION_TRIES):
            try:
                async with self._sessions:  # sshd refuses sessions past MaxSessions
                    res: Any = await self._link.run(f"bash -lc {shlex.quote(script)}", input=input, timeout=timeout)
                break
            except SshError as e:  # a refused session: the ones closing are counted a moment longer
                if not e.session_refused or attempt == SESSION_TRIES - 1:
                    raise
                await asyncio.sleep(0.1 * (attempt + 1))
        status = res.exit_status if res.exit_status is not None else -1
        return CommandResult(status, _after_boundary(res.stdout), _after_boundary(res.stderr))

    async def open_connection(self, host: str, port: int) -> tuple[Any, Any]:
        """``(reader, writer)`` of a direct-tcpip channel from the login node to ``host:port`` (a node's agent);
        ``OSError`` when nothing answers there."""
        import asyncssh

        conn = await self._link.connection()
        try:
            return await conn.open_connection(host, port)
        except asyncssh.ChannelOpenError as e:
            raise OSError(f"{self.name}: {host}:{port} cannot be reached from the login node: {e.reason}") from None

    # ---- the polled state ----------------------------------------------------------------------
    async def snapshot(self, max_age: float = MIN_INTERVAL) -> parse.ClusterSnapshot:
        """The cluster as a pass of ``sinfo`` and ``squeue`` saw it at most ``max_age`` seconds ago (never less
        than ``min_interval``: a pass runs at most that often, and concurrent callers share one)."""
        max_age = max(max_age, self.min_interval)
        snap = self._snapshot
        if snap is not None and self._clock() - snap.taken_at <= max_age:
            return snap
        if self._pass is None or self._pass.done():
            self._pass = asyncio.ensure_future(self._take_snapshot())
            self._pass.add_done_callback(_retrieve)
        return await asyncio.shield(self._pass)

    def last_snapshot(self) -> parse.ClusterSnapshot | None:
        """The last pass's snapshot (None before the first), without running one."""
        return self._snapshot

    async def _take_snapshot(self) -> parse.ClusterSnapshot:
        taken_at = self._clock()
        self._count("sinfo", "squeue")
        user = shlex.quote(self.config.user)
        res = await self._run(
            f"sinfo -h -N -o '{parse.SINFO_FORMAT}' && echo {_SEPARATOR} && "
            f"squeue -h -u {user} -t all -o '{parse.SQUEUE_FORMAT}'",
            None,
            30,
        )
        if res.exit_status != 0:
            raise SlurmError(f"{self.name}: sinfo/squeue failed: {(res.stderr or res.stdout).strip()}")
        sinfo, _, squeue = res.stdout.partition(_SEPARATOR + "\n")
        nodes, partitions = parse.parse_sinfo(sinfo)
        snap = parse.ClusterSnapshot(taken_at, nodes, partitions, parse.parse_squeue(squeue))
        self._snapshot = snap
        return snap

    async def detect_runtimes(self) -> tuple[str, ...] | None:
        """Look for the cluster's container runtimes on the login node (``parse.RUNTIME_PROBE``); kept in
        :attr:`runtimes`. None when the login node cannot be asked (it is asked again next time)."""
        try:
            res = await self.run(parse.RUNTIME_PROBE)
        except SshError:
            return self.runtimes
        if res.exit_status == 0:
            self.runtimes = parse.parse_runtimes(res.stdout)
        return self.runtimes

    async def node_details(self, max_age: float = DETAILS_MAX_AGE) -> tuple[parse.NodeDetail, ...]:
        """``scontrol show -o node``, asked at most every ``max_age`` seconds."""
        if self._details is not None and self._clock() - self._details[0] <= max_age:
            return self._details[1]
        taken_at = self._clock()
        res = await self.run("scontrol show -o node")
        if res.exit_status != 0:
            raise SlurmError(f"{self.name}: scontrol show node failed: {(res.stderr or res.stdout).strip()}")
        details = parse.parse_scontrol_nodes(res.stdout)
        self._details = (taken_at, details)
        return details

    async def aclose(self) -> None:
        await self._link.close()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a shared pass's failure as seen (its callers may all have gone)."""
    if not future.cancelled():
        future.exception()


async def check_cluster(cluster: SlurmCluster, where: str) -> parse.ClusterSnapshot:
    """What configuring ``cluster`` checks (``where``: its field, ``clusters[0]``): the login node answers and takes
    the key, ``scontrol ping`` says the controller is up, every partition the configuration names exists.
    Returns the first snapshot; raises :class:`SlurmConfigError` naming the field."""
    config = cluster.config
    try:
        ping = await cluster.run("scontrol ping", timeout=cluster.connect_timeout + 20)
    except SshError as e:
        if e.permanent:
            raise SlurmConfigError(
                f"{where}.private_key: the login node {config.hostname}:{config.port} did not accept the key for "
                f"user {config.user!r} ({e}): give the private key whose public key is in that user's "
                "~/.ssh/authorized_keys"
            ) from None
        raise SlurmConfigError(
            f"{where}.hostname: cannot reach the login node {config.hostname}:{config.port} over SSH ({e}): "
            "check hostname and port"
        ) from None
    if ping.exit_status != 0:
        said = (ping.stdout + ping.stderr).strip() or f"exit status {ping.exit_status}"
        raise SlurmConfigError(
            f"{where}: `scontrol ping` on the login node failed: {said}: the Slurm controller must answer "
            "the cluster user's commands there"
        )
    try:
        snap = await cluster.snapshot(0)
    except (SlurmError, ValueError) as e:
        raise SlurmConfigError(f"{where}: sinfo/squeue on the login node failed: {e}") from None
    known = [p.name for p in snap.partitions]
    for j, group in enumerate(config.gpu_partitions):
        for p in group.partitions:
            if p not in known:
                raise SlurmConfigError(_unknown(f"{where}.gpu_partitions[{j}].partitions", p, config.name, known))
    for p in config.cpu_partitions or ():
        if p not in known:
            raise SlurmConfigError(_unknown(f"{where}.cpu_partitions", p, config.name, known))
    await cluster.detect_runtimes()
    return snap


def _unknown(field: str, partition: str, cluster: str, known: list[str]) -> str:
    return f"{field}: cluster {cluster} has no partition {partition!r} (its partitions: {', '.join(known) or 'none'})"
