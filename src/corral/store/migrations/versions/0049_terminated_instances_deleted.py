"""Terminated instances marked deleted, as dstack 0.22.5 marks them when its backend's terminate_instance returns
(an SSH fleet's host that failed excepted: it stays listed with its error until the fleet is applied again); and
ix_instances_created, an index of every instance in instances/list's order, in place of ix_instances_live_created
(dstack's instances/list shows the deleted instances too)

Revision ID: 0049
Revises: 0048
Create Date: 2026-12-06 18:50:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0049"
down_revision = "0048"
branch_labels = None
depends_on = None

#: The terminated instances a history left not deleted (an SSH fleet's failed host excepted), as SQL text.
_TERMINATED_KEPT = "status = 'terminated' AND NOT deleted AND NOT (backend = 'ssh' AND termination_reason = 'error')"


def upgrade() -> None:
    op.execute(sa.text(f"UPDATE instances SET deleted = {_true()} WHERE {_TERMINATED_KEPT}"))
    op.drop_index("ix_instances_live_created", table_name="instances")
    op.create_index("ix_instances_created", "instances", ["created_at", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_instances_created", table_name="instances")
    op.create_index(
        "ix_instances_live_created",
        "instances",
        ["created_at", "id"],
        unique=False,
        sqlite_where=sa.text("deleted = 0"),
        postgresql_where=sa.text("deleted = false"),
    )


def _true() -> str:
    return "1" if op.get_bind().dialect.name == "sqlite" else "true"
