"""Runs and their instance rows in the ledger: create a run, enqueue its instances, move its state.

``create_run`` writes the ``runs`` row, one ``pending`` ``instance_results`` row per instance and
(unless told not to) enqueues one job per instance, all in one transaction: a run is either fully
written or not at all. It is the helper the launch flow and the tests use; validating a run
config is the config module's job, so the arguments here are already-checked values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select, update

from evalfleet.errors import ConfigError, NotFound
from evalfleet.settings import get_settings
from evalfleet.states import InstanceState, RunState, check_run_transition
from ledger.clock import db_now
from ledger.db import write_transaction
from ledger.models import InstanceResult, Job, Run

POOLS = ("harness", "eval")
STAGES = ("harness", "eval")


@dataclass(frozen=True)
class NewRun:
    """What ``create_run`` writes. Money in integer micro-dollars; ``max_attempts`` None = default."""

    run_id: str
    name: str
    harness: str
    alias: str
    instance_ids: Sequence[str]
    spend_cap_micro_usd: int
    max_attempts: int | None = None
    state: RunState = RunState.RUNNING
    task_cap: int | None = None
    priority: float = 1.0
    instance_timeout_s: float | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    config_source: str | None = None
    idempotency_key: str | None = None


def _problems(new: NewRun, max_attempts: int) -> list[str]:
    problems = []
    if not new.instance_ids:
        problems.append("instances: at least one instance is required")
    if len(set(new.instance_ids)) != len(new.instance_ids):
        problems.append("instances: instance ids must be unique")
    if any(not i for i in new.instance_ids):
        problems.append("instances: instance ids must not be empty")
    if not 1 <= max_attempts <= 20:
        problems.append("max_attempts: must be between 1 and 20")
    if new.spend_cap_micro_usd <= 0:
        problems.append("caps.spend_usd: must be greater than 0")
    return problems


def create_run(
    engine: Engine, new: NewRun, *, enqueue_now: bool = True, pool: str = "harness"
) -> None:
    """Write the run, its pending instance rows and (by default) one queued job per instance."""
    max_attempts = (
        new.max_attempts if new.max_attempts is not None else get_settings().default_max_attempts
    )
    problems = _problems(new, max_attempts)
    if problems:
        raise ConfigError(f"run {new.run_id}", problems)
    with write_transaction(engine) as conn:
        conn.execute(
            insert(Run).values(
                id=new.run_id,
                name=new.name,
                harness=new.harness,
                alias=new.alias,
                state=new.state.value,
                task_cap=new.task_cap,
                spend_cap_micro_usd=new.spend_cap_micro_usd,
                priority=new.priority,
                max_attempts=max_attempts,
                instance_timeout_s=new.instance_timeout_s,
                config=dict(new.config),
                config_source=new.config_source,
                idempotency_key=new.idempotency_key,
            )
        )
        conn.execute(
            insert(InstanceResult),
            [
                {"run_id": new.run_id, "instance_id": i, "state": InstanceState.PENDING.value}
                for i in new.instance_ids
            ],
        )
        if enqueue_now:
            enqueue(conn, new.run_id, new.instance_ids, pool=pool)


def enqueue(
    conn: Connection,
    run_id: str,
    instance_ids: Sequence[str],
    *,
    pool: str = "harness",
    stage: str = "harness",
    ranks: Mapping[str, int] | None = None,
) -> int:
    """Move pending instances to ``queued`` and add one visible job each, in the caller's
    transaction. Returns the number of jobs added. ``ranks``: each instance's launch rank
    (``planner.launch_order``; the claim takes the lowest first); by default the order given.

    Raises ConfigError for an unknown pool or stage, and NotFound when an instance is not a
    pending row of the run (the caller's transaction should then be rolled back).
    """
    if pool not in POOLS:
        raise ConfigError("enqueue", [f"pool: must be one of {', '.join(POOLS)}"])
    if stage not in STAGES:
        raise ConfigError("enqueue", [f"stage: must be one of {', '.join(STAGES)}"])
    if not instance_ids:
        return 0
    moved = 0
    chunk = 500
    for start in range(0, len(instance_ids), chunk):
        part = list(instance_ids[start : start + chunk])
        result = conn.execute(
            update(InstanceResult)
            .where(
                InstanceResult.run_id == run_id,
                InstanceResult.instance_id.in_(part),
                InstanceResult.state == InstanceState.PENDING.value,
            )
            .values(state=InstanceState.QUEUED.value)
        )
        moved += result.rowcount
    if moved != len(instance_ids):
        raise NotFound(
            f"run {run_id}: {len(instance_ids) - moved} of {len(instance_ids)} instances "
            "are not pending rows of this run"
        )
    # one "now" for every job of the call: the claim takes jobs enqueued together in their
    # launch order, and a job returned to the queue keeps its place by this value
    now = db_now(conn)
    conn.execute(
        insert(Job).values(visible_at=now, enqueued_at=now),
        [
            {
                "run_id": run_id,
                "instance_id": i,
                "stage": stage,
                "pool": pool,
                "receive_count": 0,
                "launch_rank": ranks.get(i, index) if ranks is not None else index,
            }
            for index, i in enumerate(instance_ids)
        ],
    )
    return moved


def set_run_state(engine: Engine, run_id: str, target: RunState) -> RunState:
    """Move a run to ``target`` if the state machine allows it; returns the previous state.

    Raises NotFound for an unknown run and IllegalTransition for a move the design forbids.
    The row is locked while checked (FOR UPDATE on PostgreSQL; SQLite's write lock is taken at
    BEGIN IMMEDIATE), so two racing writers cannot both win.
    """
    with write_transaction(engine) as conn:
        current = conn.execute(
            select(Run.state).where(Run.id == run_id).with_for_update()
        ).scalar_one_or_none()
        if current is None:
            raise NotFound(f"run {run_id} does not exist")
        check_run_transition(current, target)
        values: dict[str, Any] = {"state": target.value, "updated_at": db_now(conn)}
        if target in (RunState.CLOSED, RunState.ABORTED, RunState.FAILED):
            values["closed_at"] = db_now(conn)
        conn.execute(update(Run).where(Run.id == run_id).values(**values))
        return RunState(current)


def instance_state_counts(engine: Engine, run_id: str) -> dict[str, int]:
    """How many instances of the run are in each state (states with none are left out)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(InstanceResult.state, func.count())
            .where(InstanceResult.run_id == run_id)
            .group_by(InstanceResult.state)
        ).all()
    return {state: int(count) for state, count in rows}
