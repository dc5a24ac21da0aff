"""acme_accounts (the ACME account key per directory, sealed) and gateway_certificates (each gateway host's
certificate validity and last failure)

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-06 11:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None

Time = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "acme_accounts",
        sa.Column("directory_url", sa.String(500), primary_key=True),
        sa.Column("key_sealed", sa.Text, nullable=False),
        sa.Column("created_at", Time, nullable=False),
    )
    op.create_table(
        "gateway_certificates",
        sa.Column("gateway_id", sa.String(36), primary_key=True),
        sa.Column("host", sa.String(300), primary_key=True),
        sa.Column("not_before", Time, nullable=True),
        sa.Column("not_after", Time, nullable=True),
        sa.Column("failed_at", Time, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("gateway_certificates")
    op.drop_table("acme_accounts")
