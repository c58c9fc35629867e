"""Flow ``planner``: the long-running planner loop (one active run; restarted if it crashes).

Every ``planner_tick_s`` (15 s): read the fleet and budgets per alias, call the pure planner,
write a ``planner_decisions`` row per alias and keep a Prefect table artifact of the latest
decisions (ceiling, live, booting, binding constraint). ``max_ticks`` bounds the loop (tests).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from prefect import flow, task
from prefect.artifacts import create_table_artifact

from evalfleet.settings import get_settings
from tasks import plan

plan_tick = task(name="plan-tick")(plan.plan_tick)


@flow(name="planner", persist_result=False)
def planner_loop(max_ticks: int | None = None, until_idle: bool = False) -> int:
    """Tick until stopped, ``max_ticks``, or (``until_idle``) no claimable run is left."""
    settings = get_settings()
    ticks = 0
    next_at = time.monotonic()
    while max_ticks is None or ticks < max_ticks:
        paused = plan.prefect_pool_paused(settings.harness_pool)
        decisions = plan_tick(datetime.now(UTC), paused)
        if decisions:
            create_table_artifact(
                key="evalfleet-planner",
                table=plan.decision_table(decisions),
                description="Latest planner decision per alias",
            )
        ticks += 1
        if until_idle and not decisions:
            break
        next_at += settings.planner_tick_s
        time.sleep(max(0.0, next_at - time.monotonic()))
    return ticks
