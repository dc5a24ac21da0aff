"""Starts and stops the workers. Each loop runs when woken and on the safety-net interval."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from corral.context import Context, WorkerName
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


def warm_up() -> None:
    """What start-up leaves for later, done now in a thread so that no request waits for it: build the
    configuration and request models. cryptography is not imported here: its AES-GCM alone is about 7 MiB
    of resident memory, which an idle server does not keep; the first seal or open imports it
    (``store/encryption.py``)."""
    from corral.config.parsing import warm_up as configuration
    from corral.schemas.requests import warm_up as requests

    configuration()
    requests()


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
            self._tasks.append(asyncio.create_task(self._loop(name, fn), name=f"corral-{name}"))
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

    async def _loop(self, name: WorkerName, fn: Callable[[], Awaitable[object]]) -> None:
        event = self.ctx.wakeups.event(name)
        interval = self.ctx.settings.safety_net_interval
        while not self._stopping:
            try:
                await asyncio.wait_for(event.wait(), timeout=interval)
            except asyncio.TimeoutError:
                self.ctx.wakeups.make_whole(name)  # the safety net's pass is a whole one
            event.clear()
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s pass failed", name)
                await asyncio.sleep(0.5)

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
