"""Flow ``supervisor``: the long-running supervisor loop (one active run; restarted on crash).

Every ``supervisor_tick_s`` (30 s), first the capacity observer (one snapshot per pool, the
eval pool scaled to its queue), then: reap expired leases and attempts whose flow run Prefect
reports over (``booting`` ones included), move finished runs to ``closed``
(revoking their keys), revoke keys left on closed/aborted/failed runs, write one capacity
snapshot per pool, scale the eval pool to its queue (queued eval jobs plus run-eval flow runs
waiting on the pool), and publish each open run's progress
(Valkey hash when configured, Prefect progress artifact; ``tasks.progress``). ``max_ticks``
bounds the loop (tests).
"""

from __future__ import annotations

import time

from prefect import flow, task

from evalfleet.settings import get_settings
from tasks import progress, supervise

reap = task(name="reap")(supervise.reap)
complete_runs = task(name="complete-runs")(supervise.complete_runs)
recover_keys = task(name="recover-keys")(supervise.recover_keys)
snapshot = task(name="capacity-snapshot")(supervise.snapshot_capacity)
scale_eval = task(name="scale-eval-pool")(supervise.scale_eval_pool)
publish_progress = task(name="publish-progress")(progress.publish_runs)


def supervise_once(scale_eval_pool: bool) -> int:
    """One supervisor tick; returns how many runs are still running or draining."""
    settings = get_settings()
    # the capacity observer first: its snapshots keep the tick's cadence, whatever the reaper's
    # Prefect queries cost this tick (under load they varied by seconds)
    counts = supervise.pool_counts()
    backlog = supervise.eval_backlog() if scale_eval_pool else 0
    limit = scale_eval(counts["eval"]["queued"] + backlog) if scale_eval_pool else 0
    snapshot({"harness": settings.static_cap, "eval": limit}, backlog)
    reap()
    still_changing = progress.open_run_ids()  # before closing: a run closed now is published too
    complete_runs()
    recover_keys()
    publish_progress(still_changing)
    return supervise.open_runs()


@flow(name="supervisor", persist_result=False)
def supervisor_loop(
    max_ticks: int | None = None, scale_eval_pool: bool = True, until_idle: bool = False
) -> int:
    """Tick until stopped, ``max_ticks``, or (``until_idle``) no run is open any more."""
    settings = get_settings()
    ticks = 0
    next_at = time.monotonic()
    while max_ticks is None or ticks < max_ticks:
        still_open = supervise_once(scale_eval_pool)
        ticks += 1
        if until_idle and not still_open:
            break
        next_at += settings.supervisor_tick_s
        time.sleep(max(0.0, next_at - time.monotonic()))
    return ticks
