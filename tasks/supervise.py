"""Supervisor tasks: reaper, run completion, key recovery, capacity snapshots, eval scaler.

Each is one side effect and idempotent, so a supervisor that crashes and restarts mid-tick
repeats nothing harmful:

* ``reap``: expired leases go back to the queue (or ``lost`` past ``max_attempts``) through
  ``ledger.reaper.expire``; a still-running Prefect flow run of a reaped attempt is cancelled.
  Attempts whose flow run already ended without landing (``Crashed`` — the process was killed
  or the task died —, ``Failed`` or ``Cancelled`` in Prefect) go back at once too, without
  waiting for the lease to expire: the worker reports a dead process immediately, so the
  visibility timeout can stay long enough to cover a slow boot. Only ``running`` and
  ``evaluating`` rows are judged this way (their ``flow_run_id`` is the current attempt's: the
  run-instance flow run, or the run-eval one once the evaluation was handed to the eval pool);
  a lease whose holder is still alive is refused at landing anyway (``StaleLease``).
* ``reap_dead_boots``: the same for ``booting`` attempts, whose row does not name their flow run
  yet (the dispatcher creates it; the flow names itself when it starts). Their flow run is found
  by its name (``<instance> #<attempt>``) and its job reference (job id and lease token): if
  Prefect reports it over — Crashed (e.g. its process was killed before the flow began: the
  worker reports the exit at once), Failed, Cancelled, or Completed without having started —
  while the instance is still ``booting`` under that lease, the attempt goes back at once
  instead of waiting ``visibility_timeout_s`` (120 s). Each such return is written to
  ``audit_log`` (actor ``supervisor``) with the instance row, in one transaction.
* ``complete_runs``: a running run with nothing left queued goes ``draining``; a draining run
  whose instances are all terminal goes ``closed`` and its keys are revoked.
* ``recover_keys``: keys still active on closed, aborted or failed runs are revoked.
* ``snapshot_capacity``: one ``capacity_snapshots`` row per pool.
* ``scale_eval_pool``: the eval pool's Prefect concurrency follows its queue depth: queued eval
  jobs in the ledger plus ``eval_backlog``, the run-eval flow runs waiting for a slot on the eval
  pool (Scheduled or Late in Prefect; ``EVALFLEET_EVAL_LAUNCHER=work-pool``).
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select

from evalfleet.errors import IllegalTransition, StaleLease
from evalfleet.settings import get_settings
from evalfleet.states import INSTANCE_TERMINAL, InstanceState, RunState
from gateway.keys import KIND_GATEWAY, KIND_PROVIDER, STATE_ACTIVE
from ledger.models import ApiKey, CapacitySnapshot, InstanceResult, Job, PauseFlag, Run
from ledger.queue import Lease
from ledger.reaper import expire
from ledger.reaper import requeue as queue_requeue
from ledger.runs import set_run_state
from planner.eval_scaler import eval_pool_target
from tasks.instance import flow_run_name
from tasks.keys import revoke_keys
from tasks.ledger_io import engine

log = logging.getLogger(__name__)
_TERMINAL = tuple(s.value for s in INSTANCE_TERMINAL)
_CLOSED = (RunState.CLOSED.value, RunState.ABORTED.value, RunState.FAILED.value)
POOLS = ("harness", "eval")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # a requeue does not read the lease's deadline


def reap() -> tuple[int, int]:
    """Expire stale leases (cancelling their flow runs) and return attempts whose flow run
    ended without landing. Returns (requeued, lost)."""
    report = expire(engine())
    pairs = [*report.requeued, *report.lost]
    if pairs:
        _cancel_flow_runs(pairs)
    requeued, lost = reap_dead_flow_runs()
    boot_requeued, boot_lost = reap_dead_boots()
    return (
        len(report.requeued) + requeued + boot_requeued,
        len(report.lost) + lost + boot_lost,
    )


_DEAD = ("CRASHED", "FAILED", "CANCELLED")
#: A booting attempt's flow run in one of these never ran the instance (Completed included: a
#: flow run that started would have moved the row on from ``booting``).
_OVER = (*_DEAD, "COMPLETED")
_PAGE = 200  # the Prefect API's page size cap
_ACTOR = "supervisor"


def reap_dead_flow_runs() -> tuple[int, int]:
    """Requeue (or end ``lost``) running/evaluating attempts whose Prefect flow run is over
    without having landed. Returns (requeued, lost)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    held = _held_attempts(
        (InstanceState.RUNNING, InstanceState.EVALUATING), InstanceResult.flow_run_id.is_not(None)
    )
    if not held:
        return 0, 0
    by_flow_run = {str(row.flow_run_id): row for row in held}
    dead: list[Any] = []
    ids = [uuid.UUID(f) for f in by_flow_run]
    with get_client(sync_client=True) as client:
        for start in range(0, len(ids), _PAGE):
            page = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids[start : start + _PAGE])),
                limit=_PAGE,
            )
            dead.extend(
                by_flow_run[str(fr.id)]
                for fr in page
                if fr.state is not None and fr.state.type.value in _DEAD
            )
    return _return_all(
        [(row, str(row.flow_run_id)) for row in dead],
        (InstanceState.RUNNING, InstanceState.EVALUATING),
        "is over without landing",
    )


