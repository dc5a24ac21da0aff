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
        self._firsts = frozenset(s[0] for s in self._secrets)
        self._longest = len(self._secrets[0]) if self._secrets else 0
        self._held: dict[int, tuple[float, bytes]] = {}

    @property
    def active(self) -> bool:
        return bool(self._secrets)

    def mask(self, data: bytes) -> bytes:
        for s in self._secrets:
            if s in data:
                data = data.replace(s, MASK)
        return data

    def _partial_tail(self, data: bytes) -> int:
        """Where the longest end of ``data`` that is a proper beginning of some secret starts (len: none)."""
        start = max(0, len(data) - self._longest + 1)
        for i in range(start, len(data)):
            if data[i] in self._firsts:
                tail = data[i:]
                if any(len(s) > len(tail) and s.startswith(tail) for s in self._secrets):
                    return i
        return len(data)

    def feed(self, entries: Sequence[Entry]) -> list[Entry]:
        """What of ``entries`` may be stored now, masked (in order; some of it may be held back)."""
        if not self._secrets:
            return list(entries)
        out: list[Entry] = []
        for ts, source, message in entries:
            held_ts, held = self._held.pop(source, (ts, b""))
            data = self.mask(held + message)
            cut = self._partial_tail(data)
            if cut < len(data):
                self._held[source] = (ts if cut >= len(held) else held_ts, data[cut:])
            if cut:
                out.append((held_ts if held else ts, source, data[:cut]))
        return out

    def flush(self) -> list[Entry]:
        """What is held back, once the output has ended."""
        out = [(ts, source, data) for source, (ts, data) in sorted(self._held.items(), key=lambda kv: kv[1][0])]
        self._held.clear()
        return out
