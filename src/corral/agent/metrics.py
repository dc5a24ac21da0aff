"""The agent's sampler of running jobs: CPU time, memory and GPUs, every ``interval`` seconds.

One thread samples every running job of the agent in one pass:

* **CPU and memory** come from the job's own cgroup when it has one (a container, or any job whose main
  process sits in a cgroup other than the agent's): cgroup v2 ``cpu.stat`` ``usage_usec``, ``memory.current``
  and working set = ``memory.current`` - ``memory.stat`` ``inactive_file``; cgroup v1 ``cpuacct.usage`` and
  ``memory.usage_in_bytes`` - ``total_inactive_file``. Otherwise from the job's process tree in ``/proc``
  (its main process, its descendants and its session): CPU = user + system time of the live members and of
  the children they reaped, memory = their resident set (usage and working set alike). One ``/proc`` scan
  per pass serves every such job; a job's CPU time never goes backwards (a member that dies unreaped by the
  tree takes its time with it, so the last value is kept until the tree's time passes it again).
* **GPUs**, only for jobs that were given some (a host-process job of an agent with GPUs: the agent's; a
  container: its device requests): one ``nvidia-smi --query-gpu=index,memory.used,utilization.gpu
  --format=csv,noheader,nounits`` (or ``amd-smi monitor -vu --csv``) per pass for all the jobs on the host.

Each job keeps its last ``keep`` samples; ``GET /jobs/{id}/logs?metrics_after=T`` returns those after ``T``
(:mod:`corral.agent.protocol_metrics`). Best effort throughout: a file or a tool that fails gives no
sample (or no GPU values), never an error. Standard library only, Python 3.9+.
"""

from __future__ import annotations

import collections
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, Optional

from . import nvidia_csv
from .job import Job
from .protocol_metrics import MAX_SAMPLES_PER_REPLY, GpuSample, MetricsSample

log = logging.getLogger("corral.agent.metrics")

#: Seconds between two passes (dstack's server collects every 10 s).
DEFAULT_INTERVAL = 2.0
#: Samples kept per job (10 minutes at the default interval): what a server that was away can still fetch.
DEFAULT_KEEP = 300
NVIDIA_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,memory.used,utilization.gpu",
    "--format=csv,noheader,nounits",
]
AMD_QUERY = ["amd-smi", "monitor", "-vu", "--csv"]
CGROUP_ROOT = "/sys/fs/cgroup"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

#: How a job is measured: ("cgroup2", dir) | ("cgroup1", cpuacct dir, memory dir) | ("tree", root pid).
Source = tuple[Any, ...]


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _keyed(text: Optional[str], key: str) -> Optional[int]:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def _int(text: Optional[str]) -> Optional[int]:
    value = (text or "").strip()
    return int(value) if value.isdigit() else None


def cgroup_source(pid: int, own: Optional[str] = None, root: str = CGROUP_ROOT) -> Optional[Source]:
    """Where ``pid``'s cgroup counters are, when it has a cgroup of its own (not the agent's ``own``)."""
    text = _read(f"/proc/{pid}/cgroup")
    if text is None:
        return None
    own_text = _read("/proc/self/cgroup") if own is None else own
    if text == own_text:
        return None  # the agent's own cgroup: it holds more than the job
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            path = os.path.join(root, parts[2].lstrip("/"))
            if os.path.exists(os.path.join(path, "cpu.stat")):
                return ("cgroup2", path)
        for controller in parts[1].split(","):
            v1[controller] = parts[2].lstrip("/")
    if "cpuacct" in v1 and "memory" in v1:
        cpu = next(
            (d for d in ("cpu,cpuacct", "cpuacct,cpu", "cpuacct") if os.path.isdir(os.path.join(root, d))), "cpuacct"
        )
        return ("cgroup1", os.path.join(root, cpu, v1["cpuacct"]), os.path.join(root, "memory", v1["memory"]))
    return None


