"""A job's output on a full disk (a real 1 MB tmpfs): the agent keeps draining the pipe, drops and counts what
it cannot store, never stores half an entry, and says what it dropped once a line fits again."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

from corral.agent.logstore import LogStore, pump
from skip_policy import needs_root

pytestmark = needs_root("mounting a tmpfs needs root (CI runs as root)")


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_job_writing_past_a_full_disk_never_blocks_and_what_was_dropped_is_said(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "1m") as disk:
        (disk / "filler").write_bytes(b"\0" * 512 * 1024)
        store = LogStore(str(disk))
        # a job printing 4 MB into a 1 MB disk: it must finish, its pipe drained to the end
        job = subprocess.Popen(
            ["python3", "-c", "import sys\nfor i in range(40000): sys.stdout.write('%099d\\n' % i)"],
            stdout=subprocess.PIPE,
        )
        assert job.stdout is not None
        fd = os.dup(job.stdout.fileno())
        job.stdout.close()
        stop = threading.Event()
        reader = threading.Thread(target=pump, args=(fd, "stdout", store, lambda: None, stop))
        reader.start()
        assert job.wait(timeout=30) == 0  # never blocked on a full pipe
        reader.join(timeout=10)
        assert not reader.is_alive()
        stored = store.read(0, 10**6)
        lines = [e for e in stored if e.source == "stdout"]
        notes = [e.message.decode() for e in stored if e.source == "agent"]
        assert lines and all(len(e.message) == 100 for e in lines)  # whole entries only, in order
        assert [int(e.message) for e in lines] == sorted(int(e.message) for e in lines)
        said = sum(int(n.split(" entries")[0]) for n in notes)
        assert said + store.dropped_entries + len(lines) == 40000  # every line stored or counted
        assert said + store.dropped_entries > 0
        assert all("No space left on device" in n for n in notes)
        # space returns (a file that took half the disk is deleted): a read says what is left to say
        (disk / "filler").unlink()
        after = store.read(0, 10**6)
        told = sum(int(e.message.split(b" entries")[0]) for e in after if e.source == "agent")
        assert told + len(lines) == 40000 and store.dropped_entries == 0
        assert len(after) <= len(stored) + 1
        store.close()
