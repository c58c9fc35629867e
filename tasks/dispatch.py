"""Dispatch: how many jobs may start now, claiming them, and the two launchers.

Admission (per tick): for every alias with claimable runs, the alias ceiling is the planner's
latest ``planner_decisions.ceiling`` (the static cap until a planner has decided); runs on the
alias split it by priority within their own caps (``planner.shares.fair_shares``); a run's
allowance is its share minus its live tasks (booting + running + evaluating: a claimed job is
``booting`` before its flow run exists, so it counts at once). The total is bounded by the
static cap and the launcher's free slots. Paused pools and runs admit nothing: ``claim`` checks
the flags inside its own transaction.

Launchers share one interface (``launch(ref)``, ``free_slots()``, ``wait()``):
``InProcessLauncher`` runs the run-instance flow in a bounded thread pool (the embedded
default); ``WorkPoolLauncher`` creates a flow run of the run-instance deployment on a work pool
(process locally, ECS in production) with the job reference as its only parameter.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import func, select

from evalfleet.errors import StaleLease
from evalfleet.settings import get_settings
from evalfleet.states import INSTANCE_LEASED, RUN_CLAIMABLE
from ledger.models import InstanceResult, Job, PauseFlag, PlannerDecision, Run
from ledger.queue import Lease, claim
from planner.shares import RunDemand, fair_shares
from tasks.instance import JobRef, requeue
from tasks.ledger_io import engine

log = logging.getLogger(__name__)
_LEASED = tuple(s.value for s in INSTANCE_LEASED)
_CLAIMABLE = tuple(s.value for s in RUN_CLAIMABLE)


@dataclass(frozen=True)
class RunLoad:
    run_id: str
    alias: str
    priority: float
    task_cap: int | None
    ceiling_override: int | None
    live: int
    queued: int
    paused: bool


def run_loads() -> list[RunLoad]:
    """Live and queued counts of every claimable run (harness pool)."""
    with engine().connect() as conn:
        runs = conn.execute(
            select(Run.id, Run.alias, Run.priority, Run.task_cap, Run.ceiling_override).where(
                Run.state.in_(_CLAIMABLE)
            )
        ).all()
        live: dict[str, int] = {
            run_id: int(n)
            for run_id, n in conn.execute(
                select(InstanceResult.run_id, func.count())
                .where(InstanceResult.state.in_(_LEASED))
                .group_by(InstanceResult.run_id)
            ).all()
        }
        queued: dict[str, int] = {
            run_id: int(n)
            for run_id, n in conn.execute(
                select(Job.run_id, func.count())
                .where(Job.pool == "harness", Job.lease_token.is_(None))
                .group_by(Job.run_id)
            ).all()
        }
        paused = set(
            conn.execute(
                select(PauseFlag.target).where(PauseFlag.scope == "run", PauseFlag.paused.is_(True))
            ).scalars()
        )
    return [
        RunLoad(
            run_id=r.id,
            alias=r.alias,
            priority=float(r.priority),
            task_cap=r.task_cap,
            ceiling_override=r.ceiling_override,
            live=int(live.get(r.id, 0)),
            queued=int(queued.get(r.id, 0)),
            paused=r.id in paused,
        )
        for r in runs
    ]


def planner_ceilings(aliases: set[str]) -> dict[str, int]:
    """The latest planner ceiling per alias (aliases the planner has not decided are absent)."""
    if not aliases:
        return {}
    latest = (
        select(PlannerDecision.alias, func.max(PlannerDecision.id).label("id"))
        .where(PlannerDecision.alias.in_(aliases))
        .group_by(PlannerDecision.alias)
        .subquery()
    )
    with engine().connect() as conn:
        rows = conn.execute(
            select(PlannerDecision.alias, PlannerDecision.ceiling).join(
                latest, PlannerDecision.id == latest.c.id
            )
        ).all()
    return {alias: int(ceiling) for alias, ceiling in rows}


def run_ceilings(
    loads: list[RunLoad], alias_ceilings: Mapping[str, int], static_cap: int
) -> dict[str, int]:
    """Each run's ceiling: min(static cap, its cap, its override, its fair share of the alias)."""
    ceilings: dict[str, int] = {}
    for alias in {load.alias for load in loads}:
        on_alias = [load for load in loads if load.alias == alias]
        demands = []
        for load in on_alias:
            cap = min(
                static_cap,
                load.task_cap if load.task_cap is not None else math.inf,
                load.ceiling_override if load.ceiling_override is not None else math.inf,
            )
            usable = 0 if load.paused else int(min(cap, load.live + load.queued))
            demands.append(RunDemand(load.run_id, load.priority, usable))
        shares = fair_shares(alias_ceilings.get(alias, static_cap), demands)
        ceilings.update(shares)
    return ceilings


