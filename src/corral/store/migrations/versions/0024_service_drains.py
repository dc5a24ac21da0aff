"""service_drains: which server replicas may have requests in flight to which service replica (a row is
written before a server's first request to a replica and removed once the replica left that server's
route with nothing in flight), so that a drained replica is stopped as soon as nothing is in flight to
it rather than at the end of the drain timeout

Revision ID: 0024
Revises: 0019
Create Date: 2026-12-01 23:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "service_drains",
        sa.Column("job_id", sa.String(36), primary_key=True),
        sa.Column("server", sa.String(100), primary_key=True),
        sa.Column("since", sa.Float(precision=53), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("service_drains")
