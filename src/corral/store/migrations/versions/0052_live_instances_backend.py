"""ix_instances_live_backend: the live instances by backend, so that a scheduling pass's count of a backend's
instances (``store/snapshot.backend_usage_and_blocks``) and the commit point's recount of its limit
(``store/capacity_counts.backend_instances``) read that backend's live instances, not every instance the history
left terminated (``LIVE_INSTANCE_SQL``)

Revision ID: 0052
Revises: 0051
Create Date: 2026-12-07 19:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0052"
down_revision = "0051"
branch_labels = None
depends_on = None

#: ``store/tables.LIVE_INSTANCE_SQL`` as it was when this revision was written.
_LIVE = "NOT deleted AND status != 'terminated'"


def upgrade() -> None:
    op.create_index(
        "ix_instances_live_backend",
        "instances",
        ["backend"],
        unique=False,
        sqlite_where=sa.text(_LIVE),
        postgresql_where=sa.text(_LIVE),
    )


def downgrade() -> None:
    op.drop_index("ix_instances_live_backend", table_name="instances")
