"""When a lost host is flagged and when it is given up."""

from __future__ import annotations

from corral.domain.lost_hosts import HostHealth, Verdict, after_check, verdict


def test_an_answer_clears_what_the_failed_checks_said() -> None:
    down = after_check(after_check(HostHealth(), False, 10.0), False, 20.0)
    assert down == HostHealth(failures=2, down_since=10.0)
    assert after_check(down, True, 30.0) == HostHealth()
    assert verdict(HostHealth(), flagged=False, now=30.0, bound=10.0, replaceable=True) is Verdict.HEALTHY


def test_one_failure_is_a_doubt_two_flag_and_the_bound_gives_up_a_replaceable_host() -> None:
    one = after_check(HostHealth(), False, 100.0)
    assert verdict(one, flagged=False, now=100.0, bound=10.0, replaceable=True) is Verdict.DOUBTFUL
    two = after_check(one, False, 105.0)
    assert verdict(two, flagged=False, now=105.0, bound=10.0, replaceable=True) is Verdict.FLAG
    assert verdict(two, flagged=True, now=109.9, bound=10.0, replaceable=True) is Verdict.WAIT
    assert verdict(two, flagged=True, now=110.0, bound=10.0, replaceable=True) is Verdict.GIVE_UP
    # a host the backend was given (SSH) is never given up: it stays flagged until its agent answers
    assert verdict(two, flagged=True, now=10_000.0, bound=10.0, replaceable=False) is Verdict.WAIT
    # the bound counts from the first failed check, even when it passes before the host is flagged
    assert verdict(one, flagged=False, now=200.0, bound=10.0, replaceable=True) is Verdict.GIVE_UP
