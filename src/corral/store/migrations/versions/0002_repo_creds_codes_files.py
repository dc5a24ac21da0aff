"""repo credentials per user (encrypted), uploaded code, file archives

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 01:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("repos", schema=None) as batch_op:
        batch_op.drop_column("creds")  # never written: credentials are per user now (repo_creds)
    op.create_table(
        "repo_creds",
        sa.Column("project_id", sa.String(length=36), nullable=False),
        sa.Column("repo_id", sa.String(length=200), nullable=False),
        sa.Column("user_id", sa.String(length=36), nullable=False),
        sa.Column("creds", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"]),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"]),
        sa.PrimaryKeyConstraint("project_id", "repo_id", "user_id"),
    )
    op.create_table(
        "codes",
        sa.Column("project_id", sa.String(length=36), nullable=False),
        sa.Column("blob_hash", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(precision=53), nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"]),
        sa.PrimaryKeyConstraint("project_id", "blob_hash"),
    )
    op.create_table(
        "file_archives",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("user_id", sa.String(length=36), nullable=False),
        sa.Column("blob_hash", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(precision=53), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("user_id", "blob_hash", name="uq_file_archives_user_hash"),
    )


def downgrade() -> None:
    op.drop_table("file_archives")
    op.drop_table("codes")
    op.drop_table("repo_creds")
    with op.batch_alter_table("repos", schema=None) as batch_op:
        batch_op.add_column(sa.Column("creds", sa.Text(), nullable=True))
