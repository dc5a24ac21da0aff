"""events and their targets (dstack's events/list)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 14:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

Time = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("recorded_at", Time, nullable=False),
        sa.Column("actor_user_id", sa.String(36), nullable=True),
    )
    op.create_index("ix_events_recorded_at", "events", ["recorded_at", "id"])
    op.create_table(
        "event_targets",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(36), sa.ForeignKey("events.id"), nullable=False),
        sa.Column("recorded_at", Time, nullable=False),
        sa.Column("entity_type", sa.String(20), nullable=False),
        sa.Column("entity_project_id", sa.String(36), nullable=True),
        sa.Column("entity_id", sa.String(36), nullable=False),
        sa.Column("entity_name", sa.String(200), nullable=False),
        sa.Column("entity_run_id", sa.String(36), nullable=True),
        sa.Column("entity_fleet_id", sa.String(36), nullable=True),
    )
    op.create_index("ix_event_targets_event", "event_targets", ["event_id"])
    op.create_index("ix_event_targets_entity", "event_targets", ["entity_id", "recorded_at"])
    op.create_index("ix_event_targets_project", "event_targets", ["entity_project_id", "recorded_at"])
    op.create_index("ix_event_targets_run", "event_targets", ["entity_run_id", "recorded_at"])
    op.create_index("ix_event_targets_fleet", "event_targets", ["entity_fleet_id", "recorded_at"])


def downgrade() -> None:
    op.drop_table("event_targets")
    op.drop_table("events")
