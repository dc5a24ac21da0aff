"""The batch script corral submits to Slurm for an allocation (pure: text in, text out).

One script per allocation: ``--nodes=N --ntasks-per-node=1`` (a gang of N instances is one Slurm job, all or
none), whose one ``srun`` step starts corral's agent zipapp on every node as the cluster user. The agent, a
content-hashed zipapp uploaded once per cluster to the shared home (:func:`agent_path`), binds the node's
address (``NodeAddr``) on a port it picks, works in a node-local directory (``$TMPDIR`` or ``/tmp``) and writes
``{url, token}`` to ``~/.corral/slurm/<jobid>/<node>.json`` (:func:`endpoint_path`), where the server reads it
through the login node.

The allocation's time limit (:func:`time_bound`): the run's ``max_duration`` rounded up to whole minutes, else the
cluster's ``time_limit``, never above the partition's limit (``MaxTime``, as ``sinfo %l`` prints it); with neither,
no ``--time`` is sent and the partition's default applies.

The job carries its identity for the reaper: ``--job-name=corral-<first row id>`` and
``--comment=corral:<server id>:<row ids>``. No ``--signal`` is asked for: the server ends an allocation itself
shortly before its time limit (``states.ending``), with the reason; a TERM from ``scancel`` or from Slurm at the
limit reaches the batch shell, which passes it on to the agents (``srun`` forwards it to its tasks), which stop
their jobs and exit. ``--no-requeue``: Slurm never restarts an allocation behind corral's back. The job's own output
goes to ``~/.corral/slurm/<jobid>.out`` so a job that dies before its agent starts says why.

Site options (``account``, ``qos``, ``reservation``, ``time_limit`` and free ``sbatch_options``) come from the
cluster's configuration; options corral sets itself are protected (:data:`PROTECTED`) and refused there.

Sources: sbatch's options and the ``%j`` output pattern, https://slurm.schedmd.com/sbatch.html; ``#SBATCH``
lines are not expanded by a shell, so paths in them are absolute (seen on Slurm 22.05.8). sbatch's ``--signal``
"may be sent up to 60 seconds earlier than specified" (sbatch(1)): with a limit of a minute or two it came at once.

May import: the standard library and ``.parse`` (Slurm's time format).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from corral.backends.slurm.parse import format_slurm_time, slurm_seconds

#: Where corral keeps its files in the cluster user's (shared) home.
CORRAL_DIR = ".corral"
#: sbatch options corral sets itself: a site's ``sbatch_options`` may not name them (SkyPilot protects the
#: same kind of list: its ``slurm.sbatch_options``).
PROTECTED = frozenset(
    {
        "job-name", "J", "comment", "output", "o", "error", "e", "input", "i", "requeue", "no-requeue",
        "partition", "p", "nodes", "N", "ntasks", "n", "ntasks-per-node", "cpus-per-task", "c", "mem",
        "mem-per-cpu", "mem-per-gpu", "gres", "gpus", "G", "gpus-per-node", "signal", "time", "t", "wrap",
        "array", "a", "account", "A", "qos", "q", "reservation", "parsable", "wait", "W", "chdir", "D",
        "export", "uid", "gid",
    }
)  # fmt: skip
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")
#: Slurm's time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (sbatch --time).
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^UNLIMITED$|^INFINITE$")


def check_sbatch_options(options: Mapping[str, str | None]) -> None:
    """Raise ``ValueError`` naming the first option a site may not pass (a protected one, a bad name, or a
    value that would break the script's line)."""
    for name, value in options.items():
        bare = name.lstrip("-")
        if not _NAME.match(bare):
            raise ValueError(f"sbatch_options: {name!r} is not an sbatch option name (write it as 'constraint')")
        if bare in PROTECTED:
            raise ValueError(
                f"sbatch_options: {bare!r} is set by corral itself; use the cluster's own field "
                "(account, qos, reservation, time_limit) or leave it out"
            )
        if value is not None and ("\n" in value or "\r" in value):
            raise ValueError(f"sbatch_options: the value of {bare!r} must be one line")


def check_time_limit(value: str) -> None:
    """Raise ``ValueError`` unless ``value`` is one of Slurm's time formats."""
    if not _TIME.match(value):
        raise ValueError(f"time_limit: {value!r} is not a Slurm time (minutes, HH:MM:SS or D-HH:MM:SS, e.g. '4:00:00')")


def slurm_minutes(seconds: float) -> str:
    """``seconds`` as sbatch's ``--time`` in whole minutes, rounded up (at least 1)."""
    return str(max(1, -(-int(seconds) // 60)))


@dataclass(frozen=True)
class SiteOptions:
    """What a cluster's configuration adds to every job it runs (corral's extensions of dstack's fields)."""

    account: str | None = None
    qos: str | None = None
    reservation: str | None = None
    #: sbatch's ``--time`` (Slurm's format); None: the partition's default applies.
    time_limit: str | None = None
    #: Further options, name (without dashes) to value (None: a flag).
    sbatch_options: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class BatchRequest:
    """One allocation: its instance rows (one per node), where and what to ask Slurm for."""

    row_ids: tuple[str, ...]
    server_id: str
    partitions: tuple[str, ...]
    cpus: int
    memory_mib: int
    #: GPUs per node (0: none), and their GRES type when the site names one.
    gpus: int
    gpu_type: str | None
    #: The cluster user's home (absolute: ``#SBATCH`` lines expand nothing).
    home: str
    agent_hash: str
    site: SiteOptions = SiteOptions()
    #: The run's ``max_duration`` in seconds, when it has one (``--time`` then, unless the site's is shorter).
    max_duration: float | None = None
    python: str = "python3"
    #: The partition's time limit as ``sinfo %l`` prints it (``1:00:00``, ``infinite``); None: not known.
    partition_limit: str | None = None


#: What set an allocation's time limit when it is the run's own (the agent stops the job at it).
RUN_SOURCE = "the run's max_duration"


@dataclass(frozen=True)
class TimeBound:
    """An allocation's time limit: in seconds (None: none known; the partition's default applies, or no limit),
    sbatch's ``--time`` for it (None: not sent), and what set it (for the instance's message)."""

    seconds: int | None
    sbatch: str | None
    source: str


def time_bound(
    max_duration: float | None, site_limit: str | None, partition: str, partition_limit: str | None
) -> TimeBound:
    """The smallest of the run's ``max_duration`` (rounded up to whole minutes), the cluster's ``time_limit`` and
    the partition's limit; the cluster's applies only when the run has none. Without either, no ``--time``."""
    limit = _seconds(partition_limit, printed=True)
    own = f"partition {partition}'s time limit"
    if max_duration is not None and max_duration > 0:
        text = slurm_minutes(max_duration)
        asked: int | None = int(text) * 60
        source = RUN_SOURCE
    elif site_limit:
        text, asked, source = site_limit, _seconds(site_limit, printed=False), "the cluster's time_limit"
    else:
        return TimeBound(limit, None, own)
    if limit is not None and (asked is None or asked > limit):
        return TimeBound(limit, slurm_minutes(limit), own)
    return TimeBound(asked, text, source)


def _seconds(text: str | None, printed: bool) -> int | None:
    if text is None:
        return None
    try:
        return slurm_seconds(text, printed=printed)
    except ValueError:
        return None


def describe(bound: TimeBound) -> str:
    """``1:00:00, partition cpu's time limit``: the bound for a message (``partition cpu's time limit: none``)."""
    if bound.seconds is None:
        return f"{bound.source}: none"
    return f"{format_slurm_time(bound.seconds)}, {bound.source}"


def job_name(row_ids: tuple[str, ...]) -> str:
    return f"corral-{row_ids[0]}"


def job_comment(server_id: str, row_ids: tuple[str, ...]) -> str:
    return f"corral:{server_id}:{','.join(row_ids)}"


def parse_comment(comment: str) -> tuple[str, tuple[str, ...]] | None:
    """``(server id, row ids)`` of a corral job's comment; None for any other job's."""
    parts = comment.split(":")
    if len(parts) != 3 or parts[0] != "corral" or not parts[1] or not parts[2]:
        return None
    return parts[1], tuple(parts[2].split(","))


def slurm_dir(home: str) -> str:
    return f"{home}/{CORRAL_DIR}/slurm"


def agent_path(home: str, agent_hash: str) -> str:
    """The uploaded agent zipapp: named by its content hash, so a cluster holds each build once."""
    return f"{home}/{CORRAL_DIR}/agent/agent-{agent_hash[:16]}.pyz"


def endpoint_path(home: str, job_id: str, node: str) -> str:
    """Where the agent of ``node`` in job ``job_id`` writes ``{url, token}``."""
    return f"{slurm_dir(home)}/{job_id}/{node}.json"


def _gres(gpus: int, gpu_type: str | None) -> str:
    return f"gpu:{gpu_type}:{gpus}" if gpu_type else f"gpu:{gpus}"


def _time(req: BatchRequest) -> str | None:
    partition = req.partitions[0] if req.partitions else ""
    return time_bound(req.max_duration, req.site.time_limit, partition, req.partition_limit).sbatch


def directives(req: BatchRequest) -> list[str]:
    """The ``#SBATCH`` options, in order (without the ``#SBATCH`` prefix)."""
    opts = [
        f"--job-name={job_name(req.row_ids)}",
        f"--comment={job_comment(req.server_id, req.row_ids)}",
        f"--output={slurm_dir(req.home)}/%j.out",
        "--no-requeue",
        f"--partition={','.join(req.partitions)}",
        f"--nodes={len(req.row_ids)}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={max(1, req.cpus)}",
        f"--mem={max(1, req.memory_mib)}M",
    ]
    if req.gpus > 0:
        opts.append(f"--gres={_gres(req.gpus, req.gpu_type)}")
    limit = _time(req)
    if limit:
        opts.append(f"--time={limit}")
    site = req.site
    for name, value in (("account", site.account), ("qos", site.qos), ("reservation", site.reservation)):
        if value:
            opts.append(f"--{name}={value}")
    for name, extra in site.sbatch_options:
        opts.append(f"--{name}" if extra is None else f"--{name}={extra}")
    return opts


#: One node's step: the node's address from Slurm, a node-local work dir, the agent in the foreground (the shell
#: waits for it to remove the work dir; ``trap :`` lets TERM reach the agent while the shell survives it).
_NODE = (
    'addr=$(scontrol show -o node "$SLURMD_NODENAME" | tr " " "\\n" | sed -n "s/^NodeAddr=//p"); '
    'w="${{TMPDIR:-/tmp}}/corral-$(id -un)-$SLURM_JOB_ID"; mkdir -p "$w"; trap : TERM; '
    '{python} -I {agent} serve --host "${{addr:-0.0.0.0}}" --port 0 --sandbox off --work-dir "$w/agent" '
    '--endpoint-file "{endpoints}/$SLURM_JOB_ID/$SLURMD_NODENAME.json"; '
    'rm -rf "$w"'
)


def script(req: BatchRequest) -> str:
    """The whole batch script for ``req`` (run by ``sbatch --parsable`` from stdin)."""
    if not req.row_ids:
        raise ValueError("an allocation needs at least one instance row")
    node = _NODE.format(
        python=shlex.quote(req.python),
        agent=shlex.quote(agent_path(req.home, req.agent_hash)),
        endpoints=slurm_dir(req.home),
    )
    lines = ["#!/bin/sh", *(f"#SBATCH {d}" for d in directives(req))]
    lines += [
        "set -u",
        f'd={shlex.quote(slurm_dir(req.home))}/"$SLURM_JOB_ID"',
        'mkdir -p "$d" && chmod 700 "$d"',
        "umask 077",
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=0 sh -c {shlex.quote(node)} &",
        "step=$!",
        # TERM from scancel or from Slurm at the time limit: the agents stop their jobs, then exit
        "trap 'kill -TERM \"$step\" 2>/dev/null' TERM",
        'wait "$step"; status=$?',
        # a trapped signal ends the first wait early: wait again for the agents to finish their shutdown
        'while kill -0 "$step" 2>/dev/null; do wait "$step"; status=$?; done',
        'rm -rf "$d"',
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"
