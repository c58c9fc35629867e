"""The planner tick settles a re-probe once the gateway says its calls in flight are recorded
(``tasks.plan_settle``), on a real PostgreSQL ledger: the drained rate is read again up to the
re-probe, and where it shows the limit rose the level remembered follows
(``planner.settled_drain``). Before the gateway says so, the re-probe waits."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, delete, insert

from ledger import pacer_state
from ledger.models import COMPLETE_BEFORE_KEY, AliasObservation
from planner.budget_state import BudgetClass, ControllerConfig
from tasks import plan
from tests import plan_tick_support
from tests.plan_tick_support import ALIAS, T0, add_calls, add_run, stored

pytestmark = pytest.mark.postgres

plan_db = plan_tick_support.plan_db
plan_ledger = plan_tick_support.plan_ledger

REQ = BudgetClass.REQUESTS
AT = T0 + timedelta(seconds=20)  # the re-probe's tick
KEPT, DRAWN = 7.0, 12.0  # calls/s: the old level it kept, the level it drew its 429 at


def _complete_before(eng: Engine, when: datetime) -> None:
    """The gateway's latest observation: every call requested before ``when`` is recorded."""
    with eng.begin() as conn:
        conn.execute(delete(AliasObservation).where(AliasObservation.alias == ALIAS))
        conn.execute(
            insert(AliasObservation).values(
                alias=ALIAS,
                observed_at=when,
                status=200,
                headers={},
                limits={COMPLETE_BEFORE_KEY: when.timestamp()},
            )
        )


def test_a_reprobe_is_settled_once_its_calls_in_flight_are_recorded(plan_ledger: Engine) -> None:
    add_run(plan_ledger, running=5, queued=30)
    plan.plan_tick(T0, False)
    row = stored(plan_ledger)
    at = AT.timestamp()
    state = replace(
        row.state,
        budgets=replace(row.state.budgets, calls_per_s=KEPT * 0.75),
        last_429_level={REQ: KEPT},
        last_429_at={REQ: at},
        level_memory_s={REQ: 2400.0},
        last_cut_at={REQ: at},
        unsettled_reprobe={REQ: (at, DRAWN, KEPT)},
    )
    pacer_state.save_state(plan_ledger, replace(row, state=state))
    # 600 calls requested at the re-probe: its bucket drained at 600 / 60 s = 10 calls/s; the
    # calls after it do not count
    add_calls(plan_ledger, 600, at=AT)
    add_calls(plan_ledger, 300, at=AT + timedelta(seconds=5))

    _complete_before(plan_ledger, AT - timedelta(seconds=1))  # one is still in flight
    plan.plan_tick(T0 + timedelta(seconds=30), False)
    waiting = stored(plan_ledger).state
    assert waiting.unsettled_reprobe == {REQ: (at, DRAWN, KEPT)}
    assert waiting.last_429_level[REQ] == KEPT

    _complete_before(plan_ledger, AT + timedelta(seconds=2))
    plan.plan_tick(T0 + timedelta(seconds=45), False)
    settled = stored(plan_ledger).state
    cfg = ControllerConfig()
    assert settled.unsettled_reprobe == {}
    assert settled.last_429_level[REQ] == pytest.approx(10.0 / (1 - cfg.probe_margin), rel=0.01)
    assert settled.level_memory_s[REQ] == cfg.memory_s
