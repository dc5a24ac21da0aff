"""``instances/list`` and ``fleets/list`` as the store reads them: every instance, the deleted ones of the history
too, as dstack 0.22.5's ``instances/list`` shows them (its ``list_projects_instance_models``), and the live fleets
with their live instances alone; dstack's order and keyset pages, dstack's ``only_active``, and the query plans
that read an index in the list's order, and the live rows' own indexes rather than every row the history left."""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.records import InstanceQuery
from corral.store import fleets, tables
from corral.store.db import Database
from corral.store.migrate import upgrade
from store_rows import admin_and_project

#: Fleet ``f``'s instances: ``(id, created_at, status, backend, termination_reason)``. Two share a ``created_at``, so
#: that the keyset's tie on ``id`` is exercised; ``t1`` is a cloud instance terminated and not deleted (as dstack leaves
#: one whose provisioning failed until its fleet replaces it), ``e1`` an SSH host that failed (listed by its fleet with
#: its error).
KEPT = [
    ("i1", 10.0, "idle", "ssh", None),
    ("i2", 20.0, "busy", "ssh", None),
    ("i3", 20.0, "provisioning", "ssh", None),
    ("i4", 30.0, "terminating", "ssh", None),
    ("t1", 25.0, "terminated", "aws", "idle_timeout"),
    ("e1", 5.0, "terminated", "ssh", "error"),
]
#: The history: terminated cloud instances kept (older than the rest) and deleted ones.
OLD = [(f"k{k:03d}", k / 1000, "terminated", "aws", "idle_timeout") for k in range(1, 300)]
DELETED = [(f"d{k:04d}", k / 10000, "terminated", "ssh", "terminated_by_user") for k in range(1, 3000)]


async def _fleet(conn: AsyncConnection, fleet_id: str, created_at: float, deleted: bool) -> None:
    await conn.execute(
        sa.insert(tables.fleets).values(
            id=fleet_id, project_id="p", name=fleet_id, created_at=created_at, last_processed_at=created_at,
            status="terminated" if deleted else "active", spec="{}", deleted=deleted,
        )
    )  # fmt: skip


async def _state(conn: AsyncConnection) -> None:
    await admin_and_project(conn, 0.0)
    await _fleet(conn, "f", 1.0, False)
    for k in range(300):  # deleted fleets of the history
        await _fleet(conn, f"old{k:03d}", 0.5, True)
    rows = [(*row, False) for row in KEPT + OLD] + [(*row, True) for row in DELETED]
    await conn.execute(
        sa.insert(tables.instances),
        [
            {"id": iid, "project_id": "p", "fleet_id": "f", "name": iid, "instance_num": n, "status": status,
             "unreachable": False, "backend": backend, "busy_blocks": 0, "created_at": at, "last_processed_at": at,
             "termination_reason": reason, "deleted": deleted}
            for n, (iid, at, status, backend, reason, deleted) in enumerate(rows)
        ],
    )  # fmt: skip
    if conn.dialect.name == "postgresql":
        await conn.exec_driver_sql("ANALYZE instances")
        await conn.exec_driver_sql("ANALYZE fleets")


