"""queue_changes: one row for each change to the queue (a job that came, left, or whose priority or status message
changed while it waited), written by triggers on jobs on SQLite, so that a scheduling pass reads what changed since
its last read instead of the whole queue's state

SQLite runs one write transaction at a time, so ``seq`` (AUTOINCREMENT) grows in commit order and a reader that
read every row up to ``seq`` has seen every change committed before it. Postgres commits concurrent transactions
in another order than their sequence values; its scheduling passes read the queue's state whole, and the table
stays empty there.

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
_CHANGED = (
    "OLD.status IS NOT NEW.status OR OLD.instance_id IS NOT NEW.instance_id"
    " OR OLD.priority IS NOT NEW.priority OR OLD.status_message IS NOT NEW.status_message"
)

_TRIGGERS = {
    "tr_jobs_queue_insert": f"""CREATE TRIGGER tr_jobs_queue_insert AFTER INSERT ON jobs
        WHEN {_NEW_QUEUED}
        BEGIN INSERT INTO queue_changes (job_id) VALUES (NEW.id); END""",
    "tr_jobs_queue_update": f"""CREATE TRIGGER tr_jobs_queue_update
        AFTER UPDATE OF status, instance_id, priority, status_message ON jobs
        WHEN (({_OLD_QUEUED}) OR ({_NEW_QUEUED})) AND ({_CHANGED})
        BEGIN INSERT INTO queue_changes (job_id) VALUES (NEW.id); END""",
    "tr_jobs_queue_delete": f"""CREATE TRIGGER tr_jobs_queue_delete AFTER DELETE ON jobs
        WHEN {_OLD_QUEUED}
        BEGIN INSERT INTO queue_changes (job_id) VALUES (OLD.id); END""",
}


def upgrade() -> None:
    op.create_table(
        "queue_changes",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
        sqlite_autoincrement=True,
    )
    if op.get_bind().dialect.name == "sqlite":
        for ddl in _TRIGGERS.values():
            op.execute(sa.text(ddl))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for name in _TRIGGERS:
            op.execute(sa.text(f"DROP TRIGGER IF EXISTS {name}"))
    op.drop_table("queue_changes")
