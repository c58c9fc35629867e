"""Initial ledger schema: every table of ``ledger.models`` plus the append-only audit log.

The audit log refuses UPDATE and DELETE at the database level: on SQLite with BEFORE UPDATE /
BEFORE DELETE triggers that ``RAISE(ABORT, ...)``, on PostgreSQL with a trigger function that
raises (TRUNCATE is refused too). Downgrade removes all of it.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    _create_tables()
    _create_audit_log_guards()


def _create_tables() -> None:
    op.create_table(
        "alias_observations",
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("headers", sa.JSON(), nullable=False),
        sa.Column("limits", sa.JSON(), nullable=False),
        sa.Column("last_limit_type", sa.String(length=16), nullable=True),
        sa.Column("last_limited_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("alias", name=op.f("pk_alias_observations")),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=256), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("old", sa.JSON(), nullable=True),
        sa.Column("new", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_table(
        "capacity_snapshots",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("pool", sa.String(length=16), nullable=False),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("booting", sa.Integer(), nullable=False),
        sa.Column("queued", sa.Integer(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("ceiling", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_capacity_snapshots")),
    )
    op.create_index(
        "ix_capacity_snapshots_pool_taken_at",
        "capacity_snapshots",
        ["pool", "taken_at"],
        unique=False,
    )

    op.create_table(
        "harness_curves",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("harness", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("sample_count", sa.Integer(), nullable=False),
        sa.Column("fit_quality", sa.JSON(), nullable=False),
        sa.Column("source", sa.String(length=256), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_harness_curves")),
        sa.UniqueConstraint("harness", "version", name=op.f("uq_harness_curves_harness_version")),
    )
    op.create_table(
        "llm_calls",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=True),
        sa.Column("instance_id", sa.String(length=256), nullable=True),
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("harness", sa.String(length=64), nullable=True),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("task_age_s", sa.Float(), nullable=True),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("latency_s", sa.Float(), nullable=False),
        sa.Column("pacer_wait_s", sa.Float(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("limit_type", sa.String(length=16), nullable=True),
        sa.Column("cost_micro_usd", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_llm_calls")),
    )
    op.create_index(
        "ix_llm_calls_alias_requested_at", "llm_calls", ["alias", "requested_at"], unique=False
    )
    op.create_index(op.f("ix_llm_calls_run_id"), "llm_calls", ["run_id"], unique=False)

    op.create_table(
        "pacer_config_history",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("values", sa.JSON(), nullable=False),
        sa.Column(
            "changed_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pacer_config_history")),
        sa.UniqueConstraint("alias", "version", name=op.f("uq_pacer_config_history_alias_version")),
    )
    op.create_table(
        "pacer_configs",
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("calls_per_s", sa.Float(), nullable=False),
        sa.Column("tokens_per_s", sa.Float(), nullable=False),
        sa.Column("output_tokens_per_s", sa.Float(), nullable=True),
        sa.Column("inflight_tokens", sa.Float(), nullable=False),
        sa.Column("burst_s", sa.Float(), nullable=False),
        sa.Column("cooldown_s", sa.Float(), nullable=False),
        sa.Column("cached_input_counts", sa.Boolean(), nullable=False),
        sa.Column("seed", sa.JSON(), nullable=False),
        sa.Column("seed_source", sa.String(length=16), nullable=False),
        sa.Column("seeded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("alias", name=op.f("pk_pacer_configs")),
    )
    op.create_table(
        "pause_flags",
        sa.Column("scope", sa.String(length=8), nullable=False),
        sa.Column("target", sa.String(length=64), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("scope", "target", name=op.f("pk_pause_flags")),
    )
    op.create_table(
        "planner_decisions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("tick_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("live", sa.Integer(), nullable=False),
        sa.Column("booting", sa.Integer(), nullable=False),
        sa.Column("queued", sa.Integer(), nullable=False),
        sa.Column("ceiling", sa.Integer(), nullable=False),
        sa.Column("launches_allowed", sa.Integer(), nullable=False),
        sa.Column("binding", sa.String(length=32), nullable=False),
        sa.Column("projections", sa.JSON(), nullable=False),
        sa.Column("budgets", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_planner_decisions")),
    )
    op.create_index(
        "ix_planner_decisions_alias_tick_at",
        "planner_decisions",
        ["alias", "tick_at"],
        unique=False,
    )

    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("harness", sa.String(length=64), nullable=False),
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("task_cap", sa.Integer(), nullable=True),
        sa.Column("ceiling_override", sa.Integer(), nullable=True),
        sa.Column("spend_cap_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("priority", sa.Float(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_source", sa.String(length=1024), nullable=True),
        sa.Column("idempotency_key", sa.String(length=256), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_runs_idempotency_key")),
    )
    op.create_index(op.f("ix_runs_alias"), "runs", ["alias"], unique=False)
    op.create_index(op.f("ix_runs_state"), "runs", ["state"], unique=False)

    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=128), nullable=False),
        sa.Column("external_id", sa.String(length=128), nullable=True),
        sa.Column("spend_cap_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("spent_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("reserved_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_api_keys_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_index(op.f("ix_api_keys_run_id"), "api_keys", ["run_id"], unique=False)

    op.create_table(
        "instance_results",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("instance_id", sa.String(length=256), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("lease_token", sa.String(length=64), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("flow_run_id", sa.String(length=64), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("cost_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("resolved", sa.Boolean(), nullable=True),
        sa.Column("error_class", sa.String(length=64), nullable=True),
        sa.Column("error_detail", sa.Text(), nullable=True),
        sa.Column("patch", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_instance_results_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instance_results")),
        sa.UniqueConstraint(
            "run_id", "instance_id", name=op.f("uq_instance_results_run_id_instance_id")
        ),
    )
    op.create_index(
        op.f("ix_instance_results_run_id"), "instance_results", ["run_id"], unique=False
    )
    op.create_index(op.f("ix_instance_results_state"), "instance_results", ["state"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("instance_id", sa.String(length=256), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.Column("pool", sa.String(length=16), nullable=False),
        sa.Column("visible_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("receive_count", sa.Integer(), nullable=False),
        sa.Column("lease_token", sa.String(length=64), nullable=True),
        sa.Column(
            "enqueued_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_jobs_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint(
            "run_id", "instance_id", "stage", name=op.f("uq_jobs_run_id_instance_id_stage")
        ),
    )
    op.create_index("ix_jobs_claim", "jobs", ["pool", "visible_at"], unique=False)
    op.create_index(op.f("ix_jobs_run_id"), "jobs", ["run_id"], unique=False)


def downgrade() -> None:
    _drop_audit_log_guards()
    op.drop_table("jobs")
    op.drop_table("instance_results")
    op.drop_table("api_keys")
    op.drop_table("runs")
    op.drop_table("planner_decisions")
    op.drop_table("pause_flags")
    op.drop_table("pacer_configs")
    op.drop_table("pacer_config_history")
    op.drop_table("llm_calls")
    op.drop_table("harness_curves")
    op.drop_table("capacity_snapshots")
    op.drop_table("audit_log")
    op.drop_table("alias_observations")


AUDIT_LOG_MESSAGE = "audit_log is append-only"

SQLITE_GUARDS = (
    f"""CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
    BEGIN SELECT RAISE(ABORT, '{AUDIT_LOG_MESSAGE}: UPDATE refused'); END""",
    f"""CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
    BEGIN SELECT RAISE(ABORT, '{AUDIT_LOG_MESSAGE}: DELETE refused'); END""",
)

PG_GUARDS = (
    f"""CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '{AUDIT_LOG_MESSAGE}: % refused', TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END;
    $$""",
    """CREATE TRIGGER audit_log_no_update_delete BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()""",
    """CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()""",
)


def _create_audit_log_guards() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        statements: Sequence[str] = SQLITE_GUARDS
    elif dialect == "postgresql":
        statements = PG_GUARDS
    else:
        raise RuntimeError(f"the ledger supports sqlite and postgresql, not {dialect}")
    for statement in statements:
        op.execute(statement)


def _drop_audit_log_guards() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_update")
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_delete")
    elif dialect == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_truncate ON audit_log")
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_update_delete ON audit_log")
        op.execute("DROP FUNCTION IF EXISTS audit_log_append_only()")
