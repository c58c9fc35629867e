"""Operator controls on the ledger, each audited: task caps, ceiling overrides, abort.

Every function takes a ``Session`` inside the caller's transaction, validates its input first
(a ``ConfigError`` naming the field; a reason is always required), makes its change, writes
exactly ONE ``audit_log`` row (actor, action, target, reason, old -> new) and flushes. It never
commits: the change and its audit row commit or roll back together. ``control_session(engine)``
is the transaction to use (``BEGIN IMMEDIATE`` and the per-file writer lock on SQLite).

Controls:

* ``set_task_cap`` — a run's task cap (most live instances it may have); ``None`` clears it.
* ``set_ceiling_override`` — an operator ceiling for a run (``runs.ceiling_override``) or for an
  alias (``alias_controls``), ``0`` holds launches, ``None`` clears. The dispatcher's ceiling is
  min(static cap, task cap, run override, the run's share of min(planner ceiling, alias
  override)); ``alias_ceiling_overrides`` is what the planner/dispatcher read.
* ``abort`` — scope ``run``, ``alias`` or ``all`` (every live run). Queued work is removed at
  once: jobs no instance holds are deleted and their instances (and pending ones) end
  ``aborted``. Live instances (a leased job: booting, running, evaluating):
  ``live="finish"`` leaves them to land normally; the run goes ``draining`` and the supervisor
  closes it (revoking its keys) once they are terminal — or ``aborted`` at once if none is
  live. ``live="cancel"`` ends them ``aborted`` too and deletes their jobs (so a late landing
  is refused as a stale lease); the run goes ``aborted`` and the result lists the Prefect flow
  runs to cancel and the runs whose keys to revoke — the flow (``flows/controls.py``) does both.

The pacer's constants (edit, re-base) are ``ledger.pacer_controls``, built on the same helpers.

The audit log is append-only in the database (triggers refuse UPDATE and DELETE).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.orm import Session

from evalfleet.errors import ConfigError, NotFound
from evalfleet.runconfig import MAX_TASKS
from evalfleet.states import RUN_TERMINAL, InstanceState, RunState, check_run_transition
from ledger.db import write_transaction
from ledger.models import AliasControl, AuditLog, InstanceResult, Job, Run

MAX_REASON_CHARS = 2_000
MAX_ACTOR_CHARS = 128
MAX_OVERRIDE = MAX_TASKS
LIVE_RUN_STATES = tuple(s.value for s in RunState if s not in RUN_TERMINAL)
_LEASED = (InstanceState.BOOTING.value, InstanceState.RUNNING.value, InstanceState.EVALUATING.value)
_UNSTARTED = (InstanceState.PENDING.value, InstanceState.QUEUED.value)

AbortScope = Literal["run", "alias", "all"]
LivePolicy = Literal["finish", "cancel"]


@dataclass(frozen=True)
class Change:
    """What a control did: the audit row's action, target, old and new values."""

    action: str
    target: str
    old: dict[str, Any] | None
    new: dict[str, Any] | None


@dataclass(frozen=True)
class RunAbort:
    run_id: str
    old_state: str
    new_state: str
    removed_jobs: int
    aborted_instances: int
    live_left: int
    cancel_flow_runs: tuple[str, ...] = ()


@dataclass(frozen=True)
class AbortResult:
    """An abort: per run what changed; ``revoke_keys`` lists runs now ``aborted``."""

    change: Change
    runs: tuple[RunAbort, ...] = field(default_factory=tuple)

    @property
    def revoke_keys(self) -> tuple[str, ...]:
        return tuple(r.run_id for r in self.runs if r.new_state == RunState.ABORTED.value)

    @property
    def cancel_flow_runs(self) -> tuple[str, ...]:
        return tuple(f for r in self.runs for f in r.cancel_flow_runs)


@contextlib.contextmanager
def control_session(engine: Engine) -> Iterator[Session]:
    """A session in one write transaction: commits on success, rolls back on any error."""
    with write_transaction(engine) as conn, Session(bind=conn) as session:
        yield session
        session.flush()


# ---------------------------------------------------------------------------------------------
# Validation and the audit row


