"""The claim orders jobs by ``jobs.enqueued_at``, over a partial index of the unleased jobs.

Since 0011 the claim ordered by ``visible_at, launch_rank, id`` over an index of ``(pool,
visible_at, launch_rank)``. Two things were wrong with that:

* the index did not hold the whole order (``id`` was not in it), so PostgreSQL sorted every
  claimable job on each claim: ``evalfleet bench queue`` fell from about 2,700 to 450-600
  claims/s on PostgreSQL (8 threads, 4,000 jobs);
* a claim moves ``visible_at`` to the lease's deadline, so a job whose lease expired (a worker
  died) went behind every job queued after it, and launched last.

The claim now orders by ``enqueued_at, launch_rank, id`` (``enqueued_at`` is set once, at
enqueue, and never moves: a returned job takes its place again), over ``ix_jobs_claim`` on
``(pool, enqueued_at, launch_rank, id) WHERE lease_token IS NULL``. Jobs that were never
claimed get ``enqueued_at = visible_at`` (the enqueue's one "now"): on SQLite the server
default wrote it per row, at a second's resolution, which could split one run's jobs.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UNLEASED = sa.text("lease_token IS NULL")


def upgrade() -> None:
    op.execute(
        "UPDATE jobs SET enqueued_at = visible_at WHERE lease_token IS NULL AND receive_count = 0"
    )
    op.drop_index("ix_jobs_claim", table_name="jobs")
    op.create_index(
        "ix_jobs_claim",
        "jobs",
        ["pool", "enqueued_at", "launch_rank", "id"],
        postgresql_where=_UNLEASED,
        sqlite_where=_UNLEASED,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_claim", table_name="jobs")
    op.create_index("ix_jobs_claim", "jobs", ["pool", "visible_at", "launch_rank"])
