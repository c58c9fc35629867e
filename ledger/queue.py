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

Concurrency: on PostgreSQL a claim is one ``UPDATE ... RETURNING`` statement whose candidates
come from ``SELECT ... FOR UPDATE SKIP LOCKED`` and whose clock is the database's ``now()``.
On SQLite every write transaction starts with ``BEGIN IMMEDIATE`` (``ledger.db``), the single
writer lock. Pause flags and the run's state are read inside the claim statement itself.
The reaper (``expire``) is called by the supervisor; ``claim`` only takes jobs without a lease.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, and_, delete, exists, func, select, text, update

from evalfleet.errors import ConfigError, IllegalTransition, StaleLease
from evalfleet.settings import get_settings
from evalfleet.states import (
    INSTANCE_LEASED,
    INSTANCE_OUTCOMES,
    RUN_CLAIMABLE,
    InstanceState,
    check_instance_transition,
    instance_sources,
    return_target,
)
from ledger.clock import as_utc, db_now, db_now_plus
from ledger.models import InstanceResult, Job, PauseFlag, Run

MAX_CLAIM = 1000
_LEASED = tuple(s.value for s in INSTANCE_LEASED)
_CLAIMABLE = tuple(s.value for s in RUN_CLAIMABLE)


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


@dataclass(frozen=True)
class ReapReport:
    """What ``expire`` did: (run id, instance id) pairs sent back to the queue or ended lost."""

    requeued: tuple[tuple[str, str], ...]
    lost: tuple[tuple[str, str], ...]


def _visibility(seconds: float | None) -> float:
    value = get_settings().visibility_timeout_s if seconds is None else seconds
    if not 0 < value <= 86_400:
        raise ConfigError("queue", ["visibility_timeout_s: must be in (0, 86400]"])
    return value


# --- claim -----------------------------------------------------------------------------------

_PG_CLAIM = text(
    """
WITH picked AS (
    SELECT j.id FROM jobs j
    WHERE j.pool = :pool AND j.lease_token IS NULL AND j.visible_at <= now()
      AND NOT EXISTS (SELECT 1 FROM pause_flags p
                      WHERE p.paused AND p.scope = 'pool' AND p.target = :pool)
      AND EXISTS (SELECT 1 FROM runs r WHERE r.id = j.run_id AND r.state = ANY(:claimable))
      AND NOT EXISTS (SELECT 1 FROM pause_flags p
                      WHERE p.paused AND p.scope = 'run' AND p.target = j.run_id)
    ORDER BY j.visible_at, j.id
    LIMIT :k
    FOR UPDATE OF j SKIP LOCKED
), leased AS (
    UPDATE jobs SET lease_token = replace(gen_random_uuid()::text, '-', ''),
                    receive_count = jobs.receive_count + 1,
                    visible_at = now() + make_interval(secs => :vt)
    FROM picked WHERE jobs.id = picked.id
    RETURNING jobs.id, jobs.run_id, jobs.instance_id, jobs.stage, jobs.lease_token,
              jobs.receive_count, jobs.visible_at
), booted AS (
    UPDATE instance_results ir SET state = 'booting', lease_token = l.lease_token,
           attempt = l.receive_count, heartbeat_at = now(),
           started_at = COALESCE(ir.started_at, now())
    FROM leased l
    WHERE ir.run_id = l.run_id AND ir.instance_id = l.instance_id AND ir.state = 'queued'
)
SELECT id, run_id, instance_id, stage, lease_token, receive_count, visible_at FROM leased
"""
)


def _claim_postgresql(conn: Connection, pool: str, k: int, vt: float) -> list[Lease]:
    rows = conn.execute(
        _PG_CLAIM, {"pool": pool, "k": k, "vt": vt, "claimable": list(_CLAIMABLE)}
    ).all()
    return [
        Lease(int(r[0]), r[1], r[2], r[3], r[4], int(r[5]), as_utc(r[6]))
        for r in sorted(rows, key=lambda r: int(r[0]))
    ]


