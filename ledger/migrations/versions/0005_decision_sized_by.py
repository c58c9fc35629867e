"""``planner_decisions.sized_by``: the binding the budgets alone reached before caps and labels
(``planner.decision.Decision.sized_by``). A stale alias config labels every decision
``stale_config``; without this column the planner loop could not tell a paced fleet under a
stale label from one a cap held, and its saturation controller never learnt on stale aliases.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("planner_decisions") as batch:
        batch.add_column(sa.Column("sized_by", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("planner_decisions") as batch:
        batch.drop_column("sized_by")
