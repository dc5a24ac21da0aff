"""one row per submission of a job: a resubmission happens once, whichever replica decides it

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 03:20:00
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_run")
        batch.create_index("uq_jobs_submission", ["run_id", "replica_num", "job_num", "submission_num"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("uq_jobs_submission")
        batch.create_index("ix_jobs_run", ["run_id", "job_num", "submission_num"])
