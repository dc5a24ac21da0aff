"""What the Slurm backend asks of the server while it provisions (``backends.slurm.compute.Hooks``): this
server's id (in every Slurm job's comment, for the reaper), the statuses of instance rows (an allocation whose
rows are no longer wanted is cancelled while it pends), a way to say on the waiting jobs and their instances why
they wait (Slurm's pending reason, shown as the run's and the instance's status message), and the shortest
``max_duration`` of the jobs an allocation is for (its ``--time``).

May import: what ``corral.services`` may.
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.backends.slurm.compute import Hooks
from corral.services import cloud_backends
from corral.store import fleets as fleet_store
from corral.store.db import Database
from corral.store.gangs import note_waiting, placed_max_duration


def slurm_hooks(db: Database) -> Hooks:
    async def server_id() -> str:
        return await cloud_backends.server_id(db)

    async def row_statuses(ids: list[str]) -> Mapping[str, str]:
        async with db.read() as conn:
            return await fleet_store.instance_statuses(conn, ids)

    async def note(ids: list[str], message: str) -> None:
        async with db.write() as conn:
            await note_waiting(conn, ids, message, on_instances=True)

    async def max_duration(ids: list[str]) -> float | None:
        async with db.read() as conn:
            return await placed_max_duration(conn, ids)

    return Hooks(server_id, row_statuses, note, max_duration)
