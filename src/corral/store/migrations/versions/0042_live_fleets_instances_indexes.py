"""ix_fleets_live_created, ix_instances_live_created, ix_instances_live_fleet: partial indexes of the fleets and
instances not deleted, and of the instances a fleet lists, so that fleets/list, instances/list and a fleet's
instances read those alone, not every terminated instance and deleted fleet of the history

Revision ID: 0042
Revises: 0041
Create Date: 2026-12-06 15:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0042"
down_revision = "0041"
branch_labels = None
depends_on = None

_COUNTED = "NOT deleted AND (status != 'terminated' OR (backend = 'ssh' AND termination_reason = 'error'))"
#: (name, table, columns, SQLite's predicate, Postgres')
_INDEXES = (
    ("ix_fleets_live_created", "fleets", ["created_at", "id"], "deleted = 0", "deleted = false"),
    ("ix_instances_live_created", "instances", ["created_at", "id"], "deleted = 0", "deleted = false"),
    ("ix_instances_live_fleet", "instances", ["fleet_id", "instance_num"], _COUNTED, _COUNTED),
)


def upgrade() -> None:
    for name, table, columns, sqlite_where, postgresql_where in _INDEXES:
        op.create_index(
            name,
            table,
            columns,
            unique=False,
            sqlite_where=sa.text(sqlite_where),
            postgresql_where=sa.text(postgresql_where),
        )


def downgrade() -> None:
    for name, table, *_ in reversed(_INDEXES):
        op.drop_index(name, table_name=table)