def _claim_sqlite(conn: Connection, pool: str, k: int, vt: float) -> list[Lease]:
    now = db_now(conn)
    pool_paused = exists().where(
        PauseFlag.paused.is_(True), PauseFlag.scope == "pool", PauseFlag.target == pool
    )
    run_claimable = exists().where(Run.id == Job.run_id, Run.state.in_(_CLAIMABLE))
    run_paused = exists().where(
        PauseFlag.paused.is_(True), PauseFlag.scope == "run", PauseFlag.target == Job.run_id
    )
    picked = (
        select(Job.id)
        .where(
            Job.pool == pool,
            Job.lease_token.is_(None),
            Job.visible_at <= now,
            ~pool_paused,
            run_claimable,
            ~run_paused,
        )
        .order_by(Job.visible_at, Job.id)
        .limit(k)
        .scalar_subquery()
    )
    rows = conn.execute(
        update(Job)
        .where(Job.id.in_(picked))
        .values(
            lease_token=func.lower(func.hex(func.randomblob(16))),
            receive_count=Job.receive_count + 1,
            visible_at=db_now_plus(conn, vt),
        )
        .returning(
            Job.id,
            Job.run_id,
            Job.instance_id,
            Job.stage,
            Job.lease_token,
            Job.receive_count,
            Job.visible_at,
        )
    ).all()
    leases = [
        Lease(int(r[0]), r[1], r[2], r[3], str(r[4]), int(r[5]), as_utc(r[6]))
        for r in sorted(rows, key=lambda r: int(r[0]))
    ]
    for lease in leases:
        conn.execute(
            update(InstanceResult)
            .where(
                InstanceResult.run_id == lease.run_id,
                InstanceResult.instance_id == lease.instance_id,
                InstanceResult.state == InstanceState.QUEUED.value,
            )
            .values(
                state=InstanceState.BOOTING.value,
                lease_token=lease.token,
                attempt=lease.attempt,
                heartbeat_at=now,
                started_at=func.coalesce(InstanceResult.started_at, now),
            )
        )
    return leases


def claim(
    engine: Engine, pool: str, k: int = 1, *, visibility_timeout_s: float | None = None
) -> list[Lease]:
    """Claim up to ``k`` visible jobs of ``pool``: their instances go ``queued → booting``.

    Returns nothing when the pool is paused, and skips runs that are paused or not in a
    claimable state (running, draining). Concurrent claims never return the same job.
    """
    if not 1 <= k <= MAX_CLAIM:
        raise ConfigError("claim", [f"k: must be between 1 and {MAX_CLAIM}"])
    vt = _visibility(visibility_timeout_s)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            return _claim_postgresql(conn, pool, k, vt)
        return _claim_sqlite(conn, pool, k, vt)


# --- lease-holder steps ----------------------------------------------------------------------


def _refuse(conn: Connection, lease: Lease, target: InstanceState) -> None:
    """Explain why a guarded update of the lease's instance matched nothing, by raising."""
    row = conn.execute(
        select(InstanceResult.state, InstanceResult.lease_token).where(
            InstanceResult.run_id == lease.run_id,
            InstanceResult.instance_id == lease.instance_id,
        )
    ).first()
    if row is None or row[1] != lease.token:
        raise StaleLease(
            f"lease of {lease.run_id}/{lease.instance_id} (attempt {lease.attempt}) is no longer current"
        )
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
        raise StaleLease(
            f"lease of {lease.run_id}/{lease.instance_id} (attempt {lease.attempt}) is no longer current"
        )
    return as_utc(row[0])


