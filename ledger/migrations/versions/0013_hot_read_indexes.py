"""Indexes for the hot reads that had none: the planner tick's window and previous decision,
an instance's spend at landing, and the reaper's expired leases.

Found by reading each hot path's query plan on both databases (``tests/ledger/
test_hot_query_plans.py`` now guards them):

* ``ix_llm_calls_alias_id`` on ``llm_calls (alias, id)``: the tick's ``read_window`` reads one
  alias's calls after an id watermark. SQLite (which keeps no statistics) read it through
  ``ix_llm_calls_alias_requested_at`` on ``alias`` alone, every call the alias ever made, twice
  per tick per alias; PostgreSQL walked the primary key past the watermark, every alias's calls.
* ``ix_llm_calls_run_id_instance_id`` on ``llm_calls (run_id, instance_id)``, replacing
  ``ix_llm_calls_run_id`` (its prefix serves the run-wide reads as before, so llm_calls keeps
  as many indexes apart from the one above): an instance's recorded spend, read at each landing,
  read every call of its run.
* ``ix_planner_decisions_alias_id`` on ``planner_decisions (alias, id)``: the tick's previous
  decision of an alias (its newest row) sorted all the alias's decisions on SQLite; PostgreSQL
  walked the primary key backwards through every other alias's newer rows.
* ``ix_jobs_lease_deadline`` on ``jobs (visible_at, id) WHERE lease_token IS NOT NULL``: the
  reaper's leases past their deadline scanned the whole queue (and PostgreSQL sorted what it
  found). The reaper now takes them in that order, the longest expired first, so it reads at
  most its limit of the index. Partial, so it holds only the leased jobs (the claim's
  ``ix_jobs_claim`` holds the others).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LEASED = sa.text("lease_token IS NOT NULL")


def upgrade() -> None:
    op.create_index("ix_llm_calls_alias_id", "llm_calls", ["alias", "id"])
    op.create_index("ix_llm_calls_run_id_instance_id", "llm_calls", ["run_id", "instance_id"])
    op.drop_index("ix_llm_calls_run_id", table_name="llm_calls")
    op.create_index("ix_planner_decisions_alias_id", "planner_decisions", ["alias", "id"])
    op.create_index(
        "ix_jobs_lease_deadline",
        "jobs",
        ["visible_at", "id"],
        postgresql_where=_LEASED,
        sqlite_where=_LEASED,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_lease_deadline", table_name="jobs")
    op.drop_index("ix_planner_decisions_alias_id", table_name="planner_decisions")
    op.create_index("ix_llm_calls_run_id", "llm_calls", ["run_id"])
    op.drop_index("ix_llm_calls_run_id_instance_id", table_name="llm_calls")
    op.drop_index("ix_llm_calls_alias_id", table_name="llm_calls")
