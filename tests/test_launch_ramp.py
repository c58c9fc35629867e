"""The launch ramp: until the provider has answered (or while its headers leave a budgeted
class a guess) and no 429 has come, the fleet grows by a bounded factor per tick — in the
controller's flags, in the sizing, through the ledger's planner tick, and in the simulator."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine

from evalfleet.errors import ConfigError
from ledger import pacer_state
from planner.budgets import BudgetState
from planner.classify import LimitType
from planner.decision import Binding
from planner.sizing import Caps, Counting, FleetState, SizingConfig, decide
from sim.engine import Simulation
from sim.limits import ProviderLimits
from sim.metrics import limit_spec
from sim.planner_policy import PlannerPolicy
from sim.reveal import headers_now
from sim.scenario import load_scenario
from sim.workload import build_workload
from tasks import plan
from tests import plan_tick_support
from tests.budget_support import fresh, window
from tests.plan_tick_support import ALIAS, T0, add_calls, add_run, add_stated_limits, stored
from tests.sim.sim_support import ROOT
from tests.test_sizing import B, flat_curve

plan_db = plan_tick_support.plan_db
plan_ledger = plan_tick_support.plan_ledger

SIZING = SizingConfig(boot_s=30.0)
RAMP = SizingConfig()  # the default launch ramp: from 100 tasks, 1.2x per tick


def tick(state: BudgetState, now: float, *throttles: LimitType, **kw: Any) -> BudgetState:
    return window(state, now, *throttles, **kw)[0]


# -- the controller's flags -------------------------------------------------------------------


def test_a_fresh_seed_ramps_and_the_first_answer_without_headers_ends_it() -> None:
    s = fresh()
    assert s.ramping()
    s = tick(s, 15.0)  # the first tasks are still booting: nothing answered
    assert s.ramping()
    s = tick(s, 30.0, answered=4)
    assert not s.ramping()
    assert not tick(s, 45.0).ramping()  # it does not come back


def test_headers_that_leave_a_budgeted_class_a_guess_ramp_until_the_first_429() -> None:
    """OpenAI states requests and tokens, not output: the output seed is still a guess."""
    stated = {LimitType.REQUESTS: 1200.0, LimitType.INPUT_TOKENS: 1_200_000.0}
    s = tick(fresh(), 15.0, answered=3, observed_limits=stated)
    assert s.answered and s.ramping()
    s = tick(s, 30.0, answered=50, observed_limits=stated)
    assert s.ramping()
    s = tick(s, 45.0, LimitType.OUTPUT_TOKENS, answered=50, observed_limits=stated)
    assert s.throttled and not s.ramping()


def test_headers_stating_every_budgeted_class_end_it_at_once() -> None:
    stated = {
        LimitType.REQUESTS: 1200.0,
        LimitType.INPUT_TOKENS: 1_200_000.0,
        LimitType.OUTPUT_TOKENS: 300_000.0,
    }
    assert not tick(fresh(), 15.0, answered=1, observed_limits=stated).ramping()
    # headers stated before the seed (a restarted loop reads the last hours'): answered
    assert not fresh(observed_limits=stated).ramping()


def test_any_rate_429_ends_it_but_an_overload_does_not() -> None:
    assert not tick(fresh(), 15.0, LimitType.UNKNOWN).ramping()
    assert tick(fresh(), 15.0, LimitType.OVERLOAD).ramping()
    assert tick(fresh(), 15.0, overloads=2).ramping()


def test_the_flags_persist_and_a_state_saved_before_them_does_not_ramp() -> None:
    s = tick(fresh(), 15.0, answered=2)
    data = pacer_state.state_to_json(s)
    back = pacer_state.state_from_json(data, source="t")
    assert (back.answered, back.throttled) == (True, False)
    young = pacer_state.state_from_json(pacer_state.state_to_json(fresh()), source="t")
    assert young.ramping()
    old = {k: v for k, v in pacer_state.state_to_json(fresh()).items()
           if k not in ("answered", "throttled")}  # fmt: skip
    assert not pacer_state.state_from_json(old, source="t").ramping()
    with pytest.raises(ConfigError, match="answered: must be true or false"):
        pacer_state.state_from_json({**data, "answered": "yes"}, source="t")


# -- the sizing -------------------------------------------------------------------------------


def ramp_fleet(live_running: int, booting: int = 0, **kw: Any) -> FleetState:
    return FleetState(
        now=0.0,
        ages=np.full(live_running, 60.0),
        booting=booting,
        queued=5000,
        ramping=True,
        **kw,
    )


def test_a_ramping_fleet_grows_by_the_factor_per_tick_from_the_floor() -> None:
    curve, budgets = flat_curve(), B(tokens_per_s=1e6, calls_per_s=1e6)
    target = decide(replace(ramp_fleet(0), ramping=False), curve, budgets, Counting(), Caps(),
                    SIZING).ceiling  # fmt: skip
    assert target > 1000
    first = decide(ramp_fleet(0), curve, budgets, Counting(), Caps(), SIZING)
    floor = RAMP.ramp_floor
    assert (first.ceiling, first.binding, first.launches_allowed) == (
        floor,
        Binding.LAUNCH_RAMP,
        floor,
    )
    assert first.target == target  # what the budgets asked for stays on the record
    assert not first.feeds_saturation  # a ramp-held fleet says nothing about the curve
    later = decide(ramp_fleet(160, booting=40), curve, budgets, Counting(), Caps(), SIZING)
    assert (later.ceiling, later.launches_allowed) == (240, 40)


def test_a_cap_below_the_ramp_binds_and_a_target_below_it_is_kept() -> None:
    curve = flat_curve()
    capped = decide(ramp_fleet(0), curve, B(tokens_per_s=1e6, calls_per_s=1e6), Counting(),
                    Caps(static=40), SIZING)  # fmt: skip
    assert (capped.ceiling, capped.binding) == (40, Binding.AT_CAPACITY)
    small = decide(ramp_fleet(0), curve, B(calls_per_s=2.0), Counting(), Caps(), SIZING)
    assert small.binding is Binding.PACED and small.ceiling < RAMP.ramp_floor
    frozen = decide(ramp_fleet(100, in_cooldown=True), curve, B(), Counting(), Caps(), SIZING)
    assert frozen.binding is Binding.COOLDOWN and frozen.launches_allowed == 0


def test_bad_ramp_constants_are_refused() -> None:
    for bad in ({"ramp_floor": 0}, {"ramp_growth": 1.0}, {"ramp_growth": 5.0}):
        with pytest.raises(ConfigError, match="ramp_"):
            SizingConfig(**bad)


# -- the planner tick on the ledger -------------------------------------------------------------


@pytest.fixture
def ramp_of_10(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The settings' ramp floor at 10 (the embedded alias's seed sizes ~35 tasks)."""
    from evalfleet.settings import get_settings

    monkeypatch.setenv("EVALFLEET_PLANNER_LAUNCH_RAMP_FLOOR", "10")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_the_planner_tick_ramps_until_the_first_answer(
    plan_ledger: Engine, ramp_of_10: None
) -> None:
    add_run(plan_ledger, queued=2000)
    first = plan.plan_tick(T0, False)[ALIAS]
    assert first.target > 10  # the seed would launch more at once
    assert (first.binding.value, first.ceiling) == ("launch_ramp", 10)
    assert stored(plan_ledger).state.ramping()
    add_calls(plan_ledger, 5, at=T0 + timedelta(seconds=10))  # answers, no headers recorded
    second = plan.plan_tick(T0 + timedelta(seconds=15), False)[ALIAS]
    assert second.binding.value != "launch_ramp" and second.ceiling > 10
    assert not stored(plan_ledger).state.ramping()


