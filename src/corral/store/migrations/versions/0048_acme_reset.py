"""acme_accounts.reset_at (when the ACME server was last found to have lost this server's account: a CA reset)
and gateway_certificates.issued_at (when the issuance of the recorded certificate began), so that every
certificate issued before a reset is issued again, by whichever server replica looks after its gateway

Revision ID: 0048
Revises: 0042
Create Date: 2026-12-06 18:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0048"
down_revision = "0042"
branch_labels = None
depends_on = None

Time = sa.Float(precision=53)


def upgrade() -> None:
    with op.batch_alter_table("acme_accounts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reset_at", Time, nullable=True))
    with op.batch_alter_table("gateway_certificates", schema=None) as batch_op:
        batch_op.add_column(sa.Column("issued_at", Time, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gateway_certificates", schema=None) as batch_op:
        batch_op.drop_column("issued_at")
    with op.batch_alter_table("acme_accounts", schema=None) as batch_op:
        batch_op.drop_column("reset_at")
