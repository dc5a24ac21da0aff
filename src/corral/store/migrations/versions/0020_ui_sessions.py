"""ui_sessions: the web UI's login sessions (the session id hashed, bound to the user's token hash)

Revision ID: 0020
Revises: 0016
Create Date: 2026-12-01 20:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.String(36), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(precision=53), nullable=False),
        sa.Column("expires_at", sa.Float(precision=53), nullable=False),
    )
    op.create_index("ix_ui_sessions_user", "ui_sessions", ["user_id"])


def downgrade() -> None:
    op.drop_index("ix_ui_sessions_user", "ui_sessions")
    op.drop_table("ui_sessions")
