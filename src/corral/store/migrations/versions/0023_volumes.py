"""volumes: network volumes (EBS on aws) a project creates or registers, their provisioning data, the
instance one is attached to and how (device name), and the deletion asked of them

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-02 05:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

Time = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "volumes",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("user_id", sa.String(36), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("status_message", sa.Text, nullable=True),
        sa.Column("configuration", sa.Text, nullable=False),
        sa.Column("provisioning", sa.Text, nullable=True),
        sa.Column("instance_id", sa.String(36), sa.ForeignKey("instances.id"), nullable=True),
        sa.Column("attachment", sa.Text, nullable=True),
        sa.Column("to_be_deleted", sa.Boolean, nullable=False),
        sa.Column("deleted", sa.Boolean, nullable=False),
        sa.Column("created_at", Time, nullable=False),
        sa.Column("deleted_at", Time, nullable=True),
        sa.Column("last_processed_at", Time, nullable=False),
        sa.Column("lock_owner", sa.String(100), nullable=True),
        sa.Column("lock_token", sa.String(36), nullable=True),
        sa.Column("lock_expires_at", Time, nullable=True),
    )
    op.create_index(
        "ux_volumes_project_name_live",
        "volumes",
        ["project_id", "name"],
        unique=True,
        sqlite_where=sa.text("deleted = 0"),
        postgresql_where=sa.text("deleted = false"),
    )
    op.create_index("ix_volumes_status", "volumes", ["status"])


def downgrade() -> None:
    op.drop_index("ix_volumes_status", table_name="volumes")
    op.drop_index("ux_volumes_project_name_live", table_name="volumes")
    op.drop_table("volumes")
