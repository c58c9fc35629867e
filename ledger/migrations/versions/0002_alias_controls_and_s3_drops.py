"""Operator controls and the S3 launch path: ``alias_controls`` (an alias's ceiling override)
and ``s3_drops`` (what ``evalfleet s3 watch`` has seen, so a restart never relaunches).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "alias_controls",
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("ceiling_override", sa.Integer(), nullable=True),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("alias", name=op.f("pk_alias_controls")),
    )
    op.create_table(
        "s3_drops",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("identity", sa.String(length=256), nullable=False),
        sa.Column("bucket", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=1024), nullable=False),
        sa.Column("version_id", sa.String(length=1024), nullable=True),
        sa.Column("etag", sa.String(length=128), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("event_id", sa.String(length=36), nullable=True),
        sa.Column(
            "seen_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_s3_drops")),
        sa.UniqueConstraint("identity", name=op.f("uq_s3_drops_identity")),
    )
    op.create_index(op.f("ix_s3_drops_bucket"), "s3_drops", ["bucket"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_s3_drops_bucket"), table_name="s3_drops")
    op.drop_table("s3_drops")
    op.drop_table("alias_controls")
