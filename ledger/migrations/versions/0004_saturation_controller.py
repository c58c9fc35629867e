"""The planner loop's saturation controller: its multiplier and warm-up start per alias on
``pacer_states`` (``overdrive``, ``busy_since``), and the budget each decision sized the fleet
on (``planner_decisions.saturating``), which says whether the next window feeds it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pacer_states") as batch:
        batch.add_column(sa.Column("overdrive", sa.Float(), server_default="1.0", nullable=False))
        batch.add_column(sa.Column("busy_since", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("planner_decisions") as batch:
        batch.add_column(sa.Column("saturating", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("planner_decisions") as batch:
        batch.drop_column("saturating")
    with op.batch_alter_table("pacer_states") as batch:
        batch.drop_column("busy_since")
        batch.drop_column("overdrive")
