"""project_quotas: each project's scheduling policy (fair-share weight, nominal and max quotas,
preemptible_max_priority) as a JSON document; a project without a row has no limits

Revision ID: 0021
Revises: 0024
Create Date: 2026-12-01 23:50:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0024"
branch_labels = None
depends_on = None

Time = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "project_quotas",
        sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), primary_key=True),
        sa.Column("policy", sa.Text(), nullable=False),
        sa.Column("updated_at", Time, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("project_quotas")
