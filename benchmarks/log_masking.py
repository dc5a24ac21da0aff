#!/usr/bin/env python3
"""What masking secrets in a job's output (``corral.domain.log_masking``) costs the jobs worker: MB/s of
typical log lines (80 bytes, 1 in 1000 holding a secret) through ``LogMasker.feed``, with no secrets, 1 and
10 secrets of 40 characters, and one of 5000 (dstack's longest value); also output written in pieces that
end mid-value (every entry holding back a beginning). Figures, not assertions.

    python benchmarks/log_masking.py [--mib 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from corral.domain.log_masking import LogMasker


def _entries(mib: int, secret: bytes, split: bool) -> list[tuple[float, int, bytes]]:
    line = b"step 1234 loss=0.2345 lr=3e-4 tokens/s=12345.6 gpu_mem=71.3GiB epoch=3/10 ok\n"
    n = mib * 1024 * 1024 // len(line)
    out = []
    for i in range(n):
        if i % 1000 == 0:
            msg = b"token " + secret + b"\n"
            if split:
                out += [(float(i), 0, msg[:10]), (float(i), 0, msg[10:])]
                continue
            out.append((float(i), 0, msg))
        else:
            out.append((float(i), 0, line))
    return out


def _bench(values: list[str], entries: list[tuple[float, int, bytes]], repeats: int) -> float:
    total = sum(len(m) for _, _, m in entries)
    times = []
    for _ in range(repeats):
        masker = LogMasker(values)
        t0 = time.perf_counter()
        for k in range(0, len(entries), 200):  # the worker feeds one agent reply at a time
            masker.feed(entries[k : k + 200])
        masker.flush()
        times.append(time.perf_counter() - t0)
    return total / statistics.median(times) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    short = [os.urandom(20).hex() for _ in range(10)]
    long_one = "k" + os.urandom(2500).hex()[:4999]
    print(f"load: {os.getloadavg()[0]:.2f}; {a.mib} MiB of 80-byte lines, median of {a.repeats}")
    for label, values, secret, split in (
        ("no secrets", [], short[0], False),
        ("1 secret (40 chars)", short[:1], short[0], False),
        ("10 secrets (40 chars)", short, short[3], False),
        ("1 secret (5000 chars)", [long_one], long_one, False),
        ("1 secret, split mid-value", short[:1], short[0], True),
    ):
        entries = _entries(a.mib, secret.encode(), split)
        print(f"{label:28} {_bench(values, entries, a.repeats):8.1f} MB/s")


if __name__ == "__main__":
    main()
