"""``llm_calls.retry``: the attempt repeats a request the provider rejected (the gateway's own
retry after a 429, or the harness resending the same body). The planner's window
(``ledger.pacer_window.read_window``) counts a call's first 429 and not its retries': a call
too big for the provider's bucket at the moment, retried until it fits, would otherwise cut
every budget again on each retry (docs/bench-planner.md, seventeenth round). Rows written
before have no way to tell and read as first attempts.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("llm_calls") as batch:
        batch.add_column(
            sa.Column("retry", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("llm_calls") as batch:
        batch.drop_column("retry")