def _held_attempts(states: tuple[InstanceState, ...], *where: Any) -> list[Any]:
    """Claimed jobs whose attempt (same lease) is in ``states``: the job's lease fields, the
    attempt number and the attempt's flow run id."""
    with engine().connect() as conn:
        return list(
            conn.execute(
                select(
                    Job.id,
                    Job.run_id,
                    Job.instance_id,
                    Job.stage,
                    Job.lease_token,
                    InstanceResult.attempt,
                    InstanceResult.flow_run_id,
                )
                .join(
                    InstanceResult,
                    (InstanceResult.run_id == Job.run_id)
                    & (InstanceResult.instance_id == Job.instance_id)
                    & (InstanceResult.lease_token == Job.lease_token),
                )
                .where(InstanceResult.state.in_([s.value for s in states]), *where)
            ).all()
        )


def _return_all(
    dead: list[tuple[Any, str]], only_from: tuple[InstanceState, ...], what: str
) -> tuple[int, int]:
    """Requeue (or end ``lost``) each (held row, flow run id); returns (requeued, lost)."""
    requeued = lost = 0
    for row, flow_run_id in dead:
        lease = Lease(
            row.id, row.run_id, row.instance_id, row.stage, row.lease_token, row.attempt, _EPOCH
        )
        try:
            target = queue_requeue(
                engine(),
                lease,
                f"flow run {flow_run_id} {what}: requeued",
                only_from=only_from,
                audit_actor=_ACTOR,
            )
        except StaleLease:  # it landed, moved on or was requeued meanwhile
            continue
        if target == InstanceState.LOST:
            lost += 1
        else:
            requeued += 1
        log.warning(
            "instance %s/%s: flow run %s %s; %s",
            row.run_id,
            row.instance_id,
            flow_run_id,
            what,
            target.value,
        )
    return requeued, lost


