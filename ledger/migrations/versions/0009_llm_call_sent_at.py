"""``llm_calls.sent_at``: when the attempt went upstream.

An attempt's row kept only its call's ``requested_at`` and ``pacer_wait_s``, the same on every
attempt, so the planner's reads placed a retry the gateway sent after a 429's ``retry-after`` at
its first attempt's send: the drained rates (``ledger.pacer_window.drained_rates``) counted it
that wait early and a cooldown's accepted rate (``accepted_rates``) took its answer for that
wait early too. The gateway knows each attempt's send; it now records it (it records only
attempts it sent). NULL on rows written before, which the reads place at the request plus the
pacer wait, as before.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("llm_calls") as batch:
        batch.add_column(sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("llm_calls") as batch:
        batch.drop_column("sent_at")
