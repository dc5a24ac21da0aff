"""job_metrics_points: the samples of running jobs' CPU, memory and GPUs (``metrics/job``, ``/metrics``),
and an index of runs by project, user and status (``/metrics``' run counts)

Revision ID: 0016
Revises: 0018
Create Date: 2026-12-01 17:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_metrics_points",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("timestamp_micro", sa.BigInteger(), nullable=False),
        sa.Column("cpu_usage_micro", sa.BigInteger(), nullable=False),
        sa.Column("memory_usage_bytes", sa.BigInteger(), nullable=False),
        sa.Column("memory_working_set_bytes", sa.BigInteger(), nullable=False),
        sa.Column("gpus", sa.Text(), nullable=True),
    )
    op.create_index("ux_job_metrics_points_job_ts", "job_metrics_points", ["job_id", "timestamp_micro"], unique=True)
    op.create_index("ix_job_metrics_points_ts", "job_metrics_points", ["timestamp_micro"])
    op.create_index("ix_runs_project_user_status", "runs", ["project_id", "user_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_runs_project_user_status", "runs")
    op.drop_table("job_metrics_points")
