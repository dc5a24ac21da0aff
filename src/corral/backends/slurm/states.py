"""What Slurm's job states and pending reasons mean for corral's instances (pure).

* The pending rule: a submitted allocation waits while Slurm says it can eventually start, and is cancelled
  (its instance failed with Slurm's reason) when Slurm says it never can, or after the longest pending time
  (``CORRAL_SLURM_MAX_PENDING``). It is never resubmitted in a loop.
* A running allocation's end that corral did not ask for: ``NODE_FAIL``, ``PREEMPTED``, ``TIMEOUT``,
  ``BOOT_FAIL``, ``DEADLINE`` are interruptions (the provider took the nodes); ``FAILED`` and ``OUT_OF_MEMORY``
  errors; a node under it going ``down`` or ``fail`` is an interruption too. ``TIMEOUT`` names the time limit.
* The time limit (:func:`ending`): an allocation whose limit is the partition's or the cluster's is ended by the
  server shortly before it (:func:`end_margin`), so that its jobs end with that reason rather than killed by Slurm
  mid-way; one whose limit is the run's own ``max_duration`` is left to the agent, which stops the job at it.

Sources: the job state codes and reason codes of ``squeue`` (https://slurm.schedmd.com/squeue.html, "JOB STATE
CODES"; https://slurm.schedmd.com/job_reason_codes.html); node states of ``sinfo``
(https://slurm.schedmd.com/sinfo.html, "NODE STATE CODES").

May import: the standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

#: States of a job that holds or waits for nodes (``squeue %T``).
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"})
#: A job's end that is an interruption: the nodes were taken away (``retry.on_events: [interruption]``).
INTERRUPTED = frozenset({"NODE_FAIL", "PREEMPTED", "TIMEOUT", "BOOT_FAIL", "DEADLINE"})
#: A job's end that is an error of the job itself.
ERRORS = frozenset({"FAILED", "OUT_OF_MEMORY"})
#: Pending reasons after which the job can never start as submitted (job_reason_codes.html): a request no
#: partition, QOS, account or constraint of the cluster can ever satisfy.
NEVER = (
    "PartitionConfig", "BadConstraints", "PartitionNodeLimit", "PartitionTimeLimit", "AccountNotAllowed",
    "QOSNotAllowed", "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied", "ReqNodeNotAvail",
)  # fmt: skip
#: Node states (``sinfo %T``, lower case, a trailing ``*``, ``~``, ``#``... stripped) that end jobs on the node.
NODE_LOST = ("down", "fail", "failing")


def never_starts(reason: str, pinned: bool = False) -> bool:
    """Whether a job pending for ``reason`` can never start. ``ReqNodeNotAvail`` counts only for a job pinned
    to its nodes (``--nodelist``); one that asked for a partition waits for a node to come back."""
    head = reason.split(",")[0].strip()
    if head == "ReqNodeNotAvail":
        return pinned
    return head in NEVER


def pending_verdict(reason: str, pending_for: float, max_pending: float, pinned: bool = False) -> str | None:
    """None while the job may go on pending; else why it is given up (the instance's message)."""
    if never_starts(reason, pinned):
        return f"Slurm says the job can never start: {reason}"
    if max_pending > 0 and pending_for >= max_pending:
        return f"still pending after {int(pending_for)}s (the limit is {int(max_pending)}s): {reason or 'no reason'}"
    return None


#: How long before an allocation's time limit the server ends it (at most; half the limit for short ones).
END_MARGIN = 60.0


def end_margin(limit: float | None) -> float:
    return END_MARGIN if limit is None else min(END_MARGIN, limit / 2)


def ending(now: float, ends_at: float | None, limit: float | None) -> bool:
    """Whether an allocation that ends at ``ends_at`` (unix time; None: no limit) is to be ended by the server now."""
    return ends_at is not None and now >= ends_at - end_margin(limit)


def utc_minute(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def running_message(job_id: str, node: str, ends_at: float | None, bound: str) -> str:
    """The instance's status message while its allocation runs: where, and the time limit that bounds it."""
    if ends_at is None:
        return f"Slurm job {job_id} on {node}; no time limit ({bound})"
    return f"Slurm job {job_id} on {node}; ends by {utc_minute(ends_at)} (time limit {bound})"


def ending_message(job_id: str, ends_at: float, bound: str) -> str:
    """Why the server ended an allocation about to reach its time limit (its instances' and jobs' message)."""
    return (
        f"Slurm job {job_id} reaches its time limit ({bound}) at {utc_minute(ends_at)}: "
        "ended before Slurm kills it (an interruption)"
    )


def ended_message(job_id: str, state: str | None, bound: str | None = None) -> str:
    """Why an allocation is gone, for its instances and their jobs (``bound``: its time limit, described)."""
    if state is None:
        return f"Slurm job {job_id} is gone (cancelled or ended outside corral)"
    if state == "TIMEOUT":
        limit = f" ({bound})" if bound else ""
        return f"Slurm job {job_id} ended TIMEOUT: it reached its time limit{limit} (an interruption)"
    if state in INTERRUPTED:
        return f"Slurm job {job_id} ended {state}: the nodes were taken away (an interruption)"
    if state in ERRORS:
        return f"Slurm job {job_id} ended {state} (an error)"
    return f"Slurm job {job_id} ended {state} outside corral"


def node_lost(state: str) -> bool:
    bare = state.lower().rstrip("*~#!%$@^-+")
    return any(bare.startswith(s) for s in NODE_LOST)


@dataclass(frozen=True)
class NodeEndpoint:
    """One node of a running allocation, in rank order: its name, address, and its agent's endpoint once
    written (``url``, ``token``: None before)."""

    node: str
    addr: str
    url: str | None
    token: str | None


def parse_endpoints(text: str) -> list[NodeEndpoint]:
    """The lines ``<node> <addr> <endpoint JSON or ->`` the login node printed, in the allocation's node order.
    A line whose JSON is not (yet) whole counts as not written."""
    out: list[NodeEndpoint] = []
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) < 2 or not parts[0]:
            continue
        node, addr = parts[0], parts[1] or parts[0]
        url = token = None
        try:
            data = json.loads(parts[2]) if len(parts) == 3 else None
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("url"), str) and isinstance(data.get("token"), str):
            url, token = data["url"], data["token"]
        out.append(NodeEndpoint(node, addr, url, token))
    return out


def all_written(nodes: Iterable[NodeEndpoint], count: int) -> bool:
    listed = list(nodes)
    return len(listed) == count and all(n.url for n in listed)