def admissible(static_cap: int, free_slots: int) -> int:
    """How many jobs may be claimed now (see the module docstring)."""
    loads = run_loads()
    if not loads:
        return 0
    ceilings = run_ceilings(loads, planner_ceilings({x.alias for x in loads}), static_cap)
    wanted = sum(max(0, ceilings[x.run_id] - x.live) for x in loads if x.queued > 0)
    room = static_cap - sum(x.live for x in loads)
    return max(0, min(wanted, room, free_slots))


def claim_jobs(k: int) -> list[Lease]:
    """Claim up to ``k`` jobs of the harness pool (nothing when paused)."""
    if k <= 0:
        return []
    return claim(engine(), "harness", k)


class Launcher(Protocol):
    def free_slots(self) -> int: ...

    def launch(self, ref: JobRef) -> None: ...

    def wait(self, timeout_s: float | None = None) -> None: ...


class InProcessLauncher:
    """Runs instance flows on at most ``threads`` daemon threads of this process.

    Daemon threads, and a bounded ``wait``: a flow stuck in a Prefect API call cannot keep the
    process alive; its lease expires and the reaper sends the job back to the queue.
    """

    def __init__(self, threads: int, run: Callable[[JobRef], Any] | None = None) -> None:
        if run is None:
            from flows.instance import run_instance

            run = run_instance
        self._run = run
        self._threads = threads
        self._lock = threading.Lock()
        self._inflight: set[threading.Thread] = set()

    def free_slots(self) -> int:
        with self._lock:
            return self._threads - len(self._inflight)

    def launch(self, ref: JobRef) -> None:
        # the caller's context (Prefect settings, the dispatcher flow run) goes with the thread
        context = contextvars.copy_context()
        thread = threading.Thread(
            target=context.run,
            args=(self._run_one, ref),
            name=f"instance-{ref.job_id}",
            daemon=True,
        )
        with self._lock:
            self._inflight.add(thread)
        thread.start()

    def _run_one(self, ref: JobRef) -> None:
        try:
            self._run(ref)
        except Exception as exc:
            # the flow requeues what fails inside it; this catches a flow that never started
            log.exception("instance flow of %s failed", ref.instance_id)
            with contextlib.suppress(StaleLease):
                requeue(ref.lease(), exc)
        finally:
            with self._lock:
                self._inflight.discard(threading.current_thread())

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for the running flows, at most ``timeout_s`` (default: the visibility timeout)."""
        limit = timeout_s if timeout_s is not None else get_settings().visibility_timeout_s
        deadline = time.monotonic() + limit
        while True:
            with self._lock:
                left = list(self._inflight)
            if not left or time.monotonic() >= deadline:
                break
            left[0].join(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        if left:
            log.warning(
                "%d instance flow(s) still running at exit; their leases will expire", len(left)
            )


class WorkPoolLauncher:
    """Creates run-instance flow runs on a work pool (their only parameter: the job reference)."""

    def __init__(self, deployment: str, max_inflight: int) -> None:
        self._deployment = deployment
        self._max = max_inflight

    def free_slots(self) -> int:
        return self._max  # the pool's concurrency limit and the ledger's live count bound it

    def launch(self, ref: JobRef) -> None:
        from prefect.deployments import run_deployment

        run_deployment(
            self._deployment,
            parameters={"job": ref.model_dump()},
            timeout=0,
            as_subflow=False,
            flow_run_name=f"{ref.instance_id} #{ref.attempt}",
            tags=["evalfleet", f"run:{ref.run_id}"],
        )

    def wait(self, timeout_s: float | None = None) -> None:
        return None
