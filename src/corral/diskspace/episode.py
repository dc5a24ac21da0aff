"""A full disk's episode for the server's background work (the workers' passes, the jobs' followers): from the
first write that fails for lack of space to the first one that fits again.

An episode is said once in the server's log, one line naming what is full (the state directory and its free
space, or the database), not once per retry and without a traceback; what failed is tried again after a short
backoff (:func:`retry_delay`) until it succeeds, and the first success ends the episode (space returned: the
caller wakes every worker, so that what waited for space resumes at once).

May import: the standard library and :mod:`corral.diskspace`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from corral.diskspace import is_disk_full, where_full

T = TypeVar("T")

log = logging.getLogger("corral.workers")

#: What failed for lack of space is tried again after this many seconds, doubling up to :data:`RETRY_MAX`.
RETRY_FIRST = 0.5
RETRY_MAX = 5.0


def retry_delay(failures: int) -> float:
    """Seconds to wait before the next try after ``failures`` failed ones in a row (at least one)."""
    return min(RETRY_MAX, RETRY_FIRST * 2.0 ** max(0, failures - 1))


class Episode:
    """Who has failed to write for lack of space since the episode began, and how many times in a row."""

    def __init__(self) -> None:
        self._failing: dict[str, int] = {}
        #: Set when the episode ends (then replaced): what waits to try again tries at once.
        self._ended = asyncio.Event()

    @property
    def open(self) -> bool:
        return bool(self._failing)

    def failed(self, who: str, exc: BaseException, state_dir: Path, database: str | None) -> float:
        """``who`` (``the runs pass``) failed to write for lack of space (``exc``): said in the log if it opens the
        episode; the seconds to wait before trying again."""
        if not self._failing:
            log.warning(
                "%s could not write, %s; what fails so is tried again (every %.1f s to %.0f s) until space returns",
                who,
                where_full(state_dir, exc, database),
                RETRY_FIRST,
                RETRY_MAX,
                extra={"event": "disk_full"},
            )
        failures = self._failing[who] = self._failing.get(who, 0) + 1
        return retry_delay(failures)

    def succeeded(self, who: str) -> bool:
        """``who`` wrote (or ran through) without a lack of space: whether that ends the episode (it had failed so),
        in which case the caller wakes every worker."""
        failures = self._failing.pop(who, None)
        if failures is None:
            return False
        log.info(
            "space returned: %s went through after %d failed tries; every worker is woken",
            who,
            failures,
            extra={"event": "disk_ok"},
        )
        self.space_returned()
        return True

    def forget(self, who: str) -> None:
        """``who`` ended without trying again (a follower whose job ended or went to another replica): the episode
        ends with the last of what failed, so that the next one is said again."""
        self._failing.pop(who, None)

    def space_returned(self) -> None:
        """Space returned (a write went through, or the state directory rose above the watermark): the episode
        ends, and whatever waits in :meth:`back_off` tries again now."""
        self._failing.clear()
        self._ended.set()
        self._ended = asyncio.Event()

    async def until_it_fits(
        self,
        who: str,
        attempt: Callable[[], Awaitable[T]],
        state_dir: Path,
        database: str | None,
        on_return: Callable[[], None],
    ) -> T:
        """``attempt()``, tried again after a short backoff for as long as it fails for lack of space (said as
        :meth:`failed` says it); ``on_return()`` (wake every worker) when it goes through after such a failure and
        that ends the episode. Any other error is raised."""
        while True:
            try:
                result = await attempt()
            except Exception as e:
                if not is_disk_full(e):
                    raise
                await self.back_off(self.failed(who, e, state_dir, database))
                continue
            if self.succeeded(who):
                on_return()
            return result

    async def back_off(self, delay: float) -> None:
        """Wait ``delay`` seconds before trying again, or less if space returns meanwhile."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._ended.wait(), timeout=delay)
