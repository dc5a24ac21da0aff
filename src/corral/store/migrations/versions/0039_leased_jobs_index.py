"""ix_jobs_leased: a partial index of the jobs some server holds a lease on, so that dropping the leases at a
SQLite server's start reads and writes those few jobs, not every job of the history

Revision ID: 0039
Revises: 0038
Create Date: 2026-12-06 11:50:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None

_LEASED = "lock_owner IS NOT NULL"


def upgrade() -> None:
    op.create_index(
        "ix_jobs_leased", "jobs", ["id"], unique=False, sqlite_where=sa.text(_LEASED), postgresql_where=sa.text(_LEASED)
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_leased", table_name="jobs")
