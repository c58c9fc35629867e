"""The planner loop's saturation controller (``planner.sizing.hold_overdrive`` in
``tasks.plan_budgets``) on a real PostgreSQL ledger: fed the window's measured use of the budget
the previous decision saturated, only when that window says something about the curve (paced,
warm, no cooldown), persisted in ``pacer_states`` across ticks, reset after an idle gap, and
applied to the sizing's overdrive."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, select, update

from evalfleet.errors import ConfigError
from ledger import pacer_state, pacer_window
from ledger.models import PacerState, PlannerDecision
from planner.budgets import BudgetClass, ControllerActions
from planner.sizing import OverdriveConfig, hold_overdrive
from tasks import plan
from tests import plan_tick_support
from tests.plan_tick_support import ALIAS, T0, add_calls, add_run, stored

# the PostgreSQL ledger fixtures of the planner tick's tests, shared through plan_tick_support
plan_db = plan_tick_support.plan_db
plan_ledger = plan_tick_support.plan_ledger

TICK_S = 15.0


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    """Settings are read once per process: tests here that set them must not leak them."""
    from evalfleet.settings import get_settings

    yield
    get_settings.cache_clear()


def warm(eng: Engine) -> None:
    """Pretend the alias's busy period began an hour ago (past any warm-up)."""
    with eng.begin() as conn:
        conn.execute(
            update(PacerState)
            .where(PacerState.alias == ALIAS)
            .values(busy_since=T0 - timedelta(hours=1))
        )


def saturating(eng: Engine) -> list[tuple[datetime, str, str | None]]:
    with eng.connect() as conn:
        return [
            (r.tick_at, r.binding, r.saturating)
            for r in conn.execute(
                select(PlannerDecision.tick_at, PlannerDecision.binding, PlannerDecision.saturating)
                .where(PlannerDecision.alias == ALIAS)
                .order_by(PlannerDecision.id)
            )
        ]


def window_use(eng: Engine, budget_class: str) -> float:
    """The share of the saturating budget the calls since the last tick used (over one tick)."""
    s = stored(eng)
    with eng.connect() as conn:
        window = pacer_window.read_window(
            conn,
            ALIAS,
            s.last_call_id,
            token_class=s.state.token_class,
            cached_input_counts=s.state.cached_input_counts,
        )
    return window.utilisation(s.state.budgets, TICK_S)[_CLASS[budget_class]]


_CLASS = {"calls_per_s": BudgetClass.REQUESTS, "tokens_per_s": BudgetClass.TOKENS}


