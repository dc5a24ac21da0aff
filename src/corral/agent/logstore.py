"""A job's output on disk: an append-only data file plus a fixed-size-record index.

``logs.dat`` holds the raw output bytes of every entry back to back; ``logs.idx`` holds one
24-byte record per entry (timestamp, data offset, length, source). Entry *N* is found by seeking
to ``N * 24`` in the index, so offset reads cost O(limit) and the agent's memory does not grow
with the amount of output. :func:`pump_all` is the reader-thread body that turns a job's pipes into entries:
one per line (the newline kept, bytes untouched), a partial line flushed after 0.5 s without a
newline, and pieces of at most 64 KiB.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import threading
import time
from collections.abc import Callable

from .protocol import LogEntry

_REC = struct.Struct("<dQIB3x")
#: ``agent``: the agent's own lines about the job (:meth:`corral.agent.job.Job.diag`).
SOURCES = ("stdout", "stderr", "agent")
_AGENT = 2
MAX_ENTRY = 64 * 1024
PARTIAL_FLUSH_S = 0.5
#: A reply carries at most this many message bytes (at least one entry).
MAX_REPLY_BYTES = 4 * 1024 * 1024


class _KeepFree:
    """The free bytes the agent leaves on its disk (``corral-agent serve --keep-free``): output that would go
    below is dropped and counted, as when the disk is full. 0: only a full disk stops it."""

    bytes = 0


def keep_free(n: int) -> None:
    """Set how many bytes the agent's output leaves free on its disk."""
    _KeepFree.bytes = max(0, n)


