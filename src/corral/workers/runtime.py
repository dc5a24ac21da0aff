"""Starts and stops the workers. Each loop runs when woken and on the safety-net interval; a pass that failed is
tried again, whole, after a short backoff, and every worker is woken when space returns after a full disk."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from corral import diskspace
from corral.context import Context, WorkerName
from corral.diskspace import episode
from corral.store.notify import PgNotifier
from corral.workers.gateways import Gateways
from corral.workers.hosts import Hosts
from corral.workers.instances import Instances
from corral.workers.jobs.driver import Jobs
from corral.workers.metrics_retention import MetricsRetention
from corral.workers.probes import Probes
from corral.workers.runs import Runs
from corral.workers.scheduling import Scheduling
from corral.workers.service_scaling import ServiceScaling
from corral.workers.triggers import Triggers
from corral.workers.volumes import Volumes

if TYPE_CHECKING:
    from corral.workers.aws_catalog import AWSCatalogRefresher

log = logging.getLogger("corral.workers")

#: Seconds after the workers start (the end of start-up) before their first passes, and before ``warm_up``.
FIRST_PASS_DELAY = 0.2
WARM_UP_DELAY = 0.5
#: Seconds between two looks at the state directory's free space (``Workers._watch_space``).
SPACE_CHECK = 1.0


def warm_up() -> None:
    """What start-up leaves for later, done now in a thread so that no request waits for it: build the
    configuration and request models. cryptography is not imported here: its AES-GCM alone is about 7 MiB
    of resident memory, which an idle server does not keep; the first seal or open imports it
    (``store/encryption.py``)."""
    from corral.config.parsing import warm_up as configuration
    from corral.schemas.requests import warm_up as requests

    configuration()
    requests()


async def run_passes(
    ctx: Context, name: WorkerName, fn: Callable[[], Awaitable[object]], stopping: Callable[[], bool]
) -> None:
    """Worker ``name``'s passes (``fn``), when woken and (whole) on the safety-net interval, until ``stopping()``. A
    pass that failed is tried again, whole, so that what it was woken for (``Wakeups.wake_for``) is not lost, after
    0.5 s doubling to 5 s (sooner when woken meanwhile) until one goes through."""
    event = ctx.wakeups.event(name)
    interval = ctx.settings.safety_net_interval
    failures = 0
    while not stopping():
        if failures:
            await _back_off(event, episode.retry_delay(failures))
            ctx.wakeups.make_whole(name)
        else:
            try:
                await asyncio.wait_for(event.wait(), timeout=interval)
            except asyncio.TimeoutError:
                ctx.wakeups.make_whole(name)  # the safety net's pass is a whole one
        event.clear()
        failures = 0 if await _pass(ctx, name, fn) else failures + 1


async def _back_off(event: asyncio.Event, delay: float) -> None:
    """Wait ``delay`` seconds after a failed pass, or less when the worker is woken (at least the first step)."""
    await asyncio.sleep(episode.RETRY_FIRST)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=max(0.0, delay - episode.RETRY_FIRST))


async def _pass(ctx: Context, name: WorkerName, fn: Callable[[], Awaitable[object]]) -> bool:
    """One pass of worker ``name``: whether it went through. One that failed for lack of space is said once per
    episode (``diskspace.episode``), in one line; any other failure with its traceback. The first pass to go
    through after a lack of space wakes every worker: space returned."""
    who = f"the {name} pass"
    try:
        await fn()
    except asyncio.CancelledError:
        raise
    except Exception as e:
        if not ctx.lacked_space(who, e):
            log.exception("%s pass failed", name)
        return False
    ctx.went_through(who)
    return True


class Workers:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.scheduling = Scheduling(ctx)
        self.instances = Instances(ctx)
        self.jobs = Jobs(ctx)
        self.runs = Runs(ctx)
        self.triggers = Triggers(ctx)
        self.volumes = Volumes(ctx)
        self.gateways = Gateways(ctx)
        self.hosts = Hosts(ctx)
        self.probes = Probes(ctx)
        self.service_scaling = ServiceScaling(ctx)
        self.metrics_retention = MetricsRetention(ctx)
        #: Made at start when the AWS backend prices from gpuhunt's published catalogue (imported then).
        self.aws_catalog: AWSCatalogRefresher | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._notifier: PgNotifier | None = None
        self._stopping = False
        self._first_passes: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        if not self.ctx.db.is_sqlite:
            from corral.store.notify import PgNotifier

            self._notifier = PgNotifier(self.ctx.db.url, self.ctx.replica_id, self.ctx.wakeups.wake_remote)
            await self._notifier.start()
            self.ctx.wakeups.remote = self._notifier.notify
        await self.instances.recover()
        self._tasks.append(asyncio.create_task(self._warm_up_later(), name="corral-warm-up"))
        loops: dict[WorkerName, Callable[[], Awaitable[object]]] = {
            "scheduler": self.scheduling.pass_once,
            "instances": self.instances.pass_once,
            "jobs": self.jobs.pass_once,
            "runs": self.runs.pass_once,
            "triggers": self.triggers.pass_once,
            "volumes": self.volumes.pass_once,
            "gateways": self.gateways.pass_once,
        }
        for name, fn in loops.items():
            task = run_passes(self.ctx, name, fn, lambda: self._stopping)
            self._tasks.append(asyncio.create_task(task, name=f"corral-{name}"))
        self._tasks.append(asyncio.create_task(self._watch_space(), name="corral-disk-space"))
        self._tasks.append(asyncio.create_task(self.hosts.run(), name="corral-hosts"))  # on its own interval
        self._tasks.append(asyncio.create_task(self.probes.run(), name="corral-probes"))  # service replicas
        self._tasks.append(asyncio.create_task(self.service_scaling.run(), name="corral-service-scaling"))
        self._tasks.append(asyncio.create_task(self.metrics_retention.run(), name="corral-metrics-retention"))
        if "aws" in self.ctx.computes and self.ctx.settings.aws_live_catalog:  # fetches in a thread, daily at most
            from corral.workers.aws_catalog import AWSCatalogRefresher

            self.aws_catalog = AWSCatalogRefresher(self.ctx)
            self._tasks.append(asyncio.create_task(self._aws_catalog_later(), name="corral-aws-catalog"))
        # The first passes (they pick up whatever the last server left) once start-up is over: run at once, they
        # would share the loop and the GIL with the end of start-up and the first requests.
        self._first_passes = asyncio.get_running_loop().call_later(FIRST_PASS_DELAY, self.ctx.wakeups.wake)

    async def _warm_up_later(self) -> None:
        """``warm_up`` in a thread, once the server is serving: started at once, it would hold the GIL against the
        rest of start-up and the first requests (measured: about 0.1 s of CPU before the first answer)."""
        await asyncio.sleep(WARM_UP_DELAY)
        await asyncio.to_thread(warm_up)

    async def _aws_catalog_later(self) -> None:
        """The AWS catalogue refresher, once start-up is over (as ``warm_up``)."""
        await asyncio.sleep(WARM_UP_DELAY)
        if self.aws_catalog is not None:
            await self.aws_catalog.run()

    async def _watch_space(self) -> None:
        """Every worker is woken when the state directory's free space rises back above the watermark
        (``CORRAL_MIN_FREE_DISK_MB``): what waited for space (a job's output, a pass or a follower that failed to
        write) resumes at once, not at its next retry or wake-up. A ``statvfs`` every second, a few microseconds."""
        settings = self.ctx.settings
        if not settings.min_free_disk:
            return
        low = False
        while not self._stopping:
            await asyncio.sleep(SPACE_CHECK)
            try:
                below = diskspace.below_watermark(settings.server_dir, settings.min_free_disk)
            except OSError:  # the directory cannot be measured now (gone, or its disk gone): looked at again later
                continue
            was_low, low = low, below is not None
            if was_low and not low:
                log.info(
                    "the state directory %s has %s free again (CORRAL_MIN_FREE_DISK_MB: %s): every worker is woken",
                    settings.server_dir,
                    diskspace.mib(diskspace.space(settings.server_dir).free),
                    diskspace.mib(settings.min_free_disk),
                    extra={"event": "disk_ok"},
                )
                self.ctx.disk_full.space_returned()
                self.ctx.wakeups.wake_local()

    async def stop(self) -> None:
        self._stopping = True
        self.probes.stop()
        self.service_scaling.stop()
        self.triggers.stop()
        self.metrics_retention.stop()
        if self.aws_catalog is not None:
            self.aws_catalog.stop()
        if self._first_passes is not None:
            self._first_passes.cancel()
        if self._notifier is not None:
            self.ctx.wakeups.remote = None
            await self._notifier.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.jobs.stop_all()
        if self.ctx.ssh_endpoint_close is not None:
            await self.ctx.ssh_endpoint_close()
        await self.hosts.stop()
        await self.gateways.close()
        await self.instances.drain()
        for compute in self.ctx.computes.values():
            await compute.aclose()
