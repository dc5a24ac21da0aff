"""The Slurm clusters of every project's ``slurm`` backend, by project and cluster name, and their offers.

A project's clusters are set when its backend is configured (``config.yml`` at start, the backends API later) and
replaced whole when it changes; two projects may name a cluster alike only when it is the same login node and user.
Offers come from each cluster's last ``sinfo`` pass (:meth:`SlurmCluster.snapshot`, shared with provisioning);
reading them starts a new pass in the background when the last is older than ``refresh_every`` (a drained node is
gone from the offers one pass later), and a cluster whose last pass is older than ``stale_after`` (unreachable)
offers nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Sequence

from corral.backends.base import ProvisioningError
from corral.backends.slurm.batch import SiteOptions
from corral.backends.slurm.cluster import MIN_INTERVAL, SlurmCluster
from corral.backends.slurm.offers import node_offers
from corral.scheduler.types import Offer

log = logging.getLogger("corral.slurm")

STALE_AFTER = 300.0


def _identity(cluster: SlurmCluster) -> tuple[str, str, int, str]:
    c = cluster.config
    return (c.name, c.hostname, c.port, c.user)


class SlurmRegistry:
    def __init__(self, refresh_every: float = MIN_INTERVAL, stale_after: float = STALE_AFTER) -> None:
        self.refresh_every = refresh_every
        self.stale_after = stale_after
        #: project -> cluster name -> cluster
        self._projects: dict[str, dict[str, SlurmCluster]] = {}
        self._passes: dict[int, asyncio.Task[object]] = {}

    # ---- configuration -------------------------------------------------------------------------
    def conflict(self, project: str, cluster: SlurmCluster) -> str | None:
        """Why ``cluster`` cannot join ``project``: another project has a cluster of that name elsewhere."""
        for other, clusters in self._projects.items():
            known = clusters.get(cluster.name)
            if other != project and known is not None and _identity(known) != _identity(cluster):
                return (
                    f"project {other} has a cluster named {cluster.name} with another login node or user: "
                    "a cluster's name is its region on this server, name this one differently"
                )
        return None

    def set_project(self, project: str, clusters: Sequence[SlurmCluster]) -> list[SlurmCluster]:
        """``project``'s clusters are now ``clusters`` (none: it has no slurm backend). Returns the ones they
        replace, for the caller to close."""
        before = self._projects.pop(project, {})
        if clusters:
            self._projects[project] = {c.name: c for c in clusters}
        return [c for c in before.values() if all(c is not n for n in clusters)]

    # ---- what SlurmCompute asks ----------------------------------------------------------------
    async def get(self, project: str, cluster: str) -> tuple[SlurmCluster, SiteOptions]:
        found = self._projects.get(project, {}).get(cluster)
        if found is None:
            raise ProvisioningError(
                f"project {project} has no Slurm cluster named {cluster} (its slurm backend was changed)",
                "refused",
            )
        return found, found.config.site_options()

    def of(self, project: str) -> list[SlurmCluster]:
        """``project``'s clusters."""
        return list(self._projects.get(project, {}).values())

    async def all(self) -> Sequence[SlurmCluster]:
        return self.clusters()

    def clusters(self) -> list[SlurmCluster]:
        seen: dict[int, SlurmCluster] = {}
        for clusters in self._projects.values():
            for c in clusters.values():
                seen.setdefault(id(c), c)
        return list(seen.values())

    # ---- offers --------------------------------------------------------------------------------
    def offers(self) -> list[Offer]:
        now = time.monotonic()
        out: list[Offer] = []
        for cluster in self.clusters():
            snap = cluster.last_snapshot()
            if snap is None or now - snap.taken_at > self.refresh_every:
                self._refresh(cluster)
            if snap is not None and now - snap.taken_at <= self.stale_after:
                out.extend(node_offers(cluster.config, snap))
        return out

    def _refresh(self, cluster: SlurmCluster) -> None:
        """Start a pass of ``cluster`` in the background (one at a time), when there is an event loop."""
        running = self._passes.get(id(cluster))
        if running is not None and not running.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task: asyncio.Task[object] = loop.create_task(cluster.snapshot(self.refresh_every))
        task.add_done_callback(functools.partial(_log_failure, cluster.name))
        self._passes[id(cluster)] = task

    async def aclose(self) -> None:
        for task in self._passes.values():
            task.cancel()
        for task in self._passes.values():
            with contextlib.suppress(BaseException):
                await task
        for cluster in self.clusters():
            await cluster.aclose()
        self._projects.clear()


def _log_failure(name: str, task: asyncio.Task[object]) -> None:
    if task.cancelled():
        return
    e = task.exception()
    if e is not None:
        log.warning("slurm cluster %s: %s", name, e, extra={"event": "slurm_poll_failed", "cluster": name})
