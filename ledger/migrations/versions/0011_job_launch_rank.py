"""``jobs.launch_rank``: the order a run's queued instances are claimed in.

The claim took the earliest ``visible_at`` first, and a run's jobs are all enqueued at one
``now()``, so their order was whatever the database returned. A run's launch order
(``planner.launch_order``: by default the instances that were shortest in earlier runs go
last) is now written per job at enqueue time, and of the jobs visible since the same moment
the claim takes the lowest rank first. The earliest visible still goes first, so an older
run's jobs still go before a newer run's in an unscoped claim. Existing jobs get rank 0.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("launch_rank", sa.Integer(), nullable=False, server_default="0"))
        # the claim's index covers its whole order (a run's jobs share one visible_at)
        batch.drop_index("ix_jobs_claim")
        batch.create_index("ix_jobs_claim", ["pool", "visible_at", "launch_rank"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_claim")
        batch.create_index("ix_jobs_claim", ["pool", "visible_at"])
        batch.drop_column("launch_rank")