def test_stated_headers_for_every_class_skip_the_ramp(
    plan_ledger: Engine, ramp_of_10: None
) -> None:
    add_run(plan_ledger, queued=2000)
    add_stated_limits(plan_ledger, {"requests": 6000.0, "tokens": 6_000_000.0})
    d = plan.plan_tick(T0, False)[ALIAS]
    assert d.binding.value != "launch_ramp" and d.ceiling > 10


# -- the lesson in the simulator ----------------------------------------------------------------


def test_a_first_cohort_is_not_sized_on_a_seed_the_provider_has_not_confirmed() -> None:
    """The issue's example with an output seed 2.5x the provider's output limit, which
    OpenAI-style headers do not state (``scenarios/outside/issue-example-openai-out-tight``):
    without the ramp the whole first cohort is launched on the seed before any call returns,
    several times the fleet the output limit sustains, and the run is slower for it; with it
    the fleet grows from the ramp's floor while the first answers and 429s come in."""
    scenario = load_scenario(ROOT / "scenarios" / "outside" / "issue-example-openai-out-tight.yaml")
    boot = scenario.harness.boot_s

    def run(ramp: bool) -> tuple[list[int], float]:
        workload = build_workload(scenario)
        provider = ProviderLimits(*limit_spec(scenario))
        # without the ramp: a floor no fleet here reaches
        sizing = SizingConfig(
            boot_s=(boot.min + boot.max) / 2.0, ramp_floor=RAMP.ramp_floor if ramp else 10_000
        )
        policy = PlannerPolicy(
            scenario, workload, lambda now: headers_now("openai", provider, now), sizing=sizing
        )
        stats = Simulation(workload, policy, provider, "openai").run()
        return [d.ceiling for d in policy.decisions], stats.makespan_s

    (naive, naive_makespan), (ramped, ramped_makespan) = run(False), run(True)
    settled = naive[40]  # ten minutes in: the output limit found
    assert naive[0] > 2 * settled  # the seed's first cohort, launched before any answer
    assert ramped[0] == RAMP.ramp_floor < naive[0]
    assert ramped[1] == math.ceil(RAMP.ramp_growth * ramped[0] - 1e-9)
    assert ramped_makespan < naive_makespan
