"""The application context: what the workers and every edge (services, api, proxy, sshd, ui) share --
the settings, the database, the backends, the apply policies, the process's telemetry and the wake-up events.

A neutral module: the workers and the edges import it, and it imports neither. Its fields are declared;
nothing attaches attributes to it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, get_args

import orjson

from corral.backends.base import Compute
from corral.backends.slurm.registry import SlurmRegistry
from corral.diskspace import database_label, is_disk_full
from corral.diskspace.episode import Episode
from corral.domain.access import backend_types, usable_computes
from corral.domain.records import InstanceRec
from corral.domain.telemetry import Telemetry
from corral.policies.rest import RestPolicy
from corral.scheduler import offer_filters
from corral.scheduler.preemption import Settings as PreemptionSettings
from corral.scheduler.types import Offer
from corral.settings import Settings
from corral.store.db import Database
from corral.store.encryption import Cipher, cipher_for, open_sealed

#: The workers that run a pass when woken (``workers.runtime``), by name.
WorkerName = Literal["scheduler", "instances", "jobs", "runs", "triggers", "volumes", "gateways"]
#: Every name that can be woken: a worker's, or a topic its listeners follow (:meth:`Wakeups.listen`):
#: ``access`` (users, tokens, projects or members changed: cached authorisations go), ``logs`` (a job's output
#: was stored: the UI's log tails read it) and ``services`` (a service's runs or replicas changed: the proxy's
#: routes and the autoscaler).
WakeUp = Literal[WorkerName, "access", "logs", "services"]
WORKERS: tuple[WorkerName, ...] = get_args(WorkerName)
_WAKE_UPS: dict[str, WakeUp] = {name: name for name in get_args(WakeUp)}


class Wakeups:
    """Wake-ups: a service or worker that changed something wakes whoever acts on it -- in this process
    at once, and on Postgres in every other replica too (``remote``, a LISTEN/NOTIFY channel)."""

    def __init__(self) -> None:
        self._events = {name: asyncio.Event() for name in WORKERS}
        self._listeners: dict[WakeUp, list[Callable[[], None]]] = {}
        self.remote: Callable[[tuple[WakeUp, ...]], None] | None = None
        #: Workers whose next pass must be a whole one (woken without a scope; all of them at first).
        self._whole: set[WorkerName] = set(WORKERS)
        #: Worker -> what its next pass is scoped to (``wake_for``), unless it must be a whole pass.
        self._scoped: dict[WorkerName, set[str]] = {}

    def listen(self, name: WakeUp, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever ``name`` is woken, here or in another replica (e.g. ``access``: users,
        tokens, projects or members changed, so cached authorisations must go)."""
        self._listeners.setdefault(name, []).append(callback)

    def wake(self, *names: WakeUp) -> None:
        chosen = names or WORKERS
        self.wake_local(*chosen)
        if self.remote is not None:
            self.remote(tuple(chosen))

    def wake_local(self, *names: WakeUp) -> None:
        for name in names or WORKERS:
            if name in self._events:
                self._whole.add(name)
                self._events[name].set()
            for callback in self._listeners.get(name, ()):
                callback()

    def wake_remote(self, names: Iterable[str]) -> None:
        """Wake, in this process, the names another replica woke (as its NOTIFY carried them; a name this
        version does not know is ignored)."""
        self.wake_local(*(_WAKE_UPS[n] for n in names if n in _WAKE_UPS))

    def wake_for(self, name: WorkerName, keys: Iterable[str]) -> None:
        """Wake worker ``name`` in this process for ``keys`` only (the runs worker: the runs whose jobs this
        process just changed), so that its pass reads those instead of everything it watches. Other replicas
        are not woken: this one's pass settles them (and every replica makes a whole pass on its interval)."""
        self._scoped.setdefault(name, set()).update(keys)
        self._events[name].set()
        for callback in self._listeners.get(name, ()):
            callback()

    def make_whole(self, name: WorkerName) -> None:
        """Worker ``name``'s next pass covers everything (its safety-net pass)."""
        self._whole.add(name)

    def take(self, name: WorkerName) -> frozenset[str] | None:
        """What worker ``name``'s pass, starting now, must cover: the keys it was woken for since its last
        pass, or None for everything -- it was also woken without a scope, it is its first pass, or nothing
        woke it (a pass run directly)."""
        keys = self._scoped.pop(name, None)
        whole = name in self._whole
        self._whole.discard(name)
        return None if whole or not keys else frozenset(keys)

    def event(self, name: WorkerName) -> asyncio.Event:
        return self._events[name]


K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


