"""instances.version: moved by every write of an instance's row, and ix_instances_live, a partial index of the live
instances' (id, fleet, version; status and deleted too, so that SQLite reads the index alone), so that a
scheduling pass reads that narrow state and reads whole only the instances that changed since its last pass

Revision ID: 0043
Revises: 0040
Create Date: 2026-12-06 14:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0043"
down_revision = "0040"
branch_labels = None
depends_on = None

_LIVE = "NOT deleted AND status != 'terminated'"


def upgrade() -> None:
    # a plain string default: SQLite then adds the column in place; a SQL expression would have Alembic copy the
    # table into a new one, and dropping the old one fails while jobs, volumes or gateways reference its rows
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("version", sa.Integer(), nullable=False, server_default="0"))
    op.create_index(
        "ix_instances_live",
        "instances",
        ["id", "fleet_id", "version", "status", "deleted"],
        unique=False,
        sqlite_where=sa.text(_LIVE),
        postgresql_where=sa.text(_LIVE),
    )


def downgrade() -> None:
    op.drop_index("ix_instances_live", table_name="instances")
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_column("version")
