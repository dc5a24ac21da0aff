"""queue_changes: one row for each change to the queue (a job that came, left, or whose priority or status message
changed while it waited), written by triggers on jobs, so that a scheduling pass reads what changed since its last
read instead of the whole queue's state (``store/queue_reader.py``)

SQLite runs one write transaction at a time, so ``seq`` (AUTOINCREMENT) grows in commit order and a reader that
read every row up to ``seq`` has seen every change committed before it. Postgres commits concurrent transactions
out of the order of their ids and sequence values: its rows carry the writing transaction's id (``txid``), and a
reader goes on from the oldest transaction still running at its last read.

Revision ID: 0050
Revises: 0049
Create Date: 2026-12-07 00:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0050"
down_revision = "0049"
branch_labels = None
depends_on = None

#: A job row waiting to be placed (``QUEUED_SQL``), as ``OLD`` or ``NEW`` sees it.
_OLD_QUEUED = "OLD.status = 'submitted' AND OLD.instance_id IS NULL"
_NEW_QUEUED = "NEW.status = 'submitted' AND NEW.instance_id IS NULL"
#: What of a waiting job a pass reads (``queue_reader``): a change to anything else is not logged.
_COLUMNS = ("status", "instance_id", "priority", "status_message")


def _changed(differs: str) -> str:
    return " OR ".join(f"OLD.{c} {differs} NEW.{c}" for c in _COLUMNS)


#: SQLite: each trigger inserts the row itself (``seq`` numbers it).
_SQLITE_TRIGGERS = {
    "tr_jobs_queue_insert": f"""CREATE TRIGGER tr_jobs_queue_insert AFTER INSERT ON jobs
        WHEN {_NEW_QUEUED}
        BEGIN INSERT INTO queue_changes (job_id) VALUES (NEW.id); END""",
    "tr_jobs_queue_update": f"""CREATE TRIGGER tr_jobs_queue_update
        AFTER UPDATE OF {", ".join(_COLUMNS)} ON jobs
        WHEN (({_OLD_QUEUED}) OR ({_NEW_QUEUED})) AND ({_changed("IS NOT")})
        BEGIN INSERT INTO queue_changes (job_id) VALUES (NEW.id); END""",
    "tr_jobs_queue_delete": f"""CREATE TRIGGER tr_jobs_queue_delete AFTER DELETE ON jobs
        WHEN {_OLD_QUEUED}
        BEGIN INSERT INTO queue_changes (job_id) VALUES (OLD.id); END""",
}

#: Postgres: a row per change with the writing transaction's id
#: (https://www.postgresql.org/docs/current/functions-info.html#FUNCTIONS-PG-SNAPSHOT).
_PG_FUNCTION = """CREATE FUNCTION corral_queue_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queue_changes (job_id, txid)
    VALUES (CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END, pg_current_xact_id()::text::bigint);
    RETURN NULL;
END $$"""
_PG_TRIGGERS = {
    "tr_jobs_queue_insert": f"""CREATE TRIGGER tr_jobs_queue_insert AFTER INSERT ON jobs FOR EACH ROW
        WHEN ({_NEW_QUEUED}) EXECUTE FUNCTION corral_queue_change()""",
    "tr_jobs_queue_update": f"""CREATE TRIGGER tr_jobs_queue_update
        AFTER UPDATE OF {", ".join(_COLUMNS)} ON jobs FOR EACH ROW
        WHEN ((({_OLD_QUEUED}) OR ({_NEW_QUEUED})) AND ({_changed("IS DISTINCT FROM")}))
        EXECUTE FUNCTION corral_queue_change()""",
    "tr_jobs_queue_delete": f"""CREATE TRIGGER tr_jobs_queue_delete AFTER DELETE ON jobs FOR EACH ROW
        WHEN ({_OLD_QUEUED}) EXECUTE FUNCTION corral_queue_change()""",
}


def upgrade() -> None:
    op.create_table(
        "queue_changes",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("txid", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("seq"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_queue_changes_txid", "queue_changes", ["txid", "job_id"], unique=False)
    if op.get_bind().dialect.name == "sqlite":
        for ddl in _SQLITE_TRIGGERS.values():
            op.execute(sa.text(ddl))
        return
    op.execute(sa.text(_PG_FUNCTION))
    for ddl in _PG_TRIGGERS.values():
        op.execute(sa.text(ddl))


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for name in _SQLITE_TRIGGERS:
        op.execute(sa.text(f"DROP TRIGGER IF EXISTS {name}" + ("" if sqlite else " ON jobs")))
    if not sqlite:
        op.execute(sa.text("DROP FUNCTION IF EXISTS corral_queue_change()"))
    op.drop_index("ix_queue_changes_txid", table_name="queue_changes")
    op.drop_table("queue_changes")
