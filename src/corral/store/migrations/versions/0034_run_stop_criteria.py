"""runs.stop_on_master_done: the run's ``stop_criteria`` is ``master-done`` (dstack 0.22.5): once its master
job (``job_num`` 0) is done, the run ends done and its other jobs are stopped

Revision ID: 0034
Revises: 0032
Create Date: 2026-12-06 09:45:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0034"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stop_on_master_done", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("stop_on_master_done")
