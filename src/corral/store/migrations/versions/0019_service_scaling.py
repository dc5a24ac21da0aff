"""Services II: runs.service_templates (each replica group's job spec of the run's current deployment,
what rollouts and autoscaling submit), jobs.drain_at (when a replica left rotation: drained, then
stopped) and service_request_stats (requests the proxies counted, per service, server replica and second)

Revision ID: 0019
Revises: 0020
Create Date: 2026-12-01 20:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0020"
branch_labels = None
depends_on = None

Time = sa.Float(precision=53)


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch_op:
        batch_op.add_column(sa.Column("service_templates", sa.Text(), nullable=True))
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("drain_at", Time, nullable=True))
    op.create_table(
        "service_request_stats",
        sa.Column("run_id", sa.String(36), primary_key=True),
        sa.Column("server", sa.String(100), primary_key=True),
        sa.Column("second", sa.BigInteger(), primary_key=True),
        sa.Column("requests", sa.Integer(), nullable=False),
    )
    op.create_index("ix_service_request_stats_second", "service_request_stats", ["second"])


def downgrade() -> None:
    op.drop_index("ix_service_request_stats_second", "service_request_stats")
    op.drop_table("service_request_stats")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("drain_at")
    with op.batch_alter_table("runs") as batch_op:
        batch_op.drop_column("service_templates")
