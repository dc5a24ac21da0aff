"""projects' secrets; a key-value table of one-time server state

``secrets``: dstack's project secrets (one per project and name, ``uq_secrets_project_id_name``), the
value sealed with the server key. ``server_state``: small facts about this database that the server
records once, e.g. that the start-up pass sealing runs' registry passwords written in clear has run.

Revision ID: 0010
Revises: 0008
Create Date: 2026-12-01 14:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "secrets",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(precision=53), nullable=False),
        sa.Column("updated_at", sa.Float(precision=53), nullable=False),
        sa.UniqueConstraint("project_id", "name", name="uq_secrets_project_id_name"),
    )
    op.create_table(
        "server_state",
        sa.Column("key", sa.String(100), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Float(precision=53), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("server_state")
    op.drop_table("secrets")
