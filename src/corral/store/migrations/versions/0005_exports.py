"""exports and imports of fleets across projects

Revision ID: 0005
Revises: 0002
Create Date: 2026-11-30 01:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "exports",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("project_id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("is_global", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(precision=53), nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("project_id", "name", name="uq_exports_project_name"),
    )
    op.create_table(
        "export_importers",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("export_id", sa.String(length=36), nullable=False),
        sa.Column("project_id", sa.String(length=36), nullable=False),
        sa.ForeignKeyConstraint(["export_id"], ["exports.id"]),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"]),
        sa.PrimaryKeyConstraint("export_id", "project_id"),
        sa.UniqueConstraint("id"),
    )
    op.create_table(
        "exported_fleets",
        sa.Column("export_id", sa.String(length=36), nullable=False),
        sa.Column("fleet_id", sa.String(length=36), nullable=False),
        sa.ForeignKeyConstraint(["export_id"], ["exports.id"]),
        sa.ForeignKeyConstraint(["fleet_id"], ["fleets.id"]),
        sa.PrimaryKeyConstraint("export_id", "fleet_id"),
    )


def downgrade() -> None:
    op.drop_table("exported_fleets")
    op.drop_table("export_importers")
    op.drop_table("exports")