def heartbeat(
    engine: Engine, lease: Lease, *, visibility_timeout_s: float | None = None
) -> datetime:
    """Extend the lease by the visibility timeout; returns the new deadline. StaleLease if lost."""
    vt = _visibility(visibility_timeout_s)
    with engine.begin() as conn:
        deadline = _extend(conn, lease, vt)
        conn.execute(
            update(InstanceResult)
            .where(
                InstanceResult.run_id == lease.run_id,
                InstanceResult.instance_id == lease.instance_id,
                InstanceResult.lease_token == lease.token,
            )
            .values(heartbeat_at=db_now(conn))
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
    vt = _visibility(visibility_timeout_s)
    with engine.begin() as conn:
        deadline = _extend(conn, lease, vt)
        values: dict[str, object] = {"heartbeat_at": db_now(conn)}
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
    vt = _visibility(visibility_timeout_s)
    with engine.begin() as conn:
        deadline = _extend(conn, lease, vt)
        _guarded_instance_update(
            conn, lease, InstanceState.EVALUATING, heartbeat_at=db_now(conn), patch=patch
        )
        return deadline


def land(engine: Engine, lease: Lease, outcome: Outcome) -> None:
    """Write the terminal instance row and delete the job, in one transaction.

    Refused with StaleLease when the token is no longer the job's, and with IllegalTransition
    when the instance cannot end that way from its state (e.g. ``resolved`` while ``booting``);
    a refused landing changes nothing.
    """
    with engine.begin() as conn:
        deleted = conn.execute(
            delete(Job)
            .where(Job.id == lease.job_id, Job.lease_token == lease.token)
            .returning(Job.id)
        ).first()
        if deleted is None:
            raise StaleLease(
                f"lease of {lease.run_id}/{lease.instance_id} (attempt {lease.attempt}) "
                "is no longer current: landing refused"
            )
        values: dict[str, object] = {
            "finished_at": db_now(conn),
            "input_tokens": outcome.input_tokens,
            "cached_input_tokens": outcome.cached_input_tokens,
            "output_tokens": outcome.output_tokens,
            "calls": outcome.calls,
            "cost_micro_usd": outcome.cost_micro_usd,
            "resolved": outcome.resolved,
            "error_class": outcome.error_class,
            "error_detail": outcome.error_detail,
        }
        if outcome.patch is not None:
            values["patch"] = outcome.patch
        _guarded_instance_update(conn, lease, outcome.state, **values)


# --- returns to the queue ----------------------------------------------------------------------


def _return(
    conn: Connection,
    job_id: int,
    run_id: str,
    instance_id: str,
    token: str,
    attempts_used: int,
    max_attempts: int,
    reason: str,
    delay_s: float,
) -> InstanceState:
    """Send one leased job back (still locked by the caller): ``queued`` or, past max, ``lost``."""
    target = return_target(attempts_used, max_attempts)
    if target == InstanceState.LOST:
        conn.execute(delete(Job).where(Job.id == job_id, Job.lease_token == token))
        values: dict[str, object] = {
            "finished_at": db_now(conn),
            "error_class": "max_attempts",
            "error_detail": reason,
        }
    else:
        conn.execute(
            update(Job)
            .where(Job.id == job_id, Job.lease_token == token)
            .values(lease_token=None, visible_at=db_now_plus(conn, delay_s))
        )
        values = {"lease_token": None, "error_detail": reason}
    result = conn.execute(
        update(InstanceResult)
        .where(
            InstanceResult.run_id == run_id,
            InstanceResult.instance_id == instance_id,
            InstanceResult.lease_token == token,
            InstanceResult.state.in_(_LEASED),
        )
        .values(state=target.value, **values)
    )
    if result.rowcount != 1:
        raise StaleLease(f"instance {run_id}/{instance_id} does not hold lease {token[:8]}...")
    return target


def requeue(engine: Engine, lease: Lease, reason: str, *, delay_s: float = 0.0) -> InstanceState:
    """Give the job back after an infrastructure failure (never the agent's fault).

    The instance returns to ``queued`` (visible again after ``delay_s``) or, when the run's
    ``max_attempts`` claims are used up, ends ``lost``; returns which. StaleLease if not current.
    """
    if not 0 <= delay_s <= 86_400:
        raise ConfigError("requeue", ["delay_s: must be in [0, 86400]"])
    with engine.begin() as conn:
        row = conn.execute(
            select(Job.receive_count, Run.max_attempts)
            .join(Run, Run.id == Job.run_id)
            .where(Job.id == lease.job_id, Job.lease_token == lease.token)
            .with_for_update(of=Job)
        ).first()
        if row is None:
            raise StaleLease(
                f"lease of {lease.run_id}/{lease.instance_id} (attempt {lease.attempt}) is no longer current"
            )
        return _return(
            conn,
            lease.job_id,
            lease.run_id,
            lease.instance_id,
            lease.token,
            int(row[0]),
            int(row[1]),
            reason,
            delay_s,
        )


def expire(engine: Engine, *, pool: str | None = None, limit: int = 1000) -> ReapReport:
    """The reaper: leases past their deadline go back to ``queued``, or end ``lost`` past max.

    On PostgreSQL "past" is judged by the database's clock; locked rows are skipped (a
    heartbeat or landing in flight wins). Returns what was done.
    """
    if not 1 <= limit <= 100_000:
        raise ConfigError("expire", ["limit: must be between 1 and 100000"])
    requeued: list[tuple[str, str]] = []
    lost: list[tuple[str, str]] = []
    with engine.begin() as conn:
        conditions = [Job.lease_token.is_not(None), Job.visible_at <= db_now(conn)]
        if pool is not None:
            conditions.append(Job.pool == pool)
        query = (
            select(
                Job.id,
                Job.run_id,
                Job.instance_id,
                Job.lease_token,
                Job.receive_count,
                Run.max_attempts,
            )
            .join(Run, Run.id == Job.run_id)
            .where(and_(*conditions))
            .order_by(Job.id)
            .limit(limit)
            .with_for_update(of=Job, skip_locked=True)
        )
        for job_id, run_id, instance_id, token, used, max_attempts in conn.execute(query).all():
            target = _return(
                conn,
                int(job_id),
                run_id,
                instance_id,
                str(token),
                int(used),
                int(max_attempts),
                "lease expired",
                0.0,
            )
            (lost if target == InstanceState.LOST else requeued).append((run_id, instance_id))
    return ReapReport(requeued=tuple(requeued), lost=tuple(lost))