def reap_dead_boots() -> tuple[int, int]:
    """Requeue (or end ``lost``) booting attempts whose flow run Prefect reports over before the
    instance started. Returns (requeued, lost)."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterName,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    booting = _held_attempts((InstanceState.BOOTING,))
    if not booting:
        return 0, 0
    by_lease = {(int(row.id), str(row.lease_token)): row for row in booting}
    names = sorted({flow_run_name(row.instance_id, row.attempt) for row in booting})
    over = FlowRunFilterStateType(any_=[StateType(s) for s in _OVER])
    dead: list[tuple[Any, str]] = []
    with get_client(sync_client=True) as client:
        for start in range(0, len(names), _PAGE):
            offset = 0
            while True:  # a name can recur across runs: page through every match
                page = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(
                        name=FlowRunFilterName(any_=names[start : start + _PAGE]),
                        state=FlowRunFilterState(type=over),
                    ),
                    limit=_PAGE,
                    offset=offset,
                )
                for fr in page:
                    ref = (fr.parameters or {}).get("job")
                    if not isinstance(ref, dict):
                        continue
                    row = by_lease.get((ref.get("job_id", 0), str(ref.get("token", ""))))
                    if row is not None:
                        dead.append((row, str(fr.id)))
                if len(page) < _PAGE:
                    break
                offset += _PAGE
    return _return_all(dead, (InstanceState.BOOTING,), "ended before the instance started")


def _cancel_flow_runs(pairs: list[tuple[str, str]]) -> None:
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
    from prefect.states import Cancelling

    with engine().connect() as conn:
        ids = [
            fid
            for run_id, instance_id in pairs
            if (
                fid := conn.execute(
                    select(InstanceResult.flow_run_id).where(
                        InstanceResult.run_id == run_id, InstanceResult.instance_id == instance_id
                    )
                ).scalar_one_or_none()
            )
        ]
    with get_client(sync_client=True) as client:
        for fid in ids:
            try:
                flow_run = client.read_flow_run(uuid.UUID(fid))
                if flow_run.state is not None and not flow_run.state.is_final():
                    client.set_flow_run_state(
                        uuid.UUID(fid), Cancelling(message="lease expired: reaped")
                    )
            except (ObjectNotFound, PrefectHTTPStatusError) as exc:
                log.warning("could not cancel flow run %s of a reaped job: %s", fid, exc)


def complete_runs() -> list[str]:
    """Move finished runs along (running → draining → closed); returns the runs closed now."""
    closed: list[str] = []
    with engine().connect() as conn:
        runs = conn.execute(
            select(Run.id, Run.state).where(
                Run.state.in_((RunState.RUNNING.value, RunState.DRAINING.value))
            )
        ).all()
        jobs_left = {
            r: int(n)
            for r, n in conn.execute(select(Job.run_id, func.count()).group_by(Job.run_id)).all()
        }
        open_instances = {
            r: int(n)
            for r, n in conn.execute(
                select(InstanceResult.run_id, func.count())
                .where(InstanceResult.state.not_in(_TERMINAL))
                .group_by(InstanceResult.run_id)
            ).all()
        }
    for run_id, state in runs:
        queued = _queued(run_id)
        try:
            if state == RunState.RUNNING.value and queued == 0:
                set_run_state(engine(), run_id, RunState.DRAINING)
                state = RunState.DRAINING.value
            if (
                state == RunState.DRAINING.value
                and not jobs_left.get(run_id)
                and not open_instances.get(run_id)
            ):
                set_run_state(engine(), run_id, RunState.CLOSED)
                revoke_keys(run_id)
                closed.append(run_id)
        except IllegalTransition as exc:  # an operator moved it meanwhile: next tick decides
            log.info("run %s changed state meanwhile: %s", run_id, exc)
    return closed


def _queued(run_id: str) -> int:
    with engine().connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(Job.run_id == run_id, Job.lease_token.is_(None))
            ).scalar_one()
        )


def recover_keys() -> list[str]:
    """Revoke keys still active on closed/aborted/failed runs; returns those runs."""
    with engine().connect() as conn:
        runs = list(
            conn.execute(
                select(ApiKey.run_id)
                .join(Run, Run.id == ApiKey.run_id)
                .where(
                    ApiKey.state == STATE_ACTIVE,
                    ApiKey.kind.in_((KIND_GATEWAY, KIND_PROVIDER)),
                    Run.state.in_(_CLOSED),
                )
                .distinct()
            ).scalars()
        )
    for run_id in runs:
        if run_id is not None:
            revoke_keys(run_id)
    return [r for r in runs if r is not None]


def pool_counts() -> dict[str, dict[str, Any]]:
    """Per pool: running, booting, queued and paused (ledger flags)."""
    out: dict[str, dict[str, Any]] = {}
    with engine().connect() as conn:
        states = dict(
            (s, int(n))
            for s, n in conn.execute(
                select(InstanceResult.state, func.count()).group_by(InstanceResult.state)
            ).all()
        )
        queued = {
            p: int(n)
            for p, n in conn.execute(
                select(Job.pool, func.count()).where(Job.lease_token.is_(None)).group_by(Job.pool)
            ).all()
        }
        paused = set(
            conn.execute(
                select(PauseFlag.target).where(
                    PauseFlag.scope == "pool", PauseFlag.paused.is_(True)
                )
            ).scalars()
        )
    out["harness"] = {
        "running": states.get("running", 0),
        "booting": states.get("booting", 0),
        "queued": queued.get("harness", 0),
        "paused": "harness" in paused,
    }
    out["eval"] = {
        "running": states.get("evaluating", 0),
        "booting": 0,
        "queued": queued.get("eval", 0),
        "paused": "eval" in paused,
    }
    return out


def snapshot_capacity(ceilings: dict[str, int], eval_backlog: int = 0) -> None:
    """Write one capacity snapshot row per pool (``eval_backlog``: run-eval flow runs waiting
    on the eval pool, counted as queued there)."""
    now = datetime.now(UTC)
    counts = pool_counts()
    counts["eval"]["queued"] += eval_backlog
    with engine().begin() as conn:
        conn.execute(
            insert(CapacitySnapshot),
            [
                {"pool": pool, "taken_at": now, "ceiling": ceilings.get(pool, 0), **counts[pool]}
                for pool in POOLS
            ],
        )


def eval_backlog() -> int:
    """Run-eval flow runs waiting for a slot on the eval pool (Scheduled or Late in Prefect)."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        WorkPoolFilter,
        WorkPoolFilterName,
    )
    from prefect.client.schemas.objects import StateType

    with get_client(sync_client=True) as client:
        return int(
            client.count_flow_runs(
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(
                        type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])
                    )
                ),
                work_pool_filter=WorkPoolFilter(
                    name=WorkPoolFilterName(any_=[get_settings().eval_pool])
                ),
            )
        )


def scale_eval_pool(queued: int) -> int:
    """Set the eval work pool's concurrency limit from its queue depth; returns the limit."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolUpdate

    s = get_settings()
    target = eval_pool_target(
        queued, s.eval_per_slot, s.eval_concurrency_min, s.eval_concurrency_max
    )
    with get_client(sync_client=True) as client:
        pool = client.read_work_pool(s.eval_pool)
        if pool.concurrency_limit != target:
            client.update_work_pool(s.eval_pool, WorkPoolUpdate(concurrency_limit=target))
    return target


def open_runs() -> int:
    """How many runs are still running, paused or draining."""
    with engine().connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(
                    Run.state.in_(
                        (RunState.RUNNING.value, RunState.PAUSED.value, RunState.DRAINING.value)
                    )
                )
            ).scalar_one()
        )
