"""The test suite's skip policy: a test may skip only for a true platform condition, never because a
component is missing (a test that needs one installs or starts it, or fails saying what is missing).

A platform skip says so in its reason, which starts with ``PLATFORM``: use :func:`platform_skipif` (or
:func:`needs_root`); ``tests/test_skip_policy.py`` fails on a skip spelled any other way.
``tests/conftest.py`` loads this module as a pytest plugin: at the end of every run it prints how many
tests skipped and why, and any other skip fails the run.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

PLATFORM = "platform: "


def platform_skipif(condition: bool, reason: str) -> pytest.MarkDecorator:
    """Skip when ``condition`` holds, for a platform condition (not a missing component) told by ``reason``."""
    return pytest.mark.skipif(condition, reason=PLATFORM + reason)


def needs_root(reason: str) -> pytest.MarkDecorator:
    """Skip unless root (namespaces, the job sandbox, sshd hosts): a platform condition, told by ``reason``. CI
    runs as root, so these run there; a contributor's non-root run passes or fails on the other tests' merits."""
    return platform_skipif(os.geteuid() != 0, reason)


def skip_reason(report: pytest.TestReport) -> str:
    """The reason of a skipped test's report (``pytest.skip``, ``skipif`` and ``importorskip`` alike)."""
    longrepr = report.longrepr
    reason = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


class SkipPolicy:
    """Counts skips by reason; fails the session when one is not a platform condition."""

    def __init__(self) -> None:
        self.skips: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips[skip_reason(report)] += 1

    def forbidden(self) -> dict[str, int]:
        return {reason: n for reason, n in self.skips.items() if not reason.startswith(PLATFORM)}

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.forbidden() and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        total = sum(self.skips.values())
        terminalreporter.write_sep("=", f"skipped: {total}")
        for reason, n in sorted(self.skips.items()):
            terminalreporter.write_line(f"{n:4d}  {reason}")
        bad = self.forbidden()
        if bad:
            terminalreporter.write_line(
                f"FAILED: {sum(bad.values())} test(s) skipped for something other than a platform condition. "
                f"A test that needs a component installs or starts it, or fails saying what is missing; only "
                f"a reason starting {PLATFORM!r} (skip_policy.platform_skipif) may skip.",
                red=True,
            )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipPolicy(), "corral-skip-policy")
