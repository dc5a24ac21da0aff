"""A call made once, a delay after the latest request for it, by one thread kept for it.

A job's end asks for the sandbox bridge's check a second later, and each later end moves that check on. A
``threading.Timer`` per request started (and cancelled) a thread per job; this keeps one thread, started on the
first request, that sleeps until the latest deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("corral.agent")


class LatestCall:
    """``fn()`` once, ``delay`` seconds after the latest :meth:`after` (none while :meth:`cancel` holds)."""

    def __init__(self, fn: Callable[[], None], name: str) -> None:
        self._fn = fn
        self._name = name
        self._cond = threading.Condition()
        self._due: float | None = None
        self._thread: threading.Thread | None = None

    def after(self, delay: float) -> None:
        """Call in ``delay`` seconds: a pending call is moved there."""
        with self._cond:
            self._due = time.monotonic() + delay
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def cancel(self) -> None:
        """Forget the pending call, if any."""
        with self._cond:
            self._due = None
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._due is None or self._due > time.monotonic():
                    self._cond.wait(None if self._due is None else self._due - time.monotonic())
                self._due = None
            try:
                self._fn()
            except Exception:  # the thread serves every later request too
                log.exception("%s failed", self._name)
