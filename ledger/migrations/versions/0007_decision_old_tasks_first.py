"""``planner_decisions.old_tasks_first``: the queue order the decision named for the pacer's
output-bound queue (``planner.decision.Decision.old_tasks_first``): oldest task first, or
arrival order once nothing is left to launch and the curve's durations are narrow
(docs/bench-planner.md, twenty-sixth round). Without it a notebook could not tell which order a
run's endgame was paced in. Rows written before have no value (NULL): the order was not known.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("planner_decisions") as batch:
        batch.add_column(sa.Column("old_tasks_first", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("planner_decisions") as batch:
        batch.drop_column("old_tasks_first")
