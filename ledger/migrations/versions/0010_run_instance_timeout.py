"""``runs.instance_timeout_s``: the run config's ``timeouts.instance_s``, for the planner.

The planner sizes no fleet whose pacer holds would stretch the harness curve's long tasks past
the shortest instance timeout of an alias's live runs (``planner.sizing``, binding
``instance_timeout``). ``tasks.plan.read_fleet`` reads it from this column, as it reads the task
cap, rather than parsing every live run's stored config each tick. Existing rows are filled from
their stored config (the resolved form always holds it); NULL means no timeout bounds the sizing.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _timeout_of(config: Any) -> float | None:
    if isinstance(config, str):  # a JSON column read without its type
        config = json.loads(config)
    timeouts = config.get("timeouts") if isinstance(config, dict) else None
    value = timeouts.get("instance_s") if isinstance(timeouts, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("instance_timeout_s", sa.Float(), nullable=True))
    runs = sa.table(
        "runs",
        sa.column("id", sa.String()),
        sa.column("config", sa.JSON()),
        sa.column("instance_timeout_s", sa.Float()),
    )
    conn = op.get_bind()
    for run_id, config in conn.execute(sa.select(runs.c.id, runs.c.config)).all():
        timeout = _timeout_of(config)
        if timeout is not None:
            conn.execute(
                sa.update(runs).where(runs.c.id == run_id).values(instance_timeout_s=timeout)
            )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("instance_timeout_s")