def check_who(actor: str, reason: str, problems: list[str]) -> None:
    if not isinstance(actor, str) or not actor.strip():
        problems.append("actor: must not be empty")
    elif len(actor) > MAX_ACTOR_CHARS or not actor.isprintable():
        problems.append(f"actor: at most {MAX_ACTOR_CHARS} printable characters")
    if not isinstance(reason, str) or not reason.strip():
        problems.append("reason: an audit reason is required")
    elif len(reason) > MAX_REASON_CHARS:
        problems.append(f"reason: at most {MAX_REASON_CHARS} characters (got {len(reason)})")


def _count(name: str, value: object, lo: int, hi: int, problems: list[str]) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{name}: must be a whole number or none, got {value!r}")
    elif not lo <= value <= hi:
        problems.append(f"{name}: must be between {lo} and {hi}, got {value}")


def raise_problems(what: str, problems: list[str]) -> None:
    if problems:
        raise ConfigError(what, problems)


def write_audit(session: Session, change: Change, actor: str, reason: str) -> None:
    session.execute(
        insert(AuditLog).values(
            actor=actor,
            action=change.action,
            target=change.target[:256],
            reason=reason,
            old=change.old,
            new=change.new,
        )
    )
    session.flush()


def _live_run(session: Session, run_id: str, what: str) -> Run:
    run = session.execute(
        select(Run).where(Run.id == run_id).with_for_update()
    ).scalar_one_or_none()
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    if run.state not in LIVE_RUN_STATES:
        raise ConfigError(f"run {run_id}", [f"is {run.state}: its {what} can no longer change"])
    return run


# ---------------------------------------------------------------------------------------------
# Caps and overrides


def set_task_cap(
    session: Session, run_id: str, cap: int | None, *, actor: str, reason: str
) -> Change:
    """Set (or, with ``None``, clear) a live run's task cap."""
    problems: list[str] = []
    _count("task_cap", cap, 1, MAX_TASKS, problems)
    check_who(actor, reason, problems)
    raise_problems("cap", problems)
    run = _live_run(session, run_id, "task cap")
    change = Change("run.task_cap", f"run:{run_id}", {"task_cap": run.task_cap}, {"task_cap": cap})
    session.execute(update(Run).where(Run.id == run_id).values(task_cap=cap))
    write_audit(session, change, actor, reason)
    return change


def set_ceiling_override(
    session: Session,
    scope: Literal["run", "alias"],
    target: str,
    value: int | None,
    *,
    actor: str,
    reason: str,
) -> Change:
    """Set (or clear) the operator ceiling of a live run or of an alias."""
    problems: list[str] = []
    if scope not in ("run", "alias"):
        problems.append("scope: must be run or alias")
    if scope == "alias" and (not target or len(target) > 64 or not target.isprintable()):
        problems.append("alias: must be 1 to 64 printable characters")
    _count("ceiling_override", value, 0, MAX_OVERRIDE, problems)
    check_who(actor, reason, problems)
    raise_problems("override", problems)
    if scope == "run":
        run = _live_run(session, target, "ceiling override")
        old = run.ceiling_override
        session.execute(update(Run).where(Run.id == target).values(ceiling_override=value))
    else:
        row = session.execute(
            select(AliasControl).where(AliasControl.alias == target).with_for_update()
        ).scalar_one_or_none()
        old = row.ceiling_override if row is not None else None
        if row is None:
            session.execute(insert(AliasControl).values(alias=target, ceiling_override=value))
        else:
            session.execute(
                update(AliasControl)
                .where(AliasControl.alias == target)
                .values(ceiling_override=value, updated_at=_db_now(session))
            )
    change = Change(
        f"{scope}.ceiling_override",
        f"{scope}:{target}",
        {"ceiling_override": old},
        {"ceiling_override": value},
    )
    write_audit(session, change, actor, reason)
    return change


def alias_ceiling_overrides(session: Session) -> dict[str, int]:
    """Every alias's operator ceiling override (aliases without one are left out)."""
    rows = session.execute(
        select(AliasControl.alias, AliasControl.ceiling_override).where(
            AliasControl.ceiling_override.is_not(None)
        )
    ).all()
    return {alias: int(value) for alias, value in rows}


def _db_now(session: Session) -> Any:
    from ledger.clock import db_now

    return db_now(session.connection())


# ---------------------------------------------------------------------------------------------
# Abort


