"""Pure parsers of what Slurm's commands print, in the stable forms corral asks for (``-h -o`` with ``|`` between
fields, ``scontrol show -o``, ``sbatch --parsable``), and the values they make. Tested on outputs captured from
Slurm 22.05 (``tests/data/slurm/``). Nothing here runs a command.

Formats (sinfo(1), squeue(1) "-o <output_format>"): sinfo ``%N`` node name, ``%o`` NodeAddr, ``%T`` extended state,
``%P`` partition (``*`` marks the default), ``%a`` partition up/down, ``%l`` its time limit, ``%c`` CPUs, ``%m``
memory in MB, ``%G`` GRES; squeue ``%i`` id, ``%j`` name, ``%T`` state, ``%r`` reason, ``%N`` nodes, ``%P``
partition, ``%l`` time limit, ``%k`` comment (last: it may hold anything); for one job, ``%L`` its time left.

Times as Slurm prints them (``%l``, ``%L``, ``MaxTime``): ``days-hours:minutes:seconds``, ``hours:minutes:seconds``
or ``minutes:seconds``, and ``infinite``/``UNLIMITED``/``NOT_SET`` for none (squeue(1), "%l"; seen on 22.05: a
1-minute ``MaxTime`` is ``1:00``, 2 days ``2-00:00:00``). What sbatch's ``--time`` takes is wider: a bare number is
minutes, ``days-hours`` and ``days-hours:minutes`` are allowed too (sbatch(1), "--time").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SINFO_FORMAT = "%N|%o|%T|%P|%a|%l|%c|%m|%G"
SQUEUE_FORMAT = "%i|%j|%T|%r|%N|%P|%l|%k"
NULL = "(null)"

#: Node states whose nodes take new work (sinfo(1), "NODE STATE CODES"); every other one (drained, draining,
#: down, fail, failing, maint, reserved, inval, unknown, future, reboot...) does not.
SCHEDULABLE_STATES = frozenset({"idle", "mixed", "allocated", "completing", "planned"})
#: State flags (sinfo's suffixes) of nodes that take no new work: ``*`` not responding, ``$`` in a maintenance
#: reservation, ``@`` pending reboot, ``^`` reboot issued, ``!`` pending power down, ``%`` powering down.
#: ``~`` (powered off) and ``#`` (powering up) nodes are started by Slurm for a job and stay schedulable.
UNSCHEDULABLE_FLAGS = frozenset("*$@^!%")
_FLAGS = frozenset("*~#!%$@^-")


@dataclass(frozen=True)
class SlurmNode:
    name: str
    addr: str
    #: The base state, lower case (``idle``, ``mixed``, ``drained``...), and sinfo's flags (``*``: not responding).
    state: str
    partitions: tuple[str, ...]
    cpus: int
    memory_mib: int
    #: As Slurm reports it (``gpu:a100:2``), "" when none.
    gres: str
    flags: str = ""

    @property
    def gpus(self) -> int:
        return gres_gpus(self.gres)

    @property
    def schedulable(self) -> bool:
        """Whether Slurm gives this node new work."""
        return self.state in SCHEDULABLE_STATES and not (UNSCHEDULABLE_FLAGS & set(self.flags))


@dataclass(frozen=True)
class SlurmPartition:
    name: str
    default: bool
    up: bool
    #: As sinfo prints it (``1:00:00``, ``infinite``).
    time_limit: str


@dataclass(frozen=True)
class SlurmJob:
    id: str
    name: str
    #: Upper case, as squeue prints it (``PENDING``, ``RUNNING``, ``CANCELLED``...).
    state: str
    #: Why it pends (``Resources``, ``Priority``, ``ReqNodeNotAvail, UnavailableNodes:n1``); ``None`` when running.
    reason: str
    nodes: tuple[str, ...]
    partition: str
    time_limit: str
    comment: str


@dataclass(frozen=True)
class ClusterSnapshot:
    """A cluster as one pass of ``sinfo`` and ``squeue`` saw it, at ``taken_at`` (the poller's monotonic clock)."""

    taken_at: float
    nodes: tuple[SlurmNode, ...]
    partitions: tuple[SlurmPartition, ...]
    jobs: tuple[SlurmJob, ...]

    def node(self, name: str) -> SlurmNode | None:
        return next((n for n in self.nodes if n.name == name), None)

    def job(self, job_id: str) -> SlurmJob | None:
        return next((j for j in self.jobs if j.id == job_id), None)


def _value(text: str) -> str:
    return "" if text == NULL else text


def split_state(text: str) -> tuple[str, str]:
    """``idle*`` -> (``idle``, ``*``); ``IDLE+DRAIN`` (scontrol) -> (``drained``, "")."""
    t = text.strip().lower()
    flags = ""
    while t and t[-1] in _FLAGS:
        flags = t[-1] + flags
        t = t[:-1]
    base, _, extra = t.partition("+")
    if "drain" in extra.split("+"):
        base = "draining" if base in ("allocated", "mixed", "completing") else "drained"
    return base, flags


def parse_sinfo(text: str) -> tuple[tuple[SlurmNode, ...], tuple[SlurmPartition, ...]]:
    """``sinfo -h -N -o SINFO_FORMAT``: one line per node and partition, merged into one node each."""
    nodes: dict[str, SlurmNode] = {}
    partitions: dict[str, SlurmPartition] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != 9:
            raise ValueError(f"sinfo printed {line!r}: expected 9 fields ({SINFO_FORMAT})")
        name, addr, state, part, avail, limit, cpus, memory, gres = fields
        default = part.endswith("*")
        part = part.rstrip("*")
        partitions.setdefault(part, SlurmPartition(part, default, avail == "up", limit))
        base, flags = split_state(state)
        known = nodes.get(name)
        if known is not None:
            nodes[name] = SlurmNode(**{**known.__dict__, "partitions": (*known.partitions, part)})
            continue
        nodes[name] = SlurmNode(
            name=name,
            addr=addr,
            state=base,
            flags=flags,
            partitions=(part,),
            cpus=int(cpus.rstrip("+")),
            memory_mib=int(memory.rstrip("+")),
            gres=_value(gres),
        )
    return tuple(nodes.values()), tuple(partitions.values())


def parse_squeue(text: str) -> tuple[SlurmJob, ...]:
    """``squeue -h -t all -o SQUEUE_FORMAT``."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|", 7)
        if len(fields) != 8:
            raise ValueError(f"squeue printed {line!r}: expected 8 fields ({SQUEUE_FORMAT})")
        job_id, name, state, reason, nodes, partition, limit, comment = fields
        jobs.append(
            SlurmJob(
                id=job_id,
                name=name,
                state=state,
                reason=reason,
                nodes=expand_hostlist(nodes),
                partition=partition,
                time_limit=limit,
                comment=_value(comment),
            )
        )
    return tuple(jobs)


_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:.]*)=")


def parse_scontrol_line(line: str) -> dict[str, str]:
    """One line of ``scontrol show -o ...``: its ``Key=Value`` pairs (a value may hold spaces: ``OS=Linux 6.1 #1``)."""
    keys = list(_KEY.finditer(line))
    out = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


@dataclass(frozen=True)
class NodeDetail:
    """A node as ``scontrol show -o node`` describes it."""

    name: str
    addr: str
    hostname: str
    cpus: int
    memory_mib: int
    gres: str
    partitions: tuple[str, ...]
    state: str
    reason: str
    arch: str


def parse_scontrol_nodes(text: str) -> tuple[NodeDetail, ...]:
    """``scontrol show -o node``; the CPUs are ``CPUEfctv`` (without specialised cores) when given, else ``CPUTot``."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        kv = {k.lower(): v for k, v in parse_scontrol_line(line).items()}
        if "nodename" not in kv:
            raise ValueError(f"scontrol printed {line!r}: no NodeName")
        out.append(
            NodeDetail(
                name=kv["nodename"],
                addr=kv.get("nodeaddr", ""),
                hostname=kv.get("nodehostname", ""),
                cpus=int(kv.get("cpuefctv") or kv.get("cputot") or 0),
                memory_mib=int(kv.get("realmemory") or 0),
                gres=_value(kv.get("gres", "")),
                partitions=tuple(p for p in _value(kv.get("partitions", "")).split(",") if p),
                state=split_state(kv.get("state", ""))[0],
                reason=kv.get("reason", ""),
                arch=kv.get("arch", ""),
            )
        )
    return tuple(out)


_NO_LIMIT = frozenset({"infinite", "unlimited", "not_set", "none", "n/a"})


def slurm_seconds(text: str, printed: bool = True) -> int | None:
    """A Slurm time in seconds; None for no limit (``infinite``, ``UNLIMITED``, ``NOT_SET``). ``printed``: as Slurm
    prints one (``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``); else as ``--time`` takes one (a bare number is minutes,
    ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``). Raises ``ValueError`` for anything else."""
    t = text.strip()
    if t.lower() in _NO_LIMIT:
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+(?::\d+){0,2})", t)
    if m is None:
        raise ValueError(f"{text!r} is not a Slurm time")
    days = int(m.group(1) or 0)
    parts = [int(p) for p in m.group(2).split(":")]
    if m.group(1) is not None:  # D-H, D-H:M, D-H:M:S
        h, mi, s = [*parts, 0, 0][:3]
    elif len(parts) == 3:
        h, mi, s = parts
    elif len(parts) == 2:
        h, mi, s = 0, parts[0], parts[1]
    elif printed:
        raise ValueError(f"{text!r} is not a time as Slurm prints one")
    else:
        h, mi, s = 0, parts[0], 0
    return ((days * 24 + h) * 60 + mi) * 60 + s


def format_slurm_time(seconds: int) -> str:
    """``seconds`` as Slurm prints a time (``1:00``, ``1:00:00``, ``2-00:00:00``)."""
    days, rest = divmod(max(0, seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    if days:
        return f"{days}-{h:02d}:{m:02d}:{s:02d}"
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


TIME_LEFT_FORMAT = "%P|%l|%L"


@dataclass(frozen=True)
class JobTime:
    """A job's partition, time limit and time left (``squeue -h -j ID -o TIME_LEFT_FORMAT``), in seconds; None: no
    limit."""

    partition: str
    limit: int | None
    left: int | None
    #: The limit as Slurm printed it.
    limit_text: str


def parse_time_left(text: str) -> JobTime:
    """The first line of ``squeue -h -j ID -o TIME_LEFT_FORMAT``."""
    line = next((x for x in text.splitlines() if x.strip()), "")
    fields = line.split("|")
    if len(fields) != 3:
        raise ValueError(f"squeue printed {line!r}: expected 3 fields ({TIME_LEFT_FORMAT})")
    partition, limit, left = fields
    return JobTime(partition, slurm_seconds(limit), slurm_seconds(left), limit.strip())


#: The container runtimes a cluster may offer, as :data:`RUNTIME_PROBE` names them: Pyxis, the SPANK plugin that adds
#: ``--container-image`` to ``srun`` (https://github.com/NVIDIA/pyxis, "srun --container-image"), and Apptainer or
#: Singularity, its former name, as commands (https://apptainer.org/docs/user/latest/, "apptainer exec").
RUNTIMES = ("pyxis", "apptainer", "singularity")
#: Prints the runtimes found, one a line: ``srun --help`` listing ``--container-image``, the commands on the PATH.
RUNTIME_PROBE = (
    "srun --help 2>&1 | grep -q -e --container-image && echo pyxis; "
    "for c in apptainer singularity; do command -v $c >/dev/null 2>&1 && echo $c; done; true"
)
#: What :data:`RUNTIME_PROBE` looks for, in words (a refusal says it).
RUNTIME_LOOKED_FOR = (
    "Pyxis (`--container-image` in `srun --help`) and Apptainer or Singularity (`apptainer`, `singularity` on the "
    "login node's PATH)"
)


def parse_runtimes(text: str) -> tuple[str, ...]:
    """The runtimes :data:`RUNTIME_PROBE` printed, in :data:`RUNTIMES` order."""
    found = {line.strip() for line in text.splitlines()}
    return tuple(r for r in RUNTIMES if r in found)


def parse_sbatch(text: str) -> str:
    """``sbatch --parsable``: the job id (before ``;cluster`` on a federation)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    job_id = first.split(";", 1)[0]
    if not job_id.isdigit():
        raise ValueError(f"sbatch printed {text.strip()!r}, not a job id")
    return job_id


def gres_gpus(gres: str) -> int:
    """GPUs in a node's GRES: ``gpu:8``, ``gpu:a100:2``, ``gpu:tesla:4(S:0-1)``, ``gpu:a100:2,shard:4``: 8, 2, 4, 2."""
    total = 0
    for item in _split_top(gres):
        parts = item.split("(", 1)[0].split(":")
        if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and parentheses."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [s for s in out if s]


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Slurm's host list (``scontrol show hostnames``): ``n[1-3,5],g1`` -> n1 n2 n3 n5 g1; ``n[01-02]`` keeps the
    zeros; "" and ``(null)`` -> ()."""
    out: list[str] = []
    for item in _split_top(_value(text)):
        m = re.fullmatch(r"(.*?)\[([^\]]+)\](.*)", item)
        if m is None:
            out.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not hi:
                out.extend(expand_hostlist(f"{prefix}{lo}{suffix}"))
                continue
            width = len(lo)
            for i in range(int(lo), int(hi) + 1):
                out.extend(expand_hostlist(f"{prefix}{str(i).zfill(width)}{suffix}"))
    return tuple(out)