async def test_instances_list_pages_the_live_instances_in_dstacks_order(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        await _state(conn)
    async with db.read() as conn:

        async def ids(**kw: object) -> list[str]:
            return [i.id for i in await fleets.instance_page(conn, InstanceQuery(["p"], **kw))]  # type: ignore[arg-type]

        # newest first, a tie by id ascending; the deleted instances of the history too, as dstack lists them
        listed = await ids(limit=5000)
        assert listed[:6] == ["i4", "t1", "i2", "i3", "i1", "e1"] and len(listed) == len(KEPT) + len(OLD) + len(DELETED)
        assert {f"d{k:04d}" for k in range(1, 3000)} <= set(listed)
        assert await ids(ascending=True, after=(5.0, None)) == ["i1", "i3", "i2", "t1", "i4"]
        # keyset pages: the previous page's last (created_at, id), as dstack's prev_created_at and prev_id
        assert await ids(limit=2) == ["i4", "t1"]
        assert await ids(limit=2, after=(25.0, "t1")) == ["i2", "i3"]
        assert await ids(limit=2, after=(20.0, "i2")) == ["i3", "i1"]
        assert await ids(limit=2, after=(20.0, None)) == ["i1", "e1"]  # no id: strictly older
        assert await ids(ascending=True, limit=2, after=(20.0, "i3")) == ["i2", "t1"]
        # dstack's only_active: idle and busy alone
        assert await ids(only_active=True) == ["i2", "i1"]
        assert await ids(fleet_ids=["elsewhere"]) == []
        assert [i.id for i in await fleets.instance_page(conn, InstanceQuery([]))] == []
    await db.dispose()


async def test_fleets_list_shows_live_fleets_with_their_live_instances(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        await _state(conn)
    async with db.read() as conn:
        (listed,) = await fleets.list_fleets(conn, ["p"])
        # the instances that count, by number: terminating ones still count, an SSH host that failed is shown with
        # its error, the terminated ones are history
        assert listed.id == "f" and [i.id for i in listed.instances] == ["i1", "i2", "i3", "i4", "e1"]
        assert [f.id for f in await fleets.list_fleets(conn, None, limit=10)] == ["f"]
    await db.dispose()


async def _plan(conn: AsyncConnection, statement: sa.ClauseElement, sqlite: bool) -> str:
    sql = str(statement.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    explain = "EXPLAIN QUERY PLAN" if sqlite else "EXPLAIN"
    return " | ".join(str(r[-1] if sqlite else r[0]) for r in (await conn.exec_driver_sql(f"{explain} {sql}")).all())


async def test_the_lists_read_the_live_rows_own_indexes(db_url: str) -> None:
    """A page of instances is read from an index in its order (every instance, as dstack lists them), a page of
    fleets and the instances a fleet lists from partial indexes of the live rows, the idle and busy instances by
    their status, not from indexes (or a scan) of every row the history left: neither ``only_active`` nor a fleet's
    list reads the terminated instances."""
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        await _state(conn)
    async with db.read() as conn:
        if not db.is_sqlite:  # Postgres picks by cost: on a small table, with the cheaper ways off, the index it can
            await conn.execute(sa.text("SET LOCAL enable_seqscan = off"))
            await conn.execute(sa.text("SET LOCAL enable_bitmapscan = off"))
        ordered = ("ix_instances_created",)
        cases = [
            (fleets.instance_page_query(InstanceQuery(["p"])), ordered),
            (fleets.instance_page_query(InstanceQuery(None, after=(20.0, "i2"))), ordered),
            (fleets.instance_page_query(InstanceQuery(None, after=(20.0, "i2"), ascending=True)), ordered),
            # by status (SQLite), or by an index of the instances not terminated (Postgres)
            (
                fleets.instance_page_query(InstanceQuery(["p"], only_active=True)),
                ("ix_instances_status", "ix_instances_live_fleet"),
            ),
            (fleets._LIVE_FLEETS, ("ix_fleets_live_created",)),
            (fleets._ACTIVE_INSTANCES_OF.params(ids=["f", "g"]), ("ix_instances_live_fleet",)),
        ]
        for statement, indexes in cases:
            plan = await _plan(conn, statement, db.is_sqlite)
            assert any(re.search(rf"\b{index}\b", plan) for index in indexes), (indexes, plan.replace(" | ", "\n"))
    await db.dispose()


async def test_a_page_after_an_instance_never_holds_it_whatever_its_times_rounding(db_url: str) -> None:
    """The wire gives a time to the microsecond; the stored one is a double, which steps by 0.24 µs today. This
    stored time is 0.48 µs after its wire form (found by walking the doubles near it), and a half-microsecond
    "same time" window computed in doubles left it out: the page after it, ascending, held it again."""
    from datetime import datetime

    from corral.domain.times import epoch_seconds
    from corral.services.serialize import iso

    stored = 1796572867.1462555
    wire = iso(stored)
    assert wire == "2026-12-06T16:01:07.146255Z"
    at = epoch_seconds(datetime.fromisoformat(wire.replace("Z", "+00:00")))
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        await admin_and_project(conn, 0.0)
        await _fleet(conn, "f", 1.0, False)
        await conn.execute(
            sa.insert(tables.instances).values(
                id="only", project_id="p", fleet_id="f", name="only", instance_num=0, status="idle",
                unreachable=False, backend="ssh", busy_blocks=0, created_at=stored, last_processed_at=stored,
                deleted=False,
            )
        )  # fmt: skip
    async with db.read() as conn:
        for ascending in (False, True):
            assert await fleets.instance_page(conn, InstanceQuery(["p"], after=(at, "only"), ascending=ascending)) == []
    await db.dispose()


async def test_include_imported_adds_the_fleets_exported_to_the_projects_and_their_instances(db_url: str) -> None:
    """Fleet ``f`` of ``p`` exported to ``q`` (explicitly), fleet ``g`` of ``p`` to every project (a global export):
    ``q``'s lists with ``include_imported`` hold both and their instances, without it neither; a caller in no
    project imports nothing, not even a global export."""
    db = Database(db_url)
    await upgrade(db)
    async with db.write() as conn:
        await admin_and_project(conn, 0.0)
        await conn.execute(
            sa.insert(tables.projects).values(
                id="q", name="other", owner_id="u", created_at=0.0, is_public=False, deleted=False, backends="[]"
            )
        )
        for fid, at in (("f", 1.0), ("g", 2.0)):
            await _fleet(conn, fid, at, False)
            await conn.execute(
                sa.insert(tables.instances).values(
                    id=f"{fid}0", project_id="p", fleet_id=fid, name=f"{fid}0", instance_num=0, status="idle",
                    unreachable=False, backend="local", busy_blocks=0, created_at=at, last_processed_at=at,
                    deleted=False,
                )
            )  # fmt: skip
        for eid, is_global, fid in (("e1", False, "f"), ("e2", True, "g")):
            await conn.execute(
                sa.insert(tables.exports).values(id=eid, project_id="p", name=eid, is_global=is_global, created_at=0.0)
            )
            await conn.execute(sa.insert(tables.exported_fleets).values(export_id=eid, fleet_id=fid))
        await conn.execute(sa.insert(tables.export_importers).values(id="i1", export_id="e1", project_id="q"))
    async with db.read() as conn:

        async def fleet_ids(project_ids: list[str], imported: bool) -> list[str]:
            return [f.id for f in await fleets.list_fleets(conn, project_ids, limit=10, include_imported=imported)]

        async def instance_ids(project_ids: list[str], imported: bool) -> list[str]:
            query = InstanceQuery(project_ids, include_imported=imported)
            return [i.id for i in await fleets.instance_page(conn, query)]

        assert await fleet_ids(["q"], False) == [] and await instance_ids(["q"], False) == []
        assert await fleet_ids(["q"], True) == ["g", "f"] and await instance_ids(["q"], True) == ["g0", "f0"]
        assert await fleet_ids([], True) == [] and await instance_ids([], True) == []
        assert await fleet_ids(["p"], True) == ["g", "f"]  # its own, listed once
    await db.dispose()