def abort(
    session: Session,
    scope: AbortScope,
    target: str | None,
    *,
    live: LivePolicy,
    actor: str,
    reason: str,
) -> AbortResult:
    """Abort a run, every live run of an alias, or every live run (see the module docstring)."""
    problems: list[str] = []
    if scope not in ("run", "alias", "all"):
        problems.append("scope: must be run, alias or all")
    elif scope == "all" and target is not None:
        problems.append("target: must be empty for scope all")
    elif scope != "all" and not target:
        problems.append(f"target: the {scope} to abort is required")
    if live not in ("finish", "cancel"):
        problems.append("live: must be finish (let live instances land) or cancel")
    check_who(actor, reason, problems)
    raise_problems("abort", problems)

    query = select(Run).where(Run.state.in_(LIVE_RUN_STATES)).order_by(Run.id).with_for_update()
    if scope == "run":
        assert target is not None
        _live_run(session, target, "state")
        query = query.where(Run.id == target)
    elif scope == "alias":
        query = query.where(Run.alias == target)
    runs = list(session.execute(query).scalars())
    done = tuple(_abort_run(session, run, live) for run in runs)
    change = Change(
        "abort",
        f"{scope}:{target}" if scope != "all" else "all",
        {"runs": {r.run_id: r.old_state for r in done}},
        {
            "live": live,
            "runs": {r.run_id: r.new_state for r in done},
            "removed_jobs": sum(r.removed_jobs for r in done),
            "aborted_instances": sum(r.aborted_instances for r in done),
            "live_left": sum(r.live_left for r in done),
        },
    )
    write_audit(session, change, actor, reason)
    return AbortResult(change=change, runs=done)


def _abort_run(session: Session, run: Run, live: LivePolicy) -> RunAbort:
    aborted = InstanceState.ABORTED.value
    # Jobs no instance holds: gone, and their instances end aborted.
    removed = session.execute(
        delete(Job)
        .where(Job.run_id == run.id, Job.lease_token.is_(None))
        .returning(Job.instance_id)
        .execution_options(synchronize_session=False)
    ).scalars()
    removed_ids = list(removed)
    count = 0
    for start in range(0, len(removed_ids), 500):
        part = removed_ids[start : start + 500]
        count += _set_instances(session, run.id, aborted, part, None)
    count += _set_instances(session, run.id, aborted, None, (InstanceState.PENDING.value,))
    flow_runs: tuple[str, ...] = ()
    leased = session.execute(
        select(InstanceResult.instance_id, InstanceResult.flow_run_id).where(
            InstanceResult.run_id == run.id, InstanceResult.state.in_(_LEASED)
        )
    ).all()
    live_left = len(leased)
    if live == "cancel" and leased:
        session.execute(
            delete(Job).where(Job.run_id == run.id).execution_options(synchronize_session=False)
        )
        count += _set_instances(session, run.id, aborted, None, _LEASED)
        flow_runs = tuple(f for _, f in leased if f)
        live_left = 0
    # Live instances left to land: the run drains (the supervisor closes it); else aborted now.
    draining_from = (RunState.RUNNING.value, RunState.PAUSED.value, RunState.DRAINING.value)
    target = RunState.DRAINING if live_left and run.state in draining_from else RunState.ABORTED
    old_state = run.state
    if target.value != old_state:
        check_run_transition(old_state, target)
        values: dict[str, Any] = {"state": target.value, "updated_at": _db_now(session)}
        if target == RunState.ABORTED:
            values["closed_at"] = _db_now(session)
        session.execute(update(Run).where(Run.id == run.id).values(**values))
    return RunAbort(
        run_id=run.id,
        old_state=old_state,
        new_state=target.value,
        removed_jobs=len(removed_ids),
        aborted_instances=count,
        live_left=live_left,
        cancel_flow_runs=flow_runs,
    )


def _set_instances(
    session: Session,
    run_id: str,
    state: str,
    instance_ids: list[str] | None,
    sources: tuple[str, ...] | None,
) -> int:
    """Move instances to ``state`` (an ending): named ones from any unfinished state, or all in
    ``sources``; returns how many moved."""
    allowed = sources if sources is not None else (*_UNSTARTED, *_LEASED)
    stmt = (
        update(InstanceResult)
        .where(InstanceResult.run_id == run_id, InstanceResult.state.in_(allowed))
        .values(state=state, lease_token=None, finished_at=_db_now(session))
    )
    if instance_ids is not None:
        stmt = stmt.where(InstanceResult.instance_id.in_(instance_ids))
    return int(session.execute(stmt).rowcount)  # type: ignore[attr-defined]
