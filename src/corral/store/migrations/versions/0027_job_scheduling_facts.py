"""jobs.scheduling_facts: a job's scheduling facts (``domain.job_facts``), derived once when the job is written
and stored as a small versioned JSON document, so that a scheduling pass reads a job without parsing its run's
configuration; null for the jobs written before (the scheduling worker derives theirs from their specs)

Revision ID: 0027
Revises: 0025
Create Date: 2026-12-06 08:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("scheduling_facts", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("scheduling_facts")