class LRU(Generic[K, V]):
    """At most ``size`` entries; the least recently used one goes first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._d: OrderedDict[K, V] = OrderedDict()

    def __contains__(self, key: K) -> bool:
        return key in self._d

    def get(self, key: K) -> V | None:
        value = self._d.get(key)
        if value is not None:
            self._d.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._d[key] = value
        if len(self._d) > self.size:
            self._d.popitem(last=False)


@dataclass(eq=False)  # one object per server: compared and hashed by identity
class Context:
    """What the workers and the edges of one server process share. Every field is declared here; what only
    one part uses lives with that part (the UI's live streams: ``ui.live.LiveFeeds``; a plan's snapshot
    builder: ``services.plan_verdict``)."""

    settings: Settings
    db: Database
    computes: dict[str, Compute]
    wakeups: Wakeups = field(default_factory=Wakeups)
    #: The server ``config.yml``'s ``default_permissions.allow_managers_manage_secrets`` (dstack's default: off).
    managers_manage_secrets: bool = False
    #: Who this server process is, as the owner of the leases it takes.
    replica_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}")
    #: Starts the SSH endpoint of jobs on first use and says where the CLI reaches it (host name, port);
    #: None where no endpoint is wired (some tests).
    ssh_endpoint: Callable[[], Awaitable[tuple[str, int]]] | None = None
    #: Closes the SSH endpoint (if it was started) and its connections, at shutdown.
    ssh_endpoint_close: Callable[[], Awaitable[None]] | None = None
    #: This process's counters and histograms (``GET /metrics``).
    telemetry: Telemetry = field(default_factory=Telemetry)
    #: The background work whose writes fail for lack of space now: said once per episode, retried until space
    #: returns (``diskspace.episode``).
    disk_full: Episode = field(default_factory=Episode)
    #: The Slurm clusters of the projects' ``slurm`` backends (``services.slurm_backends`` sets them).
    slurm: SlurmRegistry = field(default_factory=SlurmRegistry)
    #: The apply policies of ``config.yml``'s ``plugins``, asked in turn before a run, fleet or volume is applied
    #: (none: applies are not put to any).
    policies: tuple[RestPolicy, ...] = ()
    #: ``config.yml``'s ``scheduling.preemption`` (off unless it says otherwise).
    preemption: PreemptionSettings = field(default_factory=PreemptionSettings)
    #: Job id -> (token, expiry) of the lease the scheduler's commit took for this replica on a job it placed
    #: on a ready instance: the jobs worker adopts it and starts the job without claiming it again.
    placed_leases: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: Finished runs as ``runs/list`` rendered them (``services.runs``), by (run id, status, last processed at,
    #: the listing's shape): a run that cannot change any more is read and serialized once.
    rendered_runs: LRU[tuple[object, ...], orjson.Fragment] = field(default_factory=lambda: LRU(5000))

    def hand_over(self, leased: Mapping[str, str], until: float) -> None:
        """Jobs this replica's scheduler placed and leased (job id -> lease token, valid until ``until``): this
        process's jobs worker starts them at once, without claiming them again (other replicas are not woken)."""
        if leased:
            self.placed_leases.update((job_id, (token, until)) for job_id, token in leased.items())
            self.wakeups.wake_for("jobs", leased)

    def lacked_space(self, who: str, exc: BaseException) -> bool:
        """Whether ``exc``, which ``who`` (``the probes pass``) failed with, is a write that failed for lack of
        space: if so it is said once per episode (``diskspace.episode``), and the caller says nothing more (no
        traceback); else the caller logs it as any other error."""
        if not is_disk_full(exc):
            return False
        self.disk_full.failed(who, exc, self.settings.server_dir, database_label(self.db.url))
        return True

    def went_through(self, who: str) -> None:
        """``who`` ran through: every worker is woken if it had failed for lack of space (space returned)."""
        if self.disk_full.succeeded(who):
            self.wakeups.wake()

    async def until_it_fits(self, who: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` (a write of ``who``: ``the follower of job-0``), tried again after a short backoff while it
        fails for lack of space, said once per episode; every worker is woken when it goes through after such a
        failure (space returned). See ``diskspace.episode``."""
        where = self.settings.server_dir, database_label(self.db.url)
        return await self.disk_full.until_it_fits(who, attempt, *where, on_return=self.wakeups.wake)

    def cipher(self) -> Cipher:
        """The server's cipher (tokens, private keys and credentials at rest)."""
        return cipher_for(self.settings)

    def reveal(self, stored: str) -> str:
        """A value as stored (sealed, or in clear in a row from before) in clear."""
        return open_sealed(self.cipher, stored)

    def compute(self, backend: str) -> Compute:
        return self.computes[backend]

    def project_computes(self, project_backends: frozenset[str]) -> list[Compute]:
        """The computes whose offers a project's fleets and runs may use: only those its backends name (the
        local backend belongs to the projects the server's ``config.yml`` names, ``main`` by default)."""
        return [self.computes[name] for name in usable_computes(self.computes, project_backends)]

    def project_offers(self, backends: Iterable[Mapping[str, Any]]) -> list[Offer]:
        """The offers of a project's stored ``backends``: its computes', in the regions each names."""
        stored = list(backends)
        offers = (o for c in self.project_computes(backend_types(stored)) for o in c.offers())
        return offer_filters.in_project_regions(offers, offer_filters.project_regions(stored))

    def agent_url(self, inst: InstanceRec) -> str:
        """Where ``inst``'s agent answers now, as its backend says (an SSH host: the local end of a tunnel)."""
        compute = self.computes.get(inst.backend)
        if compute is None:
            return str((inst.agent or {}).get("url") or "")
        return compute.agent_url(inst)
