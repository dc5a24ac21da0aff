"""The sweep of corral's files on a cluster's login node: what ended allocations leave in ``~/.corral/slurm/``.

Every allocation writes its output to ``<jobid>.out`` and its agents' endpoints to ``<jobid>/`` (:mod:`.batch`).
Terminating an instance removes them, but an allocation also ends by other ways: cancelled by a failed
provisioning, by the reaper, ahead of its time limit, or by Slurm itself; and a node's step daemon may write its
cancellation line into the output file after Slurm stopped listing the job, bringing a removed file back. The sweep
removes, in one command on the login node per pass, the files of every job that

* Slurm does not list as holding or waiting for nodes (``states.ACTIVE``: pending, running, completing...), asked by
  that same command *after* it listed the files, so a job submitted meanwhile is never taken for an ended one;
* no live instance row records (its ``job_id``, given on the command's input);
* was not written for ``grace`` seconds (the file's or directory's modification time): provisioning reads the end of
  an allocation's output the moment it sees it end, to say why it died, before its row records the job; and a late
  write of the step daemon starts the grace again, so the next pass after it removes the file it brought back.

Nothing but ``<digits>.out`` files and ``<digits>`` directories is looked at. A pass with nothing older than the
grace ends after ``find``, without asking Slurm, and logs nothing.

Sources: find(1) (GNU findutils: ``-mmin`` takes a fraction of minutes, ``-printf '%f'`` the name) and squeue(1)
(``-t all``, ``-o '%i %T'``: the job's id and its state, upper case).

May import: the standard library and ``.states``.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from corral.backends.slurm.states import ACTIVE

#: Seconds a file of an ended job is kept after its last write.
GRACE_S = 60.0
#: Seconds between two sweeps of a cluster (the host check asks more often).
EVERY_S = 30.0
#: The sweep's exit status when Slurm could not be asked (nothing is removed then).
NO_SQUEUE = 3


@dataclass(frozen=True)
class Swept:
    """What one pass removed (``<jobid>.out``, ``<jobid>``), or why it could not look (None: it did)."""

    removed: tuple[str, ...]
    error: str | None = None


def command(grace: float) -> str:
    """The sweep as one shell command of the cluster user on the login node; the job ids to keep on its input,
    one a line. Removes with one ``rm`` and prints each name it removed."""
    minutes = f"{max(grace, 0.0) / 60:.4f}"
    states = "|".join(sorted(ACTIVE))
    return (
        'rows=$(tr "\\n" " "); cd "$HOME/.corral/slurm" 2>/dev/null || exit 0; '
        f"old=$(find . -mindepth 1 -maxdepth 1 -mmin +{minutes} "
        r"\( -type f -name '[0-9]*.out' -o -type d -name '[0-9]*' \) -printf '%f\n' | grep -E '^[0-9]+(\.out)?$'); "
        '[ -n "$old" ] || exit 0; '
        f"listed=$(squeue -h -u \"$(id -un)\" -t all -o '%i %T') || exit {NO_SQUEUE}; "
        "active=$(printf '%s\\n' \"$listed\" | awk " + shlex.quote(f"$2 ~ /^({states})$/ {{print $1}}") + "); "
        'keep=" $rows $(printf "%s " $active) "; '
        'gone=""; for f in $old; do case "$keep" in *" ${f%.out} "*) ;; *) gone="$gone $f";; esac; done; '
        '[ -n "$gone" ] || exit 0; rm -rf -- $gone; for f in $gone; do [ -e "$f" ] || echo "$f"; done'
    )


def keep_input(job_ids: Iterable[str]) -> str:
    """The command's input: the job ids live rows record (digits only), one a line."""
    return "".join(f"{j}\n" for j in sorted(set(job_ids)) if j.isdigit()) or "\n"


def parse(exit_status: int, stdout: str, stderr: str) -> Swept:
    """What the command said: the names it removed, or why it removed nothing."""
    if exit_status == NO_SQUEUE:
        return Swept((), f"squeue failed: {' '.join(stderr.split())[:300]}")
    if exit_status != 0:
        return Swept((), f"exit status {exit_status}: {' '.join(stderr.split())[:300]}")
    return Swept(tuple(line.strip() for line in stdout.splitlines() if line.strip()))
