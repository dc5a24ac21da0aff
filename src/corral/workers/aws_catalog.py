"""The AWS catalogue refresher: while some project has the AWS backend configured and
``CORRAL_AWS_LIVE_CATALOG`` is on (and no ``CORRAL_AWS_CATALOG``), it fetches gpuhunt's published AWS
catalogue when the cached one is a day old or missing (``backends.aws.live_catalog.fetch``, in a thread:
start-up and requests never wait for it) and has the backend price offers from it. A failed fetch changes
nothing -- the backend keeps the cached catalogue, or the shipped snapshot -- is logged, and is tried again
an hour later. Each change of catalogue is logged with its source and date. A server where no project uses
AWS never fetches anything (no request leaves a machine that does not use the cloud).

Imports ``backends.aws``, the workers' context and ``store.project_state``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, cast

from corral.backends.aws import live_catalog
from corral.context import Context
from corral.store import project_state

if TYPE_CHECKING:
    from corral.backends.aws.compute import AWSCompute

log = logging.getLogger("corral.aws")

#: Seconds between two checks of whether a fetch is due.
CHECK_INTERVAL = 300.0


class AWSCatalogRefresher:
    def __init__(self, ctx: Context, check_interval: float = CHECK_INTERVAL) -> None:
        self.ctx = ctx
        self.check_interval = check_interval
        self._failed_at: float | None = None
        self._announced = False
        self._stopping = asyncio.Event()

    def _compute(self) -> AWSCompute | None:
        s = self.ctx.settings
        if s.aws_live_catalog is None or s.aws_catalog is not None:
            return None
        return cast("AWSCompute | None", self.ctx.computes.get("aws"))

    async def pass_once(self, now: float | None = None) -> bool:
        """Fetch when due; whether the backend now prices from a newly fetched catalogue."""
        compute = self._compute()
        if compute is None:
            return False
        now = time.time() if now is None else now
        directory = live_catalog.cache_dir(self.ctx.settings.server_dir)
        meta = await asyncio.to_thread(live_catalog.read_meta, directory)
        if not self._announced:
            self._announced = True
            log.info("AWS prices: %s", compute.catalog_info().label)
        if not live_catalog.due(meta, now):
            return False
        if self._failed_at is not None and now - self._failed_at < live_catalog.RETRY_AFTER:
            return False
        if not await self._aws_in_use():
            return False
        url = self.ctx.settings.aws_live_catalog
        assert url is not None
        try:
            fetched = await asyncio.to_thread(live_catalog.fetch, url, directory, now)
        except live_catalog.FetchError as e:
            self._failed_at = now
            info = compute.catalog_info()
            log.warning("AWS catalogue: cannot fetch gpuhunt's catalogue (%s); AWS prices stay: %s", e, info.label)
            return False
        self._failed_at = None
        changed = meta is None or fetched.version != meta.version or fetched.url != meta.url
        if changed or compute.catalog_info() != fetched.info:
            info = compute.reload_catalog()
            log.info("AWS prices: %s", info.label)
        return changed

    async def _aws_in_use(self) -> bool:
        async with self.ctx.db.read() as conn:
            return any("aws" in types for types in (await project_state.backends_by_project(conn)).values())

    async def run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.pass_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("refreshing the AWS catalogue failed")
            try:
                await asyncio.wait_for(self._stopping.wait(), self.check_interval)
            except asyncio.TimeoutError:
                pass

    def stop(self) -> None:
        self._stopping.set()
