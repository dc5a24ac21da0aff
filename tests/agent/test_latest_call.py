"""The bridge check's one timer thread: a call a delay after the latest request, moved by each later one."""

from __future__ import annotations

import threading
import time

from corral.agent.latest_call import LatestCall


def _recorder() -> tuple[list[float], threading.Event, LatestCall]:
    calls: list[float] = []
    called = threading.Event()

    def fn() -> None:
        calls.append(time.monotonic())
        called.set()

    return calls, called, LatestCall(fn, "test-latest-call")


def test_one_call_after_the_latest_request_on_one_thread() -> None:
    calls, called, later = _recorder()
    start = time.monotonic()
    for _ in range(20):  # each request moves the call on; none starts a thread of its own
        later.after(0.3)
        time.sleep(0.01)
    last = time.monotonic()
    # counted by name: other tests' threads (an agent's handlers) may come and go meanwhile
    assert [t.name for t in threading.enumerate()].count("test-latest-call") == 1
    assert called.wait(5)
    time.sleep(0.4)
    assert len(calls) == 1
    assert calls[0] >= last + 0.3 - 0.05 > start + 0.3


def test_a_cancelled_call_is_not_made_and_a_later_request_is() -> None:
    calls, called, later = _recorder()
    later.after(0.1)
    later.cancel()
    time.sleep(0.3)
    assert calls == []
    later.after(0.05)
    assert called.wait(5)
    assert len(calls) == 1


def test_a_call_that_fails_leaves_the_next_one_to_be_made() -> None:
    made = threading.Event()
    failures = iter([RuntimeError("the first check fails")])

    def fn() -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        made.set()

    later = LatestCall(fn, "test-latest-call-fails")
    later.after(0.01)
    time.sleep(0.2)
    later.after(0.01)
    assert made.wait(5)
