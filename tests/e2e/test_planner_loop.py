"""The planner loop flow on the session's Prefect server and a PostgreSQL ledger: a decision per
alias every tick, budgets pushed to the pacer's Prefect limits (read back), a restarted loop
continues the controller's state, the table artifact, and a pool paused through the Prefect
client or the ledger flag binds ``paused``."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from evalfleet.settings import get_settings
from ledger.db import make_engine
from ledger.models import PlannerDecision
from ledger.pauses import set_pause
from planner.budgets import Budgets
from tasks import ledger_io, plan
from tests.plan_tick_support import ALIAS, add_calls, add_run, stored

pytestmark = [pytest.mark.postgres, pytest.mark.prefect, pytest.mark.slow]

TICK_S = 3.0


@pytest.fixture
def loop_env(
    prefect_api_url: str, e2e_ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Settings for the loop: a fresh ledger, a 3 s tick, a harness pool of this test's own."""
    pool = f"plan-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", e2e_ledger_url)
    monkeypatch.setenv("EVALFLEET_PLANNER_TICK_S", str(TICK_S))
    monkeypatch.setenv("EVALFLEET_HARNESS_POOL", pool)
    monkeypatch.delenv("EVALFLEET_ALIASES_FILE", raising=False)
    get_settings.cache_clear()
    ledger_io.engine.cache_clear()
    ledger_io.sessions.cache_clear()
    import prefect.context

    prefect.context.refresh_global_settings_context()
    yield pool
    ledger_io.engine().dispose()
    get_settings.cache_clear()


def _decisions() -> list[tuple[datetime, str, int, dict[str, float]]]:
    with ledger_io.engine().connect() as conn:
        rows = conn.execute(
            select(
                PlannerDecision.tick_at,
                PlannerDecision.binding,
                PlannerDecision.ceiling,
                PlannerDecision.budgets,
            )
            .where(PlannerDecision.alias == ALIAS)
            .order_by(PlannerDecision.id)
        ).all()
    return [(t, b, c, dict(bu)) for t, b, c, bu in rows]


def _prefect_budgets() -> Budgets:
    from prefect.utilities.asyncutils import run_coro_as_sync

    from gateway.pacer_prefect import read_budgets

    return run_coro_as_sync(read_budgets(plan.aliases().get(ALIAS)))


def test_the_loop_decides_every_tick_and_pushes_budgets_to_prefect(loop_env: str) -> None:
    from prefect import get_client

    from flows.planner_loop import planner_loop

    eng = make_engine(get_settings().ledger_url)
    add_run(eng, running=2, queued=20, task_cap=4, now=datetime.now(UTC))
    assert planner_loop(max_ticks=4) == 4
    rows = _decisions()
    assert len(rows) == 4
    gaps = [(b[0] - a[0]).total_seconds() for a, b in itertools.pairwise(rows)]
    # the loop keeps a fixed schedule: single gaps jitter with the machine's load (a tick is a
    # few Prefect task runs), the span of three ticks does not drift
    assert all(0.5 * TICK_S < g < 1.5 * TICK_S for g in gaps), gaps
    assert abs(sum(gaps) - 3 * TICK_S) < 1.0, gaps
    assert {r[1] for r in rows} == {"run_cap"} and {r[2] for r in rows} == {4}

    state = stored(eng).state
    pushed = _prefect_budgets()
    assert pushed == state.budgets  # what the gateway's Prefect pacer will read

    with get_client(sync_client=True) as client:
        artifact = client.read_latest_artifacts()
    tables = [a for a in artifact if a.key == "evalfleet-planner"]
    assert tables and ALIAS in str(tables[0].data) and "run_cap" in str(tables[0].data)

    # a 429 on requests between two runs of the loop: the restarted loop cuts the request
    # budget only and pushes it to Prefect
    add_calls(eng, 2, status=429, limit_type="requests")
    assert planner_loop(max_ticks=1) == 1
    after = _prefect_budgets()
    assert after.calls_per_s == pytest.approx(state.budgets.calls_per_s * 0.75)
    assert after.tokens_per_s == pytest.approx(state.budgets.tokens_per_s)
    assert _decisions()[-1][1] == "cooldown"
    eng.dispose()


def test_a_pool_paused_through_prefect_or_the_ledger_binds_paused(loop_env: str) -> None:
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate

    from flows.planner_loop import planner_loop

    pool = loop_env
    eng = make_engine(get_settings().ledger_url)
    add_run(eng, running=2, queued=20, now=datetime.now(UTC))
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        try:
            client.update_work_pool(pool, WorkPoolUpdate(is_paused=True))
            planner_loop(max_ticks=1)
            assert _decisions()[-1][1] == "paused"

            client.update_work_pool(pool, WorkPoolUpdate(is_paused=False))
            planner_loop(max_ticks=1)
            assert _decisions()[-1][1] != "paused"

            set_pause(eng, "pool", "harness", True, actor="t", reason="maintenance")
            planner_loop(max_ticks=1)
            assert _decisions()[-1][1] == "paused"
            assert _decisions()[-1][2] <= 2  # nothing beyond the live fleet
        finally:
            client.delete_work_pool(pool)
    eng.dispose()


def test_the_queue_order_a_decision_names_reaches_the_gateways_prefect_variable(
    loop_env: str,
) -> None:
    """``push_pacer_limits`` writes ``Decision.old_tasks_first`` where the gateway's Prefect
    pacer reads it (``read_old_tasks_first``): off, then back on; ``record_decisions`` keeps
    it in ``planner_decisions``."""
    from dataclasses import replace

    from prefect.utilities.asyncutils import run_coro_as_sync

    from gateway.pacer_prefect import read_old_tasks_first

    eng = make_engine(get_settings().ledger_url)
    now = datetime.now(UTC)
    add_run(eng, running=2, queued=20, now=now)
    fleets = plan.read_fleet(now, prefect_paused=False)
    steps = plan.advance_budgets(now, {f.alias: f.harness for f in fleets})
    decisions = plan.decide_all(now, fleets, steps)
    assert decisions[ALIAS].old_tasks_first  # instances are queued
    assert plan.decision_table(decisions)[0]["output_queue"] == "oldest task first"
    dry = replace(decisions[ALIAS], old_tasks_first=False)
    assert plan.decision_table({ALIAS: dry})[0]["output_queue"] == "arrival"  # the UI shows it
    alias = plan.aliases().get(ALIAS)
    for order in (False, True):
        plan.push_pacer_limits(steps, {ALIAS: replace(decisions[ALIAS], old_tasks_first=order)})
        assert run_coro_as_sync(read_old_tasks_first(alias)) is order
    # a planner process that stopped in a run's endgame left arrival order behind: a new
    # process's first push restores the order its own decision names
    plan.push_pacer_limits(steps, {ALIAS: replace(decisions[ALIAS], old_tasks_first=False)})
    plan._PUSHED.clear()
    plan.push_pacer_limits(steps, decisions)
    assert run_coro_as_sync(read_old_tasks_first(alias)) is True
    # the ledger keeps the order each tick named, for the notebooks
    for order in (True, False):
        plan.record_decisions(now, {ALIAS: replace(decisions[ALIAS], old_tasks_first=order)})
    with ledger_io.engine().connect() as conn:
        recorded = conn.scalars(
            select(PlannerDecision.old_tasks_first)
            .where(PlannerDecision.alias == ALIAS)
            .order_by(PlannerDecision.id.desc())
            .limit(2)
        ).all()
    assert recorded == [False, True]
    eng.dispose()
