"""``instance_results.claimed_at`` and ``running_at``: when the current attempt was claimed
(``queued → booting``) and when its harness started (``booting → running``).

``started_at`` is the instance's first claim, kept across attempts. The planner took running
tasks' ages from it, so a task's age counted its boot, and a requeued instance, which starts its
harness over, was projected as old as its first attempt. The curves are functions of the
harness's age (the gateway's ``task_age_s``), and the simulator the planner is measured on gives
it that age, so the planner now reads a running task's age from ``running_at``
(``tasks.plan.read_fleet``). ``running_at - claimed_at`` is the attempt's boot, which the run
timeline plots (``analysis.timeline``) against the planner's ``EVALFLEET_PLANNER_BOOT_S``. Rows
written before have neither (NULL): the planner then falls back to ``started_at``, as before.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("instance_results") as batch:
        batch.add_column(sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("running_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instance_results") as batch:
        batch.drop_column("running_at")
        batch.drop_column("claimed_at")
