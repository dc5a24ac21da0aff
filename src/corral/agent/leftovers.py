"""What an agent that was killed leaves on its host, found and ended from outside it: the processes of the
jobs it was running (their process groups, recorded in each job's ``state.json`` under the work dir) and the
sandbox slots it held (records naming its work dir). The local backend calls :func:`reap` when it terminates
an instance whose agent is gone or hung (``workers/hosts.py`` gave it up): a live agent does this itself as
it ends, a killed one cannot.

Standard library only, as the rest of the agent.
"""

from __future__ import annotations

import json
import os

from . import procs, sandbox
from .protocol import JobState


def reap(work_dir: str, config: sandbox.SandboxConfig) -> tuple[int, int]:
    """End the unfinished jobs' processes of the (dead) agent of ``work_dir`` and give back its sandbox slots:
    (processes killed, slots given back)."""
    killed = 0
    jobs_dir = os.path.join(work_dir, "jobs")
    for name in sorted(os.listdir(jobs_dir)) if os.path.isdir(jobs_dir) else ():
        try:
            with open(os.path.join(jobs_dir, name, "state.json")) as f:
                state = JobState.from_dict(json.load(f))
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if not state.finished and state.pid:
            killed += procs.reap_group(state.pid, state.started_at)
    return killed, sandbox.release_slots_of(work_dir, config)
