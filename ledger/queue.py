"""The job queue on the ledger: claim, heartbeat, mark progress, land, requeue, reap.

A job row is one queued instance attempt; claiming it hands out a *lease* (a random token and a
visibility deadline ``visible_at``). Every later step names the lease, and a step whose token is
no longer the job's is refused with ``StaleLease`` — so a worker that lost its lease (expired and
re-claimed by another) can never land a result over the newer attempt.

Invariants kept by every function here (a hypothesis state machine checks them):
* a job exists exactly while its instance is ``queued`` (no lease) or leased (``booting``,
  ``running``, ``evaluating``, same token on job and instance row);
* a terminal instance row is written once, in the transaction that deletes its job;
* an attempt that fails for an infrastructure reason (``requeue``, expired lease) returns the
  instance to ``queued``, or ends it ``lost`` once the run's ``max_attempts`` claims are used.

Concurrency: on PostgreSQL claim, heartbeat and land are each ONE statement run in autocommit
mode (one round trip): claim picks its rows with ``SELECT ... FOR UPDATE SKIP LOCKED`` and every
deadline uses the database's ``now()``, never the worker's clock. A claim commits with
``synchronous_commit = off``: if the database crashes and forgets a claim, the worker's token is
unknown, so its heartbeat/landing is refused and the job is simply claimed again — nothing is
lost or doubled. Landings commit synchronously (a landed result is durable).
On SQLite every write transaction starts with ``BEGIN IMMEDIATE`` (``ledger.db``), the single
writer lock. Pause flags and the run's state are read inside the claim statement itself.
The reaper (``ledger.reaper.expire``) is called by the supervisor; ``claim`` only takes jobs
without a lease.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, select, update

from evalfleet.errors import ConfigError, IllegalTransition, StaleLease
from evalfleet.settings import get_settings
from evalfleet.states import (
    INSTANCE_OUTCOMES,
    InstanceState,
    check_instance_transition,
    instance_sources,
)
from ledger import queue_sql as sql
from ledger.clock import as_utc, db_now, db_now_plus, host_now, sqlite_timestamp
from ledger.db import write_transaction
from ledger.models import InstanceResult, Job

MAX_CLAIM = 1000


@dataclass(frozen=True)
class Lease:
    """A claimed job: hand it to every later step (heartbeat, mark_running, land, requeue)."""

    job_id: int
    run_id: str
    instance_id: str
    stage: str
    token: str
    attempt: int
    visible_until: datetime


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, as landed on the instance row. Money in micro-dollars."""

    state: InstanceState
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0
    cost_micro_usd: int = 0
    error_class: str | None = None
    error_detail: str | None = None
    patch: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.state not in INSTANCE_OUTCOMES:
            allowed = ", ".join(sorted(s.value for s in INSTANCE_OUTCOMES))
            problems.append(f"state: must be one of {allowed} (lost is decided by the queue)")
        for name in ("input_tokens", "cached_input_tokens", "output_tokens", "calls"):
            if getattr(self, name) < 0:
                problems.append(f"{name}: must not be negative")
        if self.cost_micro_usd < 0:
            problems.append("cost_micro_usd: must not be negative")
        if self.error_class is not None and len(self.error_class) > 64:
            problems.append("error_class: at most 64 characters")
        if problems:
            raise ConfigError("outcome", problems)

    @property
    def resolved(self) -> bool | None:
        """True/False for a scored outcome, None when the instance was not scored."""
        if self.state == InstanceState.RESOLVED:
            return True
        if self.state == InstanceState.UNRESOLVED:
            return False
        return None


def visibility(seconds: float | None) -> float:
    value = get_settings().visibility_timeout_s if seconds is None else seconds
    if not 0 < value <= 86_400:
        raise ConfigError("queue", ["visibility_timeout_s: must be in (0, 86400]"])
    return value


# --- claim -----------------------------------------------------------------------------------


def _claim_postgresql(
    conn: Connection, pool: str, k: int, vt: float, run_id: str | None
) -> list[Lease]:
    params: dict[str, object] = {"pool": pool, "k": k, "vt": vt}
    statement = sql.PG_CLAIM
    if run_id is not None:
        statement, params["run_id"] = sql.PG_CLAIM_RUN, run_id
    rows = conn.execute(statement, params).all()
    return [
        Lease(int(r[0]), r[1], r[2], r[3], r[4], int(r[5]), as_utc(r[6]))
        for r in sorted(rows, key=lambda r: (r[8], int(r[7]), int(r[0])))  # the claim's order
    ]


