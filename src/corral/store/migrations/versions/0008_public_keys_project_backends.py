"""users' public SSH keys; the local backend stays only with the first-start project

Projects created through the API used to get the local backend (code running on the server's host).
As in dstack, a project gets a backend only from the server's ``config.yml`` (re-applied at every start,
after migrations) or the backends API: every project but ``main`` loses the backends stored for it.

Revision ID: 0008
Revises: 0006
Create Date: 2026-12-01 11:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "user_public_keys",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("user_id", sa.String(36), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("created_at", sa.Float(precision=53), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("type", sa.String(100), nullable=False),
        sa.Column("fingerprint", sa.String(100), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.UniqueConstraint("user_id", "fingerprint", name="uq_user_public_keys_user_id_fingerprint"),
    )
    op.execute(sa.text("UPDATE projects SET backends = '[]' WHERE name <> 'main'"))


def downgrade() -> None:
    op.drop_table("user_public_keys")
