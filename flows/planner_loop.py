"""Flow ``planner``: the long-running planner loop (one active run; restarted if it crashes).

Every ``planner_tick_s`` (15 s) it reads the clock once and runs the tick's tasks in order
(``tasks/plan.py`` holds what each does): read the fleet per alias, advance the budget
controller (state persisted in the ledger, so a restarted loop continues), pause runs that hit
a spend error, decide, write a ``planner_decisions`` row per alias, push the budgets to the
pacer's Prefect limits, and keep a Prefect table artifact of the latest decisions (ceiling,
live, booting, binding constraint, budgets). ``max_ticks`` bounds the loop (tests);
``until_idle`` stops it once no claimable run is left (the demo).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from prefect import flow, task
from prefect.artifacts import create_table_artifact

from evalfleet.settings import get_settings
from tasks import plan

# Only side effects are tasks (reads and the pure decision are plain calls): every task run is
# a few writes to the Prefect API, and a SQLite-backed server (the embedded demo) is short of them.
advance_budgets = task(name="advance-budgets")(plan.advance_budgets)
pause_for_spend = task(name="pause-for-spend")(plan.pause_for_spend)
record_decisions = task(name="record-decisions")(plan.record_decisions)
push_pacer_limits = task(name="push-pacer-limits")(plan.push_pacer_limits)


def tick(now: datetime, harness_pool: str) -> int:
    """One planner tick; returns how many aliases were decided."""
    fleets = plan.read_fleet(now, plan.prefect_pool_paused(harness_pool))
    if not fleets:
        return 0
    steps = advance_budgets(now, {f.alias: f.harness for f in fleets})
    if any(s.pause_runs for s in steps.values()):
        pause_for_spend(steps)
    decisions = plan.decide_all(now, fleets, steps)
    record_decisions(now, decisions)
    push_pacer_limits(steps, decisions)
    if decisions:
        create_table_artifact(
            key="evalfleet-planner",
            table=plan.decision_table(decisions, steps),
            description="Latest planner decision per alias",
        )
    return len(decisions)


@flow(name="planner", persist_result=False)
def planner_loop(max_ticks: int | None = None, until_idle: bool = False) -> int:
    """Tick until stopped, ``max_ticks``, or (``until_idle``) no claimable run is left."""
    settings = get_settings()
    ticks = 0
    next_at = time.monotonic()
    while max_ticks is None or ticks < max_ticks:
        decided = tick(datetime.now(UTC), settings.harness_pool)
        ticks += 1
        if until_idle and not decided:
            break
        next_at += settings.planner_tick_s
        time.sleep(max(0.0, next_at - time.monotonic()))
    return ticks