def _claim_sqlite(
    conn: Connection, pool: str, k: int, vt: float, run_id: str | None
) -> list[Lease]:
    now = host_now()
    deadline = now + timedelta(seconds=vt)
    now_text = sqlite_timestamp(now)
    params: dict[str, object] = {
        "pool": pool,
        "k": k,
        "now": now_text,
        "deadline": sqlite_timestamp(deadline),
    }
    statement = sql.SQLITE_CLAIM_JOBS
    if run_id is not None:
        statement, params["run_id"] = sql.SQLITE_CLAIM_RUN_JOBS, run_id
    rows = conn.execute(statement, params).all()
    leases = [
        Lease(int(r[0]), r[1], r[2], r[3], r[4], int(r[5]), deadline)
        # the claim's order (an UPDATE's RETURNING follows none); SQLite stores enqueued_at
        # as text in one sortable format (``ledger.clock.sqlite_timestamp``)
        for r in sorted(rows, key=lambda r: (str(r[7]), int(r[6]), int(r[0])))
    ]
    if leases:
        conn.execute(
            sql.SQLITE_CLAIM_INSTANCE,
            [
                {
                    "token": lease.token,
                    "attempt": lease.attempt,
                    "now": now_text,
                    "run_id": lease.run_id,
                    "instance_id": lease.instance_id,
                }
                for lease in leases
            ],
        )
    return leases


def claim(
    engine: Engine,
    pool: str,
    k: int = 1,
    *,
    visibility_timeout_s: float | None = None,
    run_id: str | None = None,
) -> list[Lease]:
    """Claim up to ``k`` visible jobs of ``pool``: their instances go ``queued → booting``.

    Returns nothing when the pool is paused, and skips runs that are paused or not in a
    claimable state (running, draining). Concurrent claims never return the same job.
    With ``run_id``, only that run's jobs are claimed (the dispatcher claims each run's own
    share of its alias's ceiling); otherwise the earliest enqueued visible jobs of any run,
    FIFO. Jobs enqueued together (a run's) go in their run's launch order
    (``jobs.launch_rank``), and the leases are returned in that order. A job returned to the
    queue (its lease expired or was given back) keeps its place once visible again.
    """
    problems = []
    if not 1 <= k <= MAX_CLAIM:
        problems.append(f"k: must be between 1 and {MAX_CLAIM}")
    if run_id is not None and not 1 <= len(run_id) <= 36:
        problems.append("run_id: must be 1-36 characters")
    if problems:
        raise ConfigError("claim", problems)
    vt = visibility(visibility_timeout_s)
    if engine.dialect.name == "postgresql":
        # One statement, atomic on its own: run it in autocommit mode (one round trip).
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            return _claim_postgresql(conn, pool, k, vt, run_id)
    with write_transaction(engine) as conn:
        return _claim_sqlite(conn, pool, k, vt, run_id)


# --- lease-holder steps ----------------------------------------------------------------------


def _stale(lease: Lease, what: str = "refused") -> StaleLease:
    return StaleLease(
        f"lease of {lease.run_id}/{lease.instance_id} (attempt {lease.attempt}) "
        f"is no longer current: {what}"
    )


def _refuse(conn: Connection, lease: Lease, target: InstanceState) -> None:
    """Explain why a guarded update of the lease's instance matched nothing, by raising."""
    current = conn.execute(
        select(Job.id).where(Job.id == lease.job_id, Job.lease_token == lease.token)
    ).first()
    if current is None:
        raise _stale(lease)
    row = conn.execute(
        select(InstanceResult.state, InstanceResult.lease_token).where(
            InstanceResult.run_id == lease.run_id,
            InstanceResult.instance_id == lease.instance_id,
        )
    ).first()
    if row is None or row[1] != lease.token:
        raise _stale(lease)
    check_instance_transition(row[0], target)
    raise IllegalTransition("instance", row[0], target)


def _guarded_instance_update(
    conn: Connection, lease: Lease, target: InstanceState, **values: object
) -> None:
    result = conn.execute(
        update(InstanceResult)
        .where(
            InstanceResult.run_id == lease.run_id,
            InstanceResult.instance_id == lease.instance_id,
            InstanceResult.lease_token == lease.token,
            InstanceResult.state.in_([s.value for s in instance_sources(target)]),
        )
        .values(state=target.value, **values)
    )
    if result.rowcount != 1:
        _refuse(conn, lease, target)


