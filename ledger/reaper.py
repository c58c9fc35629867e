"""Returns to the queue: ``requeue`` (the lease holder gives up after an infrastructure failure)
and ``expire`` (the supervisor's reaper: leases past their deadline).

Either way the instance goes back to ``queued`` — or, once the run's ``max_attempts`` claims are
used up, ends ``lost`` with its job deleted, so a job never loops. A 429 or provider outage is
never the agent's fault: it is requeued, not scored. On PostgreSQL "past the deadline" is judged
by the database's ``now()``; rows locked by a heartbeat or landing in flight are skipped.

``requeue`` can be limited to instances still in given states (``only_from``: the supervisor
returns a ``booting`` attempt whose flow run died only if it has not started meanwhile) and can
write an ``audit_log`` row in the same transaction (``audit_actor``: a rule of the supervisor
acting on Prefect's word rather than on an expired lease).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, and_, delete, insert, select, update

from evalfleet.errors import ConfigError, StaleLease
from evalfleet.states import INSTANCE_LEASED, InstanceState, return_target
from ledger.clock import db_now, db_now_plus
from ledger.db import write_transaction
from ledger.models import AuditLog, InstanceResult, Job, Run
from ledger.queue import Lease

_LEASED = tuple(s.value for s in INSTANCE_LEASED)


@dataclass(frozen=True)
class ReapReport:
    """What ``expire`` did: (run id, instance id) pairs sent back to the queue or ended lost."""

    requeued: tuple[tuple[str, str], ...]
    lost: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class _Held:
    job_id: int
    run_id: str
    instance_id: str
    token: str
    attempts_used: int
    max_attempts: int


def _return(
    conn: Connection,
    held: _Held,
    reason: str,
    delay_s: float,
    only_from: Collection[InstanceState] = INSTANCE_LEASED,
) -> InstanceState:
    """Send one leased job (locked by the caller) back: ``queued``, or ``lost`` past max."""
    sources = tuple(s.value for s in only_from)  # a refusal rolls the job back too
    target = return_target(held.attempts_used, held.max_attempts)
    mine = and_(Job.id == held.job_id, Job.lease_token == held.token)
    values: dict[str, object]
    if target == InstanceState.LOST:
        conn.execute(delete(Job).where(mine))
        values = {"finished_at": db_now(conn), "error_class": "max_attempts"}
    else:
        conn.execute(
            update(Job).where(mine).values(lease_token=None, visible_at=db_now_plus(conn, delay_s))
        )
        values = {"lease_token": None}
    result = conn.execute(
        update(InstanceResult)
        .where(
            InstanceResult.run_id == held.run_id,
            InstanceResult.instance_id == held.instance_id,
            InstanceResult.lease_token == held.token,
            InstanceResult.state.in_(sources),
        )
        .values(state=target.value, error_detail=reason[:2000], **values)
    )
    if result.rowcount != 1:
        raise StaleLease(f"instance {held.run_id}/{held.instance_id} does not hold the lease")
    return target


def requeue(
    engine: Engine,
    lease: Lease,
    reason: str,
    *,
    delay_s: float = 0.0,
    only_from: Collection[InstanceState] = INSTANCE_LEASED,
    audit_actor: str | None = None,
) -> InstanceState:
    """Give the job back after an infrastructure failure; returns ``queued`` or ``lost``.

    A ``queued`` job becomes visible again after ``delay_s``. StaleLease if the lease is not
    current or the instance is not in one of ``only_from`` (nothing changes then). With
    ``audit_actor``, an ``audit_log`` row (action ``requeue``) is written in the same
    transaction.
    """
    if not only_from or not set(only_from) <= INSTANCE_LEASED:
        raise ConfigError("requeue", ["only_from: must be leased states (booting, running, ...)"])
    if not 0 <= delay_s <= 86_400:
        raise ConfigError("requeue", ["delay_s: must be in [0, 86400]"])
    with write_transaction(engine) as conn:
        row = conn.execute(
            select(Job.receive_count, Run.max_attempts)
            .join(Run, Run.id == Job.run_id)
            .where(Job.id == lease.job_id, Job.lease_token == lease.token)
            .with_for_update(of=Job)
        ).first()
        if row is None:
            raise StaleLease(
                f"lease of {lease.run_id}/{lease.instance_id} (attempt {lease.attempt}) "
                "is no longer current: requeue refused"
            )
        held = _Held(
            lease.job_id, lease.run_id, lease.instance_id, lease.token, int(row[0]), int(row[1])
        )
        target = _return(conn, held, reason, delay_s, only_from)
        if audit_actor is not None:
            conn.execute(
                insert(AuditLog).values(
                    actor=audit_actor[:128],
                    action="requeue",
                    target=f"instance:{lease.run_id}/{lease.instance_id}"[:256],
                    reason=reason,
                    old={"attempt": lease.attempt},
                    new={"state": target.value},
                )
            )
        return target


def expire(engine: Engine, *, pool: str | None = None, limit: int = 1000) -> ReapReport:
    """The reaper: leases past their deadline go back to ``queued``, or end ``lost`` past max;
    at most ``limit`` of them, the longest expired first."""
    if not 1 <= limit <= 100_000:
        raise ConfigError("expire", ["limit: must be between 1 and 100000"])
    requeued: list[tuple[str, str]] = []
    lost: list[tuple[str, str]] = []
    with write_transaction(engine) as conn:
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
            # the longest expired first, in the order of ``ix_jobs_lease_deadline`` (it holds
            # only the leased jobs): a reap reads no more of the queue than it returns
            .order_by(Job.visible_at, Job.id)
            .limit(limit)
            .with_for_update(of=Job, skip_locked=True)
        )
        for job_id, run_id, instance_id, token, used, max_attempts in conn.execute(query).all():
            held = _Held(int(job_id), run_id, instance_id, str(token), int(used), int(max_attempts))
            target = _return(conn, held, "lease expired", 0.0)
            (lost if target == InstanceState.LOST else requeued).append((run_id, instance_id))
    return ReapReport(requeued=tuple(requeued), lost=tuple(lost))
