"""instances.status_message: what a live instance's backend says of it (a Slurm allocation's node and the time
limit that bounds it, or why it still pends), shown in ``instances/list`` and ``fleets/get``

Revision ID: 0041
Revises: 0043
Create Date: 2026-12-06 14:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0041"
down_revision = "0043"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("status_message", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_column("status_message")
