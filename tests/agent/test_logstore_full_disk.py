"""A job's output on a full disk (a real 1 MB tmpfs): the agent keeps draining the pipe, drops and counts what
it cannot store, never stores half an entry, and says what it dropped once a line fits again."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from corral.agent.logstore import LogStore, pump
from skip_policy import needs_root
from tmpfs_mount import tmpfs

pytestmark = needs_root("mounting a tmpfs needs root (CI runs as root)")


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


def test_output_the_server_stored_leaves_the_agents_disk(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "16m") as disk:
        store = LogStore(str(disk))
        lines = [b"%099d\n" % i for i in range(20000)]  # 2 MB
        store.append("stdout", lines, time.time())
        dat = disk / "logs.dat"
        assert dat.stat().st_blocks * 512 >= 2_000_000
        store.release(15000)  # the server stored the first 15000 entries
        assert dat.stat().st_size == 2_000_000  # offsets unchanged
        assert dat.stat().st_blocks * 512 <= 500_000 + 4096
        assert [e.message for e in store.read(15000, 10)] == lines[15000:15010]  # what is left reads as before
        store.release(20000)
        assert dat.stat().st_blocks * 512 <= 4096  # its last, partly written block
        store.append("stdout", [b"more\n"], time.time())
        assert [e.message for e in store.read(20000, 10)] == [b"more\n"]
        store.close()
