"""The ledger's tables: SQLAlchemy 2.0 typed models, the single source of truth for the schema.

Alembic migrations under ``ledger/migrations`` must produce exactly this schema (a test compares
them). Money is stored as integer micro-dollars (``*_micro_usd``) so that reservations and caps
add up exactly on both SQLite and PostgreSQL. Timestamps are timezone-aware UTC.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

UtcDateTime = DateTime(timezone=True)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, datetime: UtcDateTime}


class Run(Base):
    """One evaluation run: a validated config, its caps and its lifecycle state."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    harness: Mapped[str] = mapped_column(String(64))
    alias: Mapped[str] = mapped_column(String(64), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    task_cap: Mapped[int | None] = mapped_column(Integer)
    ceiling_override: Mapped[int | None] = mapped_column(Integer)
    spend_cap_micro_usd: Mapped[int] = mapped_column(BigInteger)
    priority: Mapped[float] = mapped_column(Float, default=1.0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    # the config's timeouts.instance_s, which the planner sizes within (NULL: unbounded)
    instance_timeout_s: Mapped[float | None] = mapped_column(Float)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    config_source: Mapped[str | None] = mapped_column(String(1024))
    idempotency_key: Mapped[str | None] = mapped_column(String(256), unique=True)
    failure_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())
    closed_at: Mapped[datetime | None] = mapped_column()


class InstanceResult(Base):
    """One row per (run, instance): its state, current lease and, once terminal, its outcome."""

    __tablename__ = "instance_results"
    __table_args__ = (UniqueConstraint("run_id", "instance_id"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    instance_id: Mapped[str] = mapped_column(String(256))
    state: Mapped[str] = mapped_column(String(16), index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    lease_token: Mapped[str | None] = mapped_column(String(64))
    heartbeat_at: Mapped[datetime | None] = mapped_column()
    flow_run_id: Mapped[str | None] = mapped_column(String(64))
    started_at: Mapped[datetime | None] = mapped_column()  # the first claim
    # the current attempt's claim (queued -> booting) and its harness's start (booting ->
    # running): the planner's task age (tasks.plan.read_fleet) and the attempt's boot
    claimed_at: Mapped[datetime | None] = mapped_column()
    running_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    calls: Mapped[int] = mapped_column(Integer, default=0)
    cost_micro_usd: Mapped[int] = mapped_column(BigInteger, default=0)
    resolved: Mapped[bool | None] = mapped_column(Boolean)
    error_class: Mapped[str | None] = mapped_column(String(64))
    error_detail: Mapped[str | None] = mapped_column(Text)
    patch: Mapped[str | None] = mapped_column(Text)


class Job(Base):
    """The queue: one row per queued instance attempt, deleted when the instance lands."""

    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("run_id", "instance_id", "stage"),
        # the claim's whole order (``ledger.queue_sql``): the earliest enqueued, then the
        # launch order, over the unleased jobs only. Partial, so a claim scans no leased
        # (running) job; whole, so it stops after k rows instead of sorting every candidate
        Index(
            "ix_jobs_claim",
            "pool",
            "enqueued_at",
            "launch_rank",
            "id",
            postgresql_where=text("lease_token IS NULL"),
            sqlite_where=text("lease_token IS NULL"),
        ),
        # the reaper's order (``ledger.reaper.expire``): the leased jobs only, by deadline, so
        # a reap reads the expired ones, longest expired first, instead of the whole queue
        Index(
            "ix_jobs_lease_deadline",
            "visible_at",
            "id",
            postgresql_where=text("lease_token IS NOT NULL"),
            sqlite_where=text("lease_token IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    instance_id: Mapped[str] = mapped_column(String(256))
    stage: Mapped[str] = mapped_column(String(16), default="harness")
    pool: Mapped[str] = mapped_column(String(16), default="harness")
    visible_at: Mapped[datetime] = mapped_column()
    receive_count: Mapped[int] = mapped_column(Integer, default=0)
    lease_token: Mapped[str | None] = mapped_column(String(64))
    # when the job was enqueued (``ledger.runs.enqueue``: one value for all of a call's jobs);
    # never moved, so a job returned to the queue keeps its place in the claim's order
    enqueued_at: Mapped[datetime] = mapped_column(server_default=func.now())
    # the run's launch order (``planner.launch_order``): of jobs enqueued together (a run's),
    # the claim takes the lowest first
    launch_rank: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


CLIENT_CLOSED = 499
"""``LlmCall.status`` of a streamed answer the harness stopped reading before its end (the
nginx convention): the provider served it, and the tokens it streamed until then count
against its limits and are paid for; a curve refit leaves it out (its call was cut short)."""
SERVED_STATUSES = (200, CLIENT_CLOSED)
"""``LlmCall.status`` values of calls the provider served: what it accepted and charged."""


class LlmCall(Base):
    """One row per gateway call (retries included): the raw material of the curve refit."""

    __tablename__ = "llm_calls"
    __table_args__ = (
        # the planner tick's reads of one alias over a recent time span (``ledger.charges``,
        # ``ledger.pacer_window``)
        Index("ix_llm_calls_alias_requested_at", "alias", "requested_at"),
        # the tick's read of one alias's calls after its id watermark (``read_window``)
        Index("ix_llm_calls_alias_id", "alias", "id"),
        # an instance's recorded spend at its landing; a run's calls (the prefix)
        Index("ix_llm_calls_run_id_instance_id", "run_id", "instance_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[str | None] = mapped_column(String(36))
    instance_id: Mapped[str | None] = mapped_column(String(256))
    alias: Mapped[str] = mapped_column(String(64))
    harness: Mapped[str | None] = mapped_column(String(64))
    requested_at: Mapped[datetime] = mapped_column()
    #: when this attempt went upstream (a retry's is after its predecessor's ``retry-after``);
    #: NULL on rows written before it was recorded, which the planner's reads place at
    #: ``requested_at`` plus ``pacer_wait_s``
    sent_at: Mapped[datetime | None] = mapped_column()
    task_age_s: Mapped[float | None] = mapped_column(Float)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    latency_s: Mapped[float] = mapped_column(Float, default=0.0)
    pacer_wait_s: Mapped[float] = mapped_column(Float, default=0.0)
    status: Mapped[int] = mapped_column(Integer)
    limit_type: Mapped[str | None] = mapped_column(String(16))
    cost_micro_usd: Mapped[int] = mapped_column(BigInteger, default=0)
    # the attempt repeats a request the provider rejected (the gateway's own retry, or the
    # harness resending the same body after a 429): its 429 is no new evidence for the planner
    retry: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class PlannerDecision(Base):
    """Per planner tick and alias: what the planner saw and decided, and which constraint bound."""

    __tablename__ = "planner_decisions"
    __table_args__ = (
        Index("ix_planner_decisions_alias_tick_at", "alias", "tick_at"),
        # an alias's newest decision (``ledger.pacer_state.previous_decision``, each tick)
        Index("ix_planner_decisions_alias_id", "alias", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    alias: Mapped[str] = mapped_column(String(64))
    tick_at: Mapped[datetime] = mapped_column()
    live: Mapped[int] = mapped_column(Integer)
    booting: Mapped[int] = mapped_column(Integer)
    queued: Mapped[int] = mapped_column(Integer)
    ceiling: Mapped[int] = mapped_column(Integer)
    launches_allowed: Mapped[int] = mapped_column(Integer)
    binding: Mapped[str] = mapped_column(String(32))
    projections: Mapped[dict[str, Any]] = mapped_column(JSON)
    budgets: Mapped[dict[str, Any]] = mapped_column(JSON)
    #: the budget the fleet target was sized on (``planner.decision.Quantity``), if any
    saturating: Mapped[str | None] = mapped_column(String(32))
    #: what set the ceiling (budgets or a cap) before the stale/cooldown/pause/no-work labels
    sized_by: Mapped[str | None] = mapped_column(String(32))
    #: the pacer's output-bound queue order: oldest task first (True) or arrival (False);
    #: NULL on rows written before it was recorded
    old_tasks_first: Mapped[bool | None] = mapped_column(Boolean)


class PacerConfig(Base):
    """Per alias: the pacer's five constants, their seed and when they were seeded."""

    __tablename__ = "pacer_configs"

    alias: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    calls_per_s: Mapped[float] = mapped_column(Float)
    tokens_per_s: Mapped[float] = mapped_column(Float)
    output_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    inflight_tokens: Mapped[float] = mapped_column(Float)
    burst_s: Mapped[float] = mapped_column(Float)
    cooldown_s: Mapped[float] = mapped_column(Float)
    cached_input_counts: Mapped[bool] = mapped_column(Boolean, default=False)
    seed: Mapped[dict[str, Any]] = mapped_column(JSON)
    seed_source: Mapped[str] = mapped_column(String(16))
    seeded_at: Mapped[datetime] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class PacerConfigHistory(Base):
    """Every version a pacer config has had, with who changed it and why."""

    __tablename__ = "pacer_config_history"
    __table_args__ = (UniqueConstraint("alias", "version"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    alias: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    values: Mapped[dict[str, Any]] = mapped_column(JSON)
    changed_at: Mapped[datetime] = mapped_column(server_default=func.now())
    actor: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text)


class HarnessCurve(Base):
    """A versioned, fitted usage curve for one harness (written by the refit CLI or notebook)."""

    __tablename__ = "harness_curves"
    __table_args__ = (UniqueConstraint("harness", "version"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    harness: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    sample_count: Mapped[int] = mapped_column(Integer)
    fit_quality: Mapped[dict[str, Any]] = mapped_column(JSON)
    source: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class CapacitySnapshot(Base):
    """One row per pool per supervisor observation (every 30 s)."""

    __tablename__ = "capacity_snapshots"
    __table_args__ = (Index("ix_capacity_snapshots_pool_taken_at", "pool", "taken_at"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    pool: Mapped[str] = mapped_column(String(16))
    taken_at: Mapped[datetime] = mapped_column()
    running: Mapped[int] = mapped_column(Integer)
    booting: Mapped[int] = mapped_column(Integer)
    queued: Mapped[int] = mapped_column(Integer)
    paused: Mapped[bool] = mapped_column(Boolean)
    ceiling: Mapped[int] = mapped_column(Integer)


class ApiKey(Base):
    """A provider or gateway key of a run: only its hash is stored, never the raw secret."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(128), unique=True)
    external_id: Mapped[str | None] = mapped_column(String(128))
    spend_cap_micro_usd: Mapped[int] = mapped_column(BigInteger)
    spent_micro_usd: Mapped[int] = mapped_column(BigInteger, default=0)
    reserved_micro_usd: Mapped[int] = mapped_column(BigInteger, default=0)
    state: Mapped[str] = mapped_column(String(16))
    expires_at: Mapped[datetime] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column()


class AuditLog(Base):
    """Every operator action and limit edit. Append-only: the database refuses UPDATE and DELETE."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    at: Mapped[datetime] = mapped_column(server_default=func.now())
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(256))
    reason: Mapped[str] = mapped_column(Text)
    old: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    new: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class PauseFlag(Base):
    """A pause of a pool (``harness``, ``eval``, ``gateway``) or of one run, checked at claim."""

    __tablename__ = "pause_flags"

    scope: Mapped[str] = mapped_column(String(8), primary_key=True)
    target: Mapped[str] = mapped_column(String(64), primary_key=True)
    paused: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


THROTTLE_LIMITS_KEY = "throttle_limits"
"""Key of ``AliasObservation.limits`` holding the limits the last 429 stated (kept by the
gateway's recorder until the next 429, read by ``ledger.pacer_window.fresh_header_limits``)."""

THROTTLE_READING_KEY = "throttle_reading"
"""Key of ``AliasObservation.limits`` holding what the last 429 stated was left of the
provider's buckets (``remaining``, by limit type) and when its attempt was sent (``sent_at``,
epoch seconds): kept by the gateway's recorder until the next 429, read by
``ledger.charges.throttled_bucket`` (a token 429's drained bucket against the cache-counting
belief, ``tasks.plan_counting``)."""

COMPLETE_BEFORE_KEY = "complete_before"
"""Key of ``AliasObservation.limits`` holding the epoch seconds before which every call of the
alias the gateway saw requested had been answered and recorded when it made the observation
(written by the gateway's recorder, read by ``ledger.charges.counted_bucket``)."""

ANSWERED_SENT_AT_KEY = "answered_sent_at"
"""Key of ``AliasObservation.limits`` holding the epoch seconds at which the attempt whose answer
carried the observation was sent upstream: a provider states its bucket as of some moment
between that send and the answer, so every call sent before it is charged in what the headers
say remains (written by the gateway's recorder, read by ``ledger.charges.counted_bucket``)."""


class AliasObservation(Base):
    """Per gateway alias: the provider's latest rate-limit headers, kept by the gateway for the
    planner (seeding budgets from stated limits, re-seeding a stale config)."""

    __tablename__ = "alias_observations"

    alias: Mapped[str] = mapped_column(String(64), primary_key=True)
    observed_at: Mapped[datetime] = mapped_column()
    status: Mapped[int] = mapped_column(Integer)
    headers: Mapped[dict[str, Any]] = mapped_column(JSON)
    limits: Mapped[dict[str, Any]] = mapped_column(JSON)
    last_limit_type: Mapped[str | None] = mapped_column(String(16))
    last_limited_at: Mapped[datetime | None] = mapped_column()


class AliasControl(Base):
    """Per gateway alias: operator overrides that are not pacer constants (its ceiling override).

    Written only through ``ledger.controls`` (with an audit row); the planner applies an alias's
    ``ceiling_override`` on top of the runs' own caps and overrides.
    """

    __tablename__ = "alias_controls"

    alias: Mapped[str] = mapped_column(String(64), primary_key=True)
    ceiling_override: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class S3Drop(Base):
    """Every run-config object ``evalfleet s3 watch`` has handled: ``emitted`` (an
    ``s3.object.created`` event was sent) or ``rejected`` (with the reason). ``identity`` is the
    object's launch idempotency key (bucket/key/version or ETag): a restarted watcher skips what
    is here, and the same object can never be launched twice."""

    __tablename__ = "s3_drops"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    identity: Mapped[str] = mapped_column(String(256), unique=True)
    bucket: Mapped[str] = mapped_column(String(64), index=True)
    key: Mapped[str] = mapped_column(String(1024))
    version_id: Mapped[str | None] = mapped_column(String(1024))
    etag: Mapped[str] = mapped_column(String(128))
    size: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    event_id: Mapped[str | None] = mapped_column(String(36))
    seen_at: Mapped[datetime] = mapped_column(server_default=func.now())


class PacerState(Base):
    """Per gateway alias: the budget controller's persisted state (``planner.budgets.BudgetState``
    as JSON), so a restarted planner loop continues where it stopped. Written by the planner loop
    only (``ledger.pacer_state``). ``config_version`` is the ``pacer_configs`` version the state
    follows (0: the alias file's seed): an operator edit re-initialises it. ``last_call_id`` is
    the newest ``llm_calls`` id already observed. ``overdrive`` is the saturation controller's
    multiplier of the sizing overdrive (``planner.sizing.hold_overdrive``), ``busy_since`` when
    the alias's current busy period began (the controller waits for the fleet to warm up)."""

    __tablename__ = "pacer_states"

    alias: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    config_version: Mapped[int] = mapped_column(Integer)
    last_call_id: Mapped[int] = mapped_column(BigInteger)
    tick_at: Mapped[datetime] = mapped_column()
    overdrive: Mapped[float] = mapped_column(Float, server_default="1.0")
    busy_since: Mapped[datetime | None] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())