def _extend(conn: Connection, lease: Lease, vt: float) -> datetime:
    row = conn.execute(
        update(Job)
        .where(Job.id == lease.job_id, Job.lease_token == lease.token)
        .values(visible_at=db_now_plus(conn, vt))
        .returning(Job.visible_at)
    ).first()
    if row is None:
        raise _stale(lease)
    return as_utc(row[0])


def heartbeat(
    engine: Engine, lease: Lease, *, visibility_timeout_s: float | None = None
) -> datetime:
    """Extend the lease by the visibility timeout; returns the new deadline. StaleLease if lost."""
    vt = visibility(visibility_timeout_s)
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            row = conn.execute(
                sql.PG_HEARTBEAT, {"vt": vt, "job_id": lease.job_id, "token": lease.token}
            ).first()
        if row is None:
            raise _stale(lease)
        return as_utc(row[0])
    with write_transaction(engine) as conn:
        now = host_now()
        deadline = now + timedelta(seconds=vt)
        keys = {"job_id": lease.job_id, "token": lease.token}
        if (
            conn.execute(
                sql.SQLITE_HEARTBEAT_JOB, {"deadline": sqlite_timestamp(deadline), **keys}
            ).first()
            is None
        ):
            raise _stale(lease)
        conn.execute(
            sql.SQLITE_HEARTBEAT_INSTANCE,
            {
                "now": sqlite_timestamp(now),
                "run_id": lease.run_id,
                "instance_id": lease.instance_id,
                "token": lease.token,
            },
        )
        return deadline


def mark_running(
    engine: Engine,
    lease: Lease,
    *,
    flow_run_id: str | None = None,
    visibility_timeout_s: float | None = None,
) -> datetime:
    """``booting → running`` (the harness started); also extends the lease. Returns its deadline."""
    vt = visibility(visibility_timeout_s)
    with write_transaction(engine) as conn:
        deadline = _extend(conn, lease, vt)
        now = db_now(conn)
        values: dict[str, object] = {"heartbeat_at": now, "running_at": now}
        if flow_run_id is not None:
            values["flow_run_id"] = flow_run_id
        _guarded_instance_update(conn, lease, InstanceState.RUNNING, **values)
        return deadline


def mark_evaluating(
    engine: Engine,
    lease: Lease,
    *,
    patch: str | None = None,
    visibility_timeout_s: float | None = None,
) -> datetime:
    """``running → evaluating``, keeping the harness's patch on the row; extends the lease."""
    vt = visibility(visibility_timeout_s)
    with write_transaction(engine) as conn:
        deadline = _extend(conn, lease, vt)
        _guarded_instance_update(
            conn, lease, InstanceState.EVALUATING, heartbeat_at=db_now(conn), patch=patch
        )
        return deadline


_PG_LAND = {state: sql.pg_land(state) for state in INSTANCE_OUTCOMES}
_SQLITE_LAND = {state: sql.sqlite_land(state) for state in INSTANCE_OUTCOMES}


def land(engine: Engine, lease: Lease, outcome: Outcome) -> None:
    """Write the terminal instance row and delete the job, in one transaction.

    Refused with StaleLease when the token is no longer the job's, and with IllegalTransition
    when the instance cannot end that way from its state (e.g. ``resolved`` while ``booting``);
    a refused landing changes nothing (the transaction is rolled back).
    """
    params: dict[str, object] = {
        "job_id": lease.job_id,
        "token": lease.token,
        "run_id": lease.run_id,
        "instance_id": lease.instance_id,
        "state": outcome.state.value,
        "input_tokens": outcome.input_tokens,
        "cached_input_tokens": outcome.cached_input_tokens,
        "output_tokens": outcome.output_tokens,
        "calls": outcome.calls,
        "cost_micro_usd": outcome.cost_micro_usd,
        "resolved": outcome.resolved,
        "error_class": outcome.error_class,
        "error_detail": outcome.error_detail,
        "patch": outcome.patch,
    }
    if engine.dialect.name == "postgresql":
        # One statement that changes all or nothing: autocommit, one round trip.
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            deleted, landed = conn.execute(_PG_LAND[outcome.state], params).one()
            if not (deleted and landed):
                _refuse(conn, lease, outcome.state)
        return
    with write_transaction(engine) as conn:
        params["now"] = sqlite_timestamp(host_now())
        if not conn.execute(_SQLITE_LAND[outcome.state], params).all():
            _refuse(conn, lease, outcome.state)
        if not conn.execute(sql.SQLITE_LAND_JOB, params).all():
            # raising rolls the instance row back too
            raise _stale(lease, "landing refused")
