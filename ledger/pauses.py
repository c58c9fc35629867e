"""Pause flags in the ledger: pause or resume a pool (harness, eval, gateway) or one run.

A flag change and its audit-log row are written in one transaction. The queue's claim reads
the flags inside its own claim transaction, so a claim that starts after a pause commits gets
nothing. Mirroring a pause to Prefect (work pool pause) is the operator-controls flow's job.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Engine, insert, select, update

from evalfleet.errors import ConfigError, NotFound
from ledger.clock import db_now
from ledger.db import write_transaction
from ledger.models import AuditLog, PauseFlag, Run

PAUSABLE_POOLS = ("harness", "eval", "gateway")
SCOPES = ("pool", "run")


@dataclass(frozen=True)
class PauseChange:
    """What ``set_pause`` did: the flag's previous and new value."""

    scope: str
    target: str
    was_paused: bool
    paused: bool


def _validate(conn: Connection, scope: str, target: str, actor: str, reason: str) -> None:
    problems = []
    if scope not in SCOPES:
        problems.append(f"scope: must be one of {', '.join(SCOPES)}")
    elif scope == "pool" and target not in PAUSABLE_POOLS:
        problems.append(f"target: pool must be one of {', '.join(PAUSABLE_POOLS)}")
    if not actor.strip():
        problems.append("actor: must not be empty")
    if not reason.strip():
        problems.append("reason: an audit reason is required")
    if problems:
        raise ConfigError("pause", problems)
    if scope == "run" and conn.execute(select(Run.id).where(Run.id == target)).first() is None:
        raise NotFound(f"run {target} does not exist")


def set_pause(
    engine: Engine, scope: str, target: str, paused: bool, *, actor: str, reason: str
) -> PauseChange:
    """Pause (``paused=True``) or resume a pool or a run, with an audit-log row, atomically."""
    with write_transaction(engine) as conn:
        _validate(conn, scope, target, actor, reason)
        row = conn.execute(
            select(PauseFlag.paused)
            .where(PauseFlag.scope == scope, PauseFlag.target == target)
            .with_for_update()
        ).first()
        was_paused = bool(row[0]) if row is not None else False
        values = {"paused": paused, "reason": reason, "actor": actor, "updated_at": db_now(conn)}
        if row is None:
            conn.execute(insert(PauseFlag).values(scope=scope, target=target, **values))
        else:
            conn.execute(
                update(PauseFlag)
                .where(PauseFlag.scope == scope, PauseFlag.target == target)
                .values(**values)
            )
        conn.execute(
            insert(AuditLog).values(
                actor=actor,
                action="pause" if paused else "resume",
                target=f"{scope}:{target}",
                reason=reason,
                old={"paused": was_paused},
                new={"paused": paused},
            )
        )
    return PauseChange(scope=scope, target=target, was_paused=was_paused, paused=paused)


def is_paused(conn: Connection, *, pool: str, run_id: str | None = None) -> bool:
    """True when ``pool`` (or, if given, the run) is paused, as seen by ``conn``'s transaction."""
    clauses = [(PauseFlag.scope == "pool") & (PauseFlag.target == pool)]
    if run_id is not None:
        clauses.append((PauseFlag.scope == "run") & (PauseFlag.target == run_id))
    condition = clauses[0] if len(clauses) == 1 else clauses[0] | clauses[1]
    query = select(PauseFlag.scope).where(PauseFlag.paused.is_(True), condition).limit(1)
    return conn.execute(query).first() is not None