class LogStore:
    """Append from several threads, read from any; all under one lock."""

    def __init__(self, job_dir: str) -> None:
        self._lock = threading.Lock()
        flags = os.O_CREAT | os.O_APPEND | os.O_WRONLY
        idx_path = os.path.join(job_dir, "logs.idx")
        dat_path = os.path.join(job_dir, "logs.dat")
        self._idx_w = os.open(idx_path, flags, 0o600)
        self._dat_w = os.open(dat_path, flags, 0o600)
        self._idx_r = os.open(idx_path, os.O_RDONLY)
        self._dat_r = os.open(dat_path, os.O_RDONLY)
        idx_size = os.fstat(self._idx_w).st_size
        self._count = idx_size // _REC.size
        if idx_size % _REC.size:  # a torn record from a crash: drop it
            os.ftruncate(self._idx_w, self._count * _REC.size)
        self._data_size = os.fstat(self._dat_w).st_size
        self._closed = False
        self._dropped_entries = 0
        self._dropped_bytes = 0
        self._drop_reason = ""
        self._released = 0

    @property
    def count(self) -> int:
        return self._count

    def append(self, source: str, pieces: list[bytes], timestamp: float) -> None:
        """Store ``pieces``; when the disk refuses them (full), they are counted and dropped -- never raised, so
        the job's output keeps being drained -- and a line saying so is stored before the next that fits."""
        if not pieces:
            return
        with self._lock:
            if self._closed:
                return
            self._say_dropped(timestamp)
            if not self._write(pieces, SOURCES.index(source), timestamp):
                self._dropped_entries += len(pieces)
                self._dropped_bytes += sum(len(p) for p in pieces)

    def _say_dropped(self, timestamp: float) -> None:
        """Store the line counting what was dropped, if any was and it fits now."""
        if self._dropped_entries and self._write([self._dropped_line()], _AGENT, timestamp):
            self._dropped_entries = self._dropped_bytes = 0

    def _dropped_line(self) -> bytes:
        return (
            f"{self._dropped_entries} entries ({self._dropped_bytes} bytes) of output could not be stored on the "
            f"agent's disk ({self._drop_reason}) and were dropped\n"
        ).encode()

    def _write(self, pieces: list[bytes], src: int, timestamp: float) -> bool:
        """Append entries whole or not at all (a partial write is cut off again); False when the disk refused, or
        when they would leave less than ``--keep-free`` free on it."""
        off = self._data_size
        recs = []
        for p in pieces:
            recs.append(_REC.pack(timestamp, off, len(p), src))
            off += len(p)
        if _KeepFree.bytes and src != _AGENT:
            st = os.fstatvfs(self._dat_w)
            if st.f_bavail * st.f_frsize - (off - self._data_size) - len(recs) * _REC.size < _KeepFree.bytes:
                self._drop_reason = f"less than {_KeepFree.bytes} bytes would be left free"
                return False
        try:
            _write_all(self._dat_w, b"".join(pieces))
            _write_all(self._idx_w, b"".join(recs))
        except OSError as e:
            self._drop_reason = e.strerror or str(e)
            os.ftruncate(self._dat_w, self._data_size)  # shrinking needs no space
            os.ftruncate(self._idx_w, self._count * _REC.size)
            return False
        self._data_size = off
        self._count += len(pieces)
        return True

    @property
    def dropped_entries(self) -> int:
        """Entries dropped since the last line saying so was stored."""
        return self._dropped_entries

    def read(self, offset: int, limit: int) -> list[LogEntry]:
        with self._lock:
            if self._closed:
                return []
            self._say_dropped(time.time())  # a job that wrote nothing since is told too
            end = min(self._count, offset + max(0, limit))
            if end <= offset:
                return []
            raw = os.pread(self._idx_r, (end - offset) * _REC.size, offset * _REC.size)
            recs = [_REC.unpack_from(raw, i * _REC.size) for i in range(len(raw) // _REC.size)]
            total = 0
            keep = 0
            for _, _, length, _ in recs:
                if keep and total + length > MAX_REPLY_BYTES:
                    break
                total += length
                keep += 1
            recs = recs[:keep]
            start = recs[0][1]
            data = os.pread(self._dat_r, recs[-1][1] + recs[-1][2] - start, start)
        return [
            LogEntry(timestamp=ts, source=SOURCES[src], message=data[o - start : o - start + ln])
            for ts, o, ln, src in recs
        ]

    def release(self, offset: int) -> None:
        """The server stored the entries before ``offset``: their bytes leave this disk (the data file keeps
        its size and offsets, its blocks below them are punched out), so that output is stored once, there."""
        with self._lock:
            if self._closed or offset <= 0:
                return
            if offset >= self._count:
                end = self._data_size
            else:
                end = _REC.unpack(os.pread(self._idx_r, _REC.size, offset * _REC.size))[1]
            end -= end % _BLOCK
            if end > self._released and _punch(self._dat_w, self._released, end):
                self._released = end

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                for fd in (self._idx_w, self._dat_w, self._idx_r, self._dat_r):
                    os.close(fd)


_BLOCK = 4096
#: fallocate(2)'s FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE (https://man7.org/linux/man-pages/man2/fallocate.2.html)
_PUNCH_HOLE = 0x01 | 0x02


class _Fallocate:
    """libc's ``fallocate``, loaded on first use (None: not there, or the file system cannot punch holes)."""

    fn: Callable[..., int] | None = None
    tried = False


def _punch(fd: int, start: int, end: int) -> bool:
    """Free the blocks of ``fd`` between ``start`` and ``end`` (reading them gives zeros); False if not done."""
    if not _Fallocate.tried:
        _Fallocate.tried = True
        try:
            fn = ctypes.CDLL(None, use_errno=True).fallocate
            fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
            _Fallocate.fn = fn
        except (OSError, AttributeError):
            _Fallocate.fn = None
    return _Fallocate.fn is not None and _Fallocate.fn(fd, _PUNCH_HOLE, start, end - start) == 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def split_lines(buf: bytearray) -> list[bytes]:
    """Remove and return the complete lines (and 64 KiB pieces) at the front of ``buf``."""
    out: list[bytes] = []
    pos = 0
    n = len(buf)
    while pos < n:
        nl = buf.find(b"\n", pos, min(n, pos + MAX_ENTRY))
        if nl >= 0:
            out.append(bytes(buf[pos : nl + 1]))
            pos = nl + 1
        elif n - pos >= MAX_ENTRY:
            out.append(bytes(buf[pos : pos + MAX_ENTRY]))
            pos += MAX_ENTRY
        else:
            break
    del buf[:pos]
    return out


def pump(fd: int, source: str, store: LogStore, notify: Callable[[], None], stop: threading.Event) -> None:
    """Read ``fd`` until EOF (or ``stop``), appending entries to ``store``; closes ``fd``."""
    pump_all([(fd, source)], store, notify, stop)


class _Stream:
    """One pipe :func:`pump_all` reads: its source, the partial line it holds and since when."""

    def __init__(self, fd: int, source: str) -> None:
        self.fd, self.source = fd, source
        self.buf = bytearray()
        self.partial_since = 0.0

    def flush(self, store: LogStore) -> bool:
        """The partial line, if any, as an entry of its own; whether there was one."""
        if not self.buf:
            return False
        store.append(self.source, [bytes(self.buf)], time.time())
        self.buf.clear()
        return True

    def read(self, store: LogStore) -> tuple[bool, bool]:
        """One read: (still open, whether entries were added)."""
        try:
            chunk = os.read(self.fd, MAX_ENTRY)
        except InterruptedError:
            return True, False
        if not chunk:
            return False, False
        had_partial = bool(self.buf)
        self.buf += chunk
        lines = split_lines(self.buf)
        if lines:
            store.append(self.source, lines, time.time())
        if self.buf and (lines or not had_partial):
            self.partial_since = time.monotonic()
        return True, bool(lines)


def pump_all(
    streams: list[tuple[int, str]], store: LogStore, notify: Callable[[], None], stop: threading.Event
) -> None:
    """Read every ``(fd, source)`` until EOF (or ``stop``), in one thread, appending entries to ``store``: one
    per line, a partial line after :data:`PARTIAL_FLUSH_S` without its newline; closes each ``fd``."""
    open_streams = {fd: _Stream(fd, source) for fd, source in streams}
    try:
        while open_streams and not stop.is_set():
            now = time.monotonic()
            waits = [s.partial_since + PARTIAL_FLUSH_S - now for s in open_streams.values() if s.buf]
            ready, _, _ = select.select(list(open_streams), [], [], max(0.0, min(waits)) if waits else 0.5)
            if not ready:
                now = time.monotonic()
                due = [s for s in open_streams.values() if s.buf and now - s.partial_since >= PARTIAL_FLUSH_S]
                if [s.flush(store) for s in due]:
                    notify()
                continue
            if stop.is_set():
                break
            added = False
            for fd in ready:
                still_open, lines = open_streams[fd].read(store)
                added = added or lines
                if not still_open:
                    added = _close(open_streams.pop(fd), store) or added
            if added:
                notify()
    except OSError:
        pass
    finally:
        flushed = [_close(s, store) for s in open_streams.values()]
        if any(flushed):
            notify()


def _close(stream: _Stream, store: LogStore) -> bool:
    """The stream's partial line kept and its fd closed; whether there was such a line."""
    flushed = stream.flush(store)
    try:
        os.close(stream.fd)
    except OSError:
        pass
    return flushed
