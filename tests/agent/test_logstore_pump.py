"""A job's two pipes read by one thread (:func:`corral.agent.logstore.pump_all`): each line under its own
source, a partial line of one pipe flushed while the other stays open, and one reader thread per job."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from corral.agent.jobs import JobRunner
from corral.agent.logstore import PARTIAL_FLUSH_S, LogStore, pump_all
from corral.agent.protocol import JobSubmission


def _entries(store: LogStore) -> list[tuple[str, bytes]]:
    return [(e.source, e.message) for e in store.read(0, 1000)]


def _until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)


def _identity(fd: int) -> tuple[int, int] | None:
    """What ``fd`` names, or None once closed. Another thread of the test process may reuse a closed fd's number
    at once, so the number alone does not tell that the reader closed its pipe: the pipe's inode does."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def test_one_thread_reads_both_pipes_each_line_under_its_source(tmp_path: Path) -> None:
    store = LogStore(str(tmp_path))
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    notified = threading.Event()
    stop = threading.Event()
    pipes = {fd: _identity(fd) for fd in (out_r, err_r)}
    reader = threading.Thread(target=pump_all, args=([(out_r, "stdout"), (err_r, "stderr")], store, notified.set, stop))
    reader.start()
    os.write(out_w, b"one\n")
    _until(lambda: len(_entries(store)) == 1)
    os.write(err_w, b"two\nthr")
    _until(lambda: len(_entries(store)) == 2)
    assert _entries(store) == [("stdout", b"one\n"), ("stderr", b"two\n")]
    assert notified.is_set()
    # stderr's partial line comes out on its own after PARTIAL_FLUSH_S, stdout still open
    _until(lambda: len(_entries(store)) == 3, PARTIAL_FLUSH_S + 5)
    assert _entries(store)[2] == ("stderr", b"thr")
    # stdout's end keeps its partial line at once, while stderr goes on
    os.write(out_w, b"fou")
    os.close(out_w)
    _until(lambda: len(_entries(store)) == 4, PARTIAL_FLUSH_S / 2)
    assert _entries(store)[3] == ("stdout", b"fou")
    os.write(err_w, b"five\n")
    _until(lambda: len(_entries(store)) == 5)
    assert _entries(store)[4] == ("stderr", b"five\n")
    assert reader.is_alive()
    os.close(err_w)
    reader.join(5)
    assert not reader.is_alive()
    for fd, pipe in pipes.items():  # both closed by the reader
        assert _identity(fd) != pipe, f"fd {fd} left open"
    store.close()


def test_a_stop_ends_the_reader_and_keeps_what_each_pipe_held(tmp_path: Path) -> None:
    store = LogStore(str(tmp_path))
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    stop = threading.Event()
    reader = threading.Thread(target=pump_all, args=([(out_r, "stdout"), (err_r, "stderr")], store, lambda: None, stop))
    reader.start()
    os.write(out_w, b"a")
    os.write(err_w, b"b")
    time.sleep(0.1)
    stop.set()  # a pipe a leftover process still holds open
    reader.join(PARTIAL_FLUSH_S + 2)
    assert not reader.is_alive()
    assert sorted(_entries(store)) == [("stderr", b"b"), ("stdout", b"a")]
    os.close(out_w)
    os.close(err_w)
    store.close()


def test_a_running_job_has_one_output_reader(tmp_path: Path) -> None:
    runner = JobRunner(str(tmp_path))
    sub = JobSubmission.from_dict(
        {"job_id": "one-reader", "run_name": "r", "commands": ["echo out; echo err >&2; sleep 30"]}
    )
    runner.submit(sub)
    try:
        job = runner.get("one-reader")
        _until(lambda: job.logs.count >= 4)  # its two diag lines, then stdout and stderr
        readers = [t.name for t in threading.enumerate() if t.name.startswith("log-one-reader")]
        assert readers == ["log-one-reader"]
        sources = {e.source for e in job.logs.read(0, 100)}
        assert sources == {"agent", "stdout", "stderr"}
    finally:
        runner.shutdown(max_grace=1.0)
    assert runner.get("one-reader").snapshot().finished