def test_an_underused_budget_raises_the_overdrive_and_a_full_one_lowers_it(
    plan_ledger: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from evalfleet.settings import get_settings

    # the token budget saturates here; sized as a calls budget is (token overdrive 1.1), the
    # multiplier is what moves the target (at the default 2.0 it only does above 2.0 / 1.1)
    monkeypatch.setenv("EVALFLEET_PLANNER_TOKEN_OVERDRIVE", "1.1")
    get_settings.cache_clear()
    add_run(plan_ledger, running=3, queued=200)
    first = plan.plan_tick(T0, False)[ALIAS]
    assert first.binding.value == "paced" and first.saturating is not None
    feed = first.saturating.value
    assert saturating(plan_ledger)[-1][1:] == ("paced", feed)
    assert (stored(plan_ledger).overdrive, stored(plan_ledger).busy_since) == (1.0, T0)

    warm(plan_ledger)
    # the window used ~80% of the saturating budget: the fleet is small for the curve
    add_calls(plan_ledger, 290, at=T0 + timedelta(seconds=5))
    util = window_use(plan_ledger, feed)
    assert 0.7 < util < 0.9
    t1 = T0 + timedelta(seconds=TICK_S)
    d1 = plan.plan_tick(t1, False)[ALIAS]
    want = hold_overdrive(1.0, util, OverdriveConfig())
    assert want > 1.05
    assert stored(plan_ledger).overdrive == pytest.approx(want)
    # the same fleet and budgets sized without the multiplier get a smaller target
    s = stored(plan_ledger)
    plain_step = plan.BudgetStep(
        alias=ALIAS,
        state=s.state,
        actions=ControllerActions(),
        pause_runs=(),
        burst_s=2.0,
        cooldown_s=30.0,
        progress=s.progress,
        overdrive=1.0,
    )
    plain = plan.decide_all(t1, plan.read_fleet(t1, False), {ALIAS: plain_step})[ALIAS]
    assert d1.target > plain.target
    assert d1.binding.value == "paced"  # so its window feeds the controller again

    # a fully used budget (the pacer held the surplus back) lowers it again, slowly
    add_calls(plan_ledger, 500, at=t1 + timedelta(seconds=5))
    full = window_use(plan_ledger, feed)
    assert full > 1.0
    plan.plan_tick(t1 + timedelta(seconds=TICK_S), False)
    lowered = stored(plan_ledger).overdrive
    assert lowered == pytest.approx(hold_overdrive(want, full, OverdriveConfig()))
    assert 1.0 <= lowered < want


def test_windows_that_say_nothing_about_the_curve_leave_it_alone(plan_ledger: Engine) -> None:
    add_run(plan_ledger, running=3, queued=200)
    plan.plan_tick(T0, False)
    # warming up: a fleet still filling up under-uses the budget whatever the curve says
    plan.plan_tick(T0 + timedelta(seconds=TICK_S), False)
    assert stored(plan_ledger).overdrive == 1.0
    warm(plan_ledger)
    # a 429 in the window: the cooldown froze the fleet, the window is not the curve's fault
    add_calls(plan_ledger, 1, status=429, limit_type="requests", at=T0 + timedelta(seconds=20))
    d = plan.plan_tick(T0 + timedelta(seconds=2 * TICK_S), False)[ALIAS]
    assert d.binding.value == "cooldown"
    assert stored(plan_ledger).overdrive == 1.0
    # the previous decision was not paced (cooldown): the next window is not fed either
    plan.plan_tick(T0 + timedelta(seconds=3 * TICK_S), False)
    assert stored(plan_ledger).overdrive == 1.0


def test_a_cap_bound_fleet_does_not_feed_it(plan_ledger: Engine) -> None:
    add_run(plan_ledger, running=1, queued=200, task_cap=2)
    assert plan.plan_tick(T0, False)[ALIAS].binding.value == "run_cap"
    warm(plan_ledger)
    plan.plan_tick(T0 + timedelta(seconds=TICK_S), False)  # an idle window: utilisation 0
    assert stored(plan_ledger).overdrive == 1.0


def test_the_overdrive_persists_and_an_idle_gap_starts_a_new_busy_period(
    plan_ledger: Engine,
) -> None:
    add_run(plan_ledger, running=3, queued=200)
    plan.plan_tick(T0, False)
    warm(plan_ledger)
    plan.plan_tick(T0 + timedelta(seconds=TICK_S), False)  # no calls: raised to the maximum
    raised = stored(plan_ledger).overdrive
    assert raised == OverdriveConfig().max_factor
    # a restarted loop (fresh process state) continues with it, and shows it in its artifact
    plan.curve_cache.cache_clear()
    later = T0 + timedelta(seconds=2 * TICK_S)
    fleets = plan.read_fleet(later, False)
    steps = plan.advance_budgets(later, {f.alias: f.harness for f in fleets})
    assert steps[ALIAS].overdrive == OverdriveConfig().max_factor
    table = plan.decision_table(plan.decide_all(later, fleets, steps), steps)
    assert table[0]["overdrive"] == OverdriveConfig().max_factor
    # ten minutes without a tick: a new busy period, multiplier 1, warm-up from now
    back = later + timedelta(minutes=10)
    plan.plan_tick(back, False)
    s = stored(plan_ledger)
    assert (s.overdrive, s.busy_since) == (1.0, back)


def test_a_stored_overdrive_out_of_bounds_is_a_config_error(plan_ledger: Engine) -> None:
    add_run(plan_ledger, running=1, queued=5)
    plan.plan_tick(T0, False)
    with plan_ledger.begin() as conn:
        conn.execute(update(PacerState).where(PacerState.alias == ALIAS).values(overdrive=50.0))
    with pytest.raises(ConfigError, match="overdrive"):
        stored(plan_ledger)


def test_the_planner_sizes_with_the_settings_boot_time(
    plan_ledger: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from evalfleet.settings import get_settings
    from tasks import plan_budgets

    add_run(plan_ledger, running=3, queued=200)
    fleets = plan.read_fleet(T0, False)
    steps = plan.advance_budgets(T0, {f.alias: f.harness for f in fleets})
    fargate = plan.decide_all(T0, fleets, steps)[ALIAS]
    assert plan_budgets.sizing_config().boot_s == 60.0
    monkeypatch.setenv("EVALFLEET_PLANNER_BOOT_S", "5")
    get_settings.cache_clear()
    assert plan_budgets.sizing_config().boot_s == 5.0
    local = plan.decide_all(T0, fleets, steps)[ALIAS]
    # slots that are not a minute booting per task each draw more: fewer are needed
    assert local.target < fargate.target


@pytest.mark.parametrize(
    ("binding", "sized_by", "fed"),
    [
        ("paced", "paced", True),
        ("stale_config", "paced", True),  # a stale label over a paced sizing
        ("stale_config", "arrival_budget", False),  # a wait bound held the fleet
        ("at_capacity", "paced", False),  # the static cap set the fleet
        ("paced", None, True),  # a row from before sized_by existed
        ("stale_config", None, False),
    ],
)
def test_which_stored_decisions_feed_the_controller(
    binding: str, sized_by: str | None, fed: bool
) -> None:
    from tasks.plan_budgets import _fed_by

    previous = pacer_state.PreviousDecision(
        tick_at=T0, binding=binding, saturating="tokens_per_s", sized_by=sized_by
    )
    assert _fed_by(previous) is fed
