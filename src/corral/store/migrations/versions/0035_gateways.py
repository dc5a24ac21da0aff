"""gateways: dstack's ``type: gateway`` held on an SSH fleet's host (its configuration, status, default flag,
host, hashed and sealed secret, connection); instances.gateway_id (the gateway held on an instance: no job is
placed there) and runs.gateway_id (the gateway a service is published on)

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-06 11:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None

Time = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "gateways",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("status_message", sa.Text, nullable=True),
        sa.Column("configuration", sa.Text, nullable=False),
        sa.Column("wildcard_domain", sa.String(300), nullable=True),
        sa.Column("is_default", sa.Boolean, nullable=False),
        sa.Column("to_be_deleted", sa.Boolean, nullable=False),
        sa.Column("created_at", Time, nullable=False),
        sa.Column("last_processed_at", Time, nullable=False),
        sa.Column("instance_id", sa.String(36), sa.ForeignKey("instances.id"), nullable=True),
        sa.Column("hostname", sa.String(200), nullable=True),
        sa.Column("secret_hash", sa.String(64), nullable=True),
        sa.Column("secret_sealed", sa.Text, nullable=True),
        sa.Column("connection", sa.Text, nullable=True),
        sa.Column("last_seen_at", Time, nullable=True),
        sa.Column("lock_owner", sa.String(100), nullable=True),
        sa.Column("lock_token", sa.String(36), nullable=True),
        sa.Column("lock_expires_at", Time, nullable=True),
    )
    op.create_index("ux_gateways_project_name", "gateways", ["project_id", "name"], unique=True)
    op.create_index(
        "ux_gateways_project_default",
        "gateways",
        ["project_id"],
        unique=True,
        sqlite_where=sa.text("is_default = 1"),
        postgresql_where=sa.text("is_default = true"),
    )
    op.create_index("ix_gateways_instance", "gateways", ["instance_id"])
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gateway_id", sa.String(36), nullable=True))
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gateway_id", sa.String(36), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("gateway_id")
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_column("gateway_id")
    op.drop_index("ix_gateways_instance", table_name="gateways")
    op.drop_index("ux_gateways_project_default", table_name="gateways")
    op.drop_index("ux_gateways_project_name", table_name="gateways")
    op.drop_table("gateways")
