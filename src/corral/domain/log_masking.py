"""Masking a job's secrets in its output before the output is stored: every occurrence of a secret value
of at least :data:`MIN_LENGTH` characters becomes ``******``, also when the value is split across the
agent's entries (a partial line flushed mid-value, a 64 KiB piece, two polls).

Each stream (stdout, stderr) is masked as one byte stream: the end of an entry that could be the start
of a secret is held back and put in front of the stream's next entry, so a value is never stored in
pieces either; what is held is released (as it is: it is not a whole secret) when the job's output
ends (:meth:`LogMasker.flush`). A line that ends with the beginning of a secret therefore shows up with
the stream's next output.

Pure: no I/O; one masker per followed job.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MASK = b"******"
#: Shorter values are not masked (they would mask ordinary words and numbers everywhere).
MIN_LENGTH = 4

Entry = tuple[float, int, bytes]  # (timestamp, source, message)


class LogMasker:
    def __init__(self, values: Iterable[str]) -> None:
        found = {v.encode() for v in values if len(v) >= MIN_LENGTH}
        self._secrets = sorted(found, key=len, reverse=True)  # longest first: a value inside another
        self._held: dict[int, tuple[float, bytes]] = {}

    @property
    def active(self) -> bool:
        return bool(self._secrets)

    def mask(self, data: bytes) -> bytes:
        return _masked(data, 0, len(data), self._occurrences(data))

    def _partial_tail(self, data: bytes) -> int:
        """Where the longest end of ``data`` that is a proper beginning of some secret starts (len: none).
        Only the last ``len(secret) - 1`` bytes can be one; candidates are found by the secret's first byte."""
        best = len(data)
        for s in self._secrets:
            first = s[:1]
            i = data.find(first, max(0, len(data) - len(s) + 1))
            while i != -1 and i < best:
                if s.startswith(data[i:]):
                    best = i
                    break
                i = data.find(first, i + 1)
        return best

    def _occurrences(self, data: bytes) -> list[tuple[int, int]]:
        """Non-overlapping ``[start, end)`` of every secret in ``data`` (longest first), in order."""
        found: list[tuple[int, int]] = []
        for s in self._secrets:
            if s not in data:
                continue
            i = data.find(s)
            while i != -1:
                end = i + len(s)
                if not any(a < end and i < b for a, b in found):
                    found.append((i, end))
                i = data.find(s, i + 1)
        return sorted(found)

    def _stream(self, source: int, entries: list[tuple[int, float, bytes]]) -> list[tuple[int, Entry]]:
        """One stream's entries of a reply as ``(index, entry)`` to store: the stream is masked whole; entries
        a secret runs across are stored as one (with the first one's time); a possible beginning at the end
        is held back."""
        held_ts, held = self._held.pop(source, (entries[0][1], b""))
        data = held + b"".join(m for _, _, m in entries)
        found = self._occurrences(data)
        cut = max(self._partial_tail(data), found[-1][1] if found else 0)
        if not found and cut == len(data):  # the usual case: nothing to mask, nothing to hold
            first = (entries[0][0], (held_ts, source, held + entries[0][2]))
            return [first, *((n, (ts, source, m)) for n, ts, m in entries[1:])]
        starts = [0]  # where each entry begins in the stream (the held part goes with the first)
        for _, _, message in entries[:-1]:
            starts.append(starts[-1] + len(message) + (len(held) if len(starts) == 1 else 0))
        times = [held_ts, *(ts for _, ts, _ in entries[1:])]
        # an entry that starts inside a secret joins the one before it
        groups: list[int] = [k for k, p in enumerate(starts) if k == 0 or not any(a < p < b for a, b in found)]
        out: list[tuple[int, Entry]] = []
        for n, k in enumerate(groups):
            start = starts[k]
            end = min(starts[groups[n + 1]] if n + 1 < len(groups) else len(data), cut)
            if start >= cut:
                break
            if end > start:
                out.append((entries[k][0], (times[k], source, _masked(data, start, end, found))))
        if cut < len(data):
            k = max(k for k, p in enumerate(starts) if p <= cut)
            self._held[source] = (times[k], data[cut:])
        return out

    def feed(self, entries: Sequence[Entry]) -> list[Entry]:
        """What of ``entries`` may be stored now, masked (in order; some of it may be held back)."""
        if not self._secrets or not entries:
            return list(entries)
        by_source: dict[int, list[tuple[int, float, bytes]]] = {}
        for n, (ts, source, message) in enumerate(entries):
            by_source.setdefault(source, []).append((n, ts, message))
        if len(by_source) == 1:
            ((source, items),) = by_source.items()
            return [entry for _, entry in self._stream(source, items)]
        out = [item for source, items in by_source.items() for item in self._stream(source, items)]
        return [entry for _, entry in sorted(out, key=lambda item: item[0])]

    def flush(self) -> list[Entry]:
        """What is held back, once the output has ended."""
        out = [(ts, source, data) for source, (ts, data) in sorted(self._held.items(), key=lambda kv: kv[1][0])]
        self._held.clear()
        return out


def _masked(data: bytes, start: int, end: int, found: Sequence[tuple[int, int]]) -> bytes:
    """``data[start:end]`` with the secrets ``found`` inside it replaced by :data:`MASK`."""
    pieces = []
    at = start
    for a, b in found:
        if a >= start and b <= end:
            pieces += [data[at:a], MASK]
            at = b
    pieces.append(data[at:end])
    return b"".join(pieces)
