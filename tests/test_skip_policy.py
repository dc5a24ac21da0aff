"""The skip policy (tests/skip_policy.py): skips are counted and explained; only platform skips pass."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TESTS = """
import pytest
from skip_policy import platform_skipif

@platform_skipif(True, "no such CPU here")
def test_platform():
    pass

def test_runs():
    pass
"""


def test_platform_skips_are_counted_and_allowed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TESTS)
    result = pytester.runpytest("-p", "skip_policy", "-p", "no:asyncio", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*skipped: 1*", "*1  platform: no such CPU here"])


def test_a_skip_for_a_missing_component_fails_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        TESTS
        + """
def test_needs_postgres():
    pytest.skip("postgres is not installed")

@pytest.mark.skipif(True, reason="no docker")
def test_needs_docker():
    pass
"""
    )
    result = pytester.runpytest("-p", "skip_policy", "-p", "no:asyncio", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*skipped: 3*", "*1  no docker", "*1  postgres is not installed", "*FAILED: 2 test(s)*"]
    )


def test_every_skip_in_the_suite_goes_through_the_policy() -> None:
    """No test spells a skip of its own (``pytest.mark.skipif``, ``pytest.skip``, ``importorskip``): each uses
    ``platform_skipif`` or ``needs_root``, so a non-root run skips only for platform reasons, saying so."""
    import re
    from pathlib import Path

    spelled = re.compile(r"pytest\.(mark\.skipif|skip\(|importorskip)")
    here = Path(__file__).parent
    found = [
        f"{path.relative_to(here)}:{n}"
        for path in sorted(here.rglob("*.py"))
        if path.name not in ("skip_policy.py", "test_skip_policy.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line)
    ]
    assert not found, f"skips outside the policy (use skip_policy.platform_skipif or needs_root): {found}"
