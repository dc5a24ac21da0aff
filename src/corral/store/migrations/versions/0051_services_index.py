"""ix_runs_services: the runs of services alone, by status, so that the service scaling worker's pass reads the
services (``store/service_scaling.live_services``), not every live run of a backlog of tasks (``SERVICE_RUN_SQL``)

Revision ID: 0051
Revises: 0050
Create Date: 2026-12-07 17:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0051"
down_revision = "0050"
branch_labels = None
depends_on = None

#: ``store/tables.SERVICE_RUN_SQL`` as it was when this revision was written.
_SERVICES = "service_templates IS NOT NULL"


def upgrade() -> None:
    op.create_index(
        "ix_runs_services",
        "runs",
        ["status"],
        unique=False,
        sqlite_where=sa.text(_SERVICES),
        postgresql_where=sa.text(_SERVICES),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_services", table_name="runs")