def read_cgroup(source: Source) -> Optional[tuple[int, int, int]]:
    """(cpu µs, memory usage bytes, working set bytes) from a cgroup, or None if it is gone."""
    if source[0] == "cgroup2":
        cpu = _keyed(_read(os.path.join(source[1], "cpu.stat")), "usage_usec")
        mem = _int(_read(os.path.join(source[1], "memory.current")))
        inactive = _keyed(_read(os.path.join(source[1], "memory.stat")), "inactive_file") or 0
    else:
        nanos = _int(_read(os.path.join(source[1], "cpuacct.usage")))
        cpu = None if nanos is None else nanos // 1000
        mem = _int(_read(os.path.join(source[2], "memory.usage_in_bytes")))
        inactive = _keyed(_read(os.path.join(source[2], "memory.stat")), "total_inactive_file") or 0
    if cpu is None or mem is None:
        return None
    return cpu, mem, max(0, mem - inactive)


class ProcTable:
    """One scan of ``/proc``: each live process's parent, session, CPU ticks (own + reaped children) and
    resident pages."""

    def __init__(self, proc: str = "/proc") -> None:
        self.parent: dict[int, int] = {}
        self.session: dict[int, int] = {}
        self.ticks: dict[int, int] = {}
        self.rss: dict[int, int] = {}
        self._children: dict[int, list[int]] | None = None
        for name in os.listdir(proc):
            if not name.isdigit():
                continue
            try:
                with open(f"{proc}/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            try:
                if fields[0] in (b"Z", b"X"):
                    continue
                pid = int(name)
                self.parent[pid], self.session[pid] = int(fields[1]), int(fields[3])
                self.ticks[pid] = sum(int(fields[k]) for k in (11, 12, 13, 14))  # utime stime cutime cstime
                self.rss[pid] = int(fields[21])
            except (IndexError, ValueError):
                continue

    def tree(self, root: int) -> list[int]:
        """``root``, its descendants, and the other members of its session (a daemonised child)."""
        if self._children is None:  # built once per scan, shared by every job's tree
            self._children = collections.defaultdict(list)
            for pid, ppid in self.parent.items():
                self._children[ppid].append(pid)
        children = self._children
        found = {root} if root in self.parent else set()
        todo = list(found)
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        found.update(pid for pid, sid in self.session.items() if sid == root)
        return sorted(found)

    def usage(self, root: int, overhead: tuple[int, ...] = ()) -> Optional[tuple[int, int, int]]:
        """CPU (microseconds) and memory (bytes, twice: usage and working set) of ``root``'s tree; the memory
        of the ``overhead`` processes (a sandboxed job's launcher and init) is not the job's, their CPU is (it
        holds what they reaped)."""
        members = self.tree(root)
        if not members:
            return None
        cpu = sum(self.ticks[p] for p in members) * 1_000_000 // _TICKS
        rss = sum(self.rss[p] for p in members if p not in overhead) * _PAGE
        return cpu, rss, rss


def parse_nvidia(out: str) -> dict[int, tuple[int, int]]:
    """``index, memory.used (MiB), utilization.gpu (%)`` lines (with or without units) -> {index: (bytes, percent)}."""
    found: dict[int, tuple[int, int]] = {}
    for line in out.splitlines():
        parts = nvidia_csv.fields(line)
        if len(parts) < 3:
            continue
        index, used, util = (nvidia_csv.number(p) for p in parts[:3])
        if index is None or used is None or util is None:
            # "[N/A]" (a GPU in MIG mode has no utilization.gpu): no values for it, so its jobs get no GPU
            # values at all rather than a made-up 0 % that a utilization_policy would act on
            continue
        found[int(index)] = (int(used * 2**20), int(util))
    return found


def parse_amd(out: str) -> dict[int, tuple[int, int]]:
    """``amd-smi monitor -vu --csv``: the columns ``gpu``, ``gfx`` (%) and ``vram_used`` (MB)."""
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if not lines:
        return {}
    head = [h.strip().lower() for h in lines[0].split(",")]
    if not {"gpu", "gfx", "vram_used"} <= set(head):
        return {}
    gi, ui, mi = head.index("gpu"), head.index("gfx"), head.index("vram_used")
    found: dict[int, tuple[int, int]] = {}
    for line in lines[1:]:
        parts = [p.strip() for p in line.split(",")]
        try:
            found[int(parts[gi])] = (int(float(parts[mi]) * 2**20), int(float(parts[ui])))
        except (IndexError, ValueError):
            continue
    return found


def _run(argv: list[str]) -> Optional[str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


class Sampler:
    """Samples the jobs ``running()`` gives, every ``interval`` seconds, in a thread of its own.

    ``gpus_of(job)``: the host GPU indexes the job was given, and their vendor (``nvidia``/``amd``; empty:
    none). ``root_pid(job)``: the pid whose cgroup or tree is the job's (None: not started yet);
    ``overhead(job)``: the processes of its tree that are the sandbox's, not the job's (their memory is left out)."""

    def __init__(
        self,
        running: Callable[[], list[Job]],
        root_pid: Callable[[Job], Optional[int]],
        gpus_of: Callable[[Job], tuple[list[int], str]],
        interval: float = DEFAULT_INTERVAL,
        keep: int = DEFAULT_KEEP,
        overhead: Callable[[Job], tuple[int, ...]] = lambda job: (),
    ) -> None:
        self.interval = interval
        self._running, self._root_pid, self._gpus_of = running, root_pid, gpus_of
        self._overhead = overhead
        self._keep = keep
        self._lock = threading.Lock()
        self._samples: dict[str, collections.deque[MetricsSample]] = {}
        self._sources: dict[str, tuple[int, Optional[Source]]] = {}
        self._cpu_high: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._own_cgroup = _read("/proc/self/cgroup")

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self.interval <= 0:
                return
            self._thread = threading.Thread(target=self._loop, name="metrics-sampler")
            self._thread.daemon = True
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample_once()
            except Exception:  # never let the sampler die: the next pass tries again
                log.exception("sampling jobs failed")

    def since(self, job_id: str, after_micro: int) -> list[MetricsSample]:
        """The job's samples taken after ``after_micro``, oldest first (at most one reply's worth)."""
        with self._lock:
            kept = list(self._samples.get(job_id, ()))
        return [s for s in kept if s.timestamp_micro > after_micro][:MAX_SAMPLES_PER_REPLY]

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._samples.pop(job_id, None)
            self._sources.pop(job_id, None)
            self._cpu_high.pop(job_id, None)

    def _source(self, job: Job, pid: int) -> Optional[Source]:
        known = self._sources.get(job.sub.job_id)
        if known is not None and known[0] == pid:
            return known[1]
        source = cgroup_source(pid, self._own_cgroup)
        self._sources[job.sub.job_id] = (pid, source)
        return source

    def sample_once(self, now: Optional[float] = None) -> int:
        """One pass over the running jobs; returns how many got a sample."""
        jobs = self._running()
        if not jobs:
            return 0
        roots = [(job, self._root_pid(job)) for job in jobs]
        table: Optional[ProcTable] = None
        gpu_values: dict[str, dict[int, tuple[int, int]]] = {}
        wanted = {job.sub.job_id: self._gpus_of(job) for job, _ in roots}
        for vendor in {v for idx, v in wanted.values() if idx}:
            out = _run(NVIDIA_QUERY if vendor == "nvidia" else AMD_QUERY)
            gpu_values[vendor] = {} if out is None else (parse_nvidia(out) if vendor == "nvidia" else parse_amd(out))
        stamp = int((time.time() if now is None else now) * 1_000_000)
        taken = 0
        for job, pid in roots:
            if pid is None:
                continue
            source = self._source(job, pid)
            if source is not None:
                usage = read_cgroup(source)
            else:
                if table is None:
                    table = ProcTable()
                usage = table.usage(pid, self._overhead(job))
            if usage is None:
                continue
            job_id = job.sub.job_id
            cpu = max(usage[0], self._cpu_high.get(job_id, 0))
            self._cpu_high[job_id] = cpu
            indexes, vendor = wanted[job_id]
            values = gpu_values.get(vendor, {})
            gpus = tuple(GpuSample(*values[i]) for i in indexes if i in values)
            if len(gpus) != len(indexes):
                gpus = ()  # the tool failed or lost a GPU: no GPU values rather than misnumbered ones
            sample = MetricsSample(stamp, cpu, usage[1], usage[2], gpus)
            with self._lock:
                ring = self._samples.get(job_id)
                if ring is None:
                    ring = self._samples[job_id] = collections.deque(maxlen=self._keep)
                ring.append(sample)
            taken += 1
        return taken
