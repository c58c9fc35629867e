"""How used the in-flight budget reads to the controller (``planner.inflight_use``): in full
where it sized the fleet, and what that does to rule 7."""

from __future__ import annotations

from planner.budget_state import BudgetClass, Budgets, ControllerConfig, WindowObservation
from planner.budgets import initial_state, step
from planner.classify import LimitType
from planner.decision import Binding
from planner.inflight_use import FULL, inflight_use, sized_by_inflight

BUSY = {
    BudgetClass.REQUESTS: 0.05,
    BudgetClass.TOKENS: 0.07,
    BudgetClass.INFLIGHT: 0.68,
}


def test_a_fleet_sized_by_the_in_flight_budget_uses_it_in_full() -> None:
    used = inflight_use(BUSY, True, limits_stated=True)
    assert used[BudgetClass.INFLIGHT] == 1.0
    assert used[BudgetClass.REQUESTS] == BUSY[BudgetClass.REQUESTS]
    assert inflight_use(BUSY, False, limits_stated=True) == BUSY
    # without stated limits the rate budgets are guesses, and the in-flight budget a brake
    assert inflight_use(BUSY, True, limits_stated=False) == BUSY
    # a peak above the budget (one call larger than the rest of it) stays as measured
    assert (
        inflight_use({**BUSY, BudgetClass.INFLIGHT: 1.3}, True, limits_stated=True)[
            BudgetClass.INFLIGHT
        ]
        == 1.3
    )


def test_a_rate_budget_used_in_full_leaves_the_in_flight_use_as_measured() -> None:
    """The pacer held calls on a rate budget: more tasks would only wait there (the endgame's
    launch of every queued task sizes past the in-flight budget, wide-229)."""
    saturated = {**BUSY, BudgetClass.TOKENS: FULL}
    assert inflight_use(saturated, True, limits_stated=True) == saturated
    nearly = {**BUSY, BudgetClass.OUTPUT_TOKENS: 0.95}
    assert inflight_use(nearly, True, limits_stated=True)[BudgetClass.INFLIGHT] == 1.0


def test_an_idle_window_says_nothing_even_when_the_fleet_was_sized_by_it() -> None:
    idle = dict.fromkeys(BUSY, 0.0)
    assert inflight_use(idle, True, limits_stated=True) == idle
    # a call held in flight all window is busy
    holding = {**idle, BudgetClass.INFLIGHT: 0.4}
    assert inflight_use(holding, True, limits_stated=True)[BudgetClass.INFLIGHT] == 1.0


def test_sized_by_reads_the_binding_or_the_constraint_under_a_stale_label() -> None:
    assert sized_by_inflight(Binding.INFLIGHT_BUDGET.value, None)
    assert sized_by_inflight(Binding.STALE_CONFIG.value, Binding.INFLIGHT_BUDGET.value)
    assert not sized_by_inflight(Binding.PACED.value, Binding.PACED.value)
    assert not sized_by_inflight(None, None)


def test_rule_7_re_bases_an_in_flight_seed_that_sizes_the_fleet_where_limits_are_stated() -> None:
    """Through ``step``: at 1.5x its seed, the in-flight budget is re-based up within a few
    minutes when the window says the fleet was sized by it and the provider states its limits;
    at its measured peak (0.68) never, nor without stated limits."""
    config = ControllerConfig()
    seed = Budgets(
        calls_per_s=10.0, tokens_per_s=10_000.0, output_tokens_per_s=None, inflight_tokens=30_000.0
    )

    def seed_after(*, sized: bool, stated: bool) -> float:
        state = initial_state(
            seed,
            0.0,
            observed_limits={LimitType.REQUESTS: 6_000.0} if stated else None,
            cached_input_counts=False,
            token_class="input",
            config=config,
        )
        for i in range(1, 41):
            obs = WindowObservation(
                now=15.0 * i, utilisation=BUSY, answered=3, sized_by_inflight=sized
            )
            state, _ = step(state, obs, config)
        value = state.seed.inflight_tokens
        assert value is not None
        return value

    assert seed_after(sized=True, stated=True) > 1.4 * 30_000.0
    assert seed_after(sized=False, stated=True) == 30_000.0
    assert seed_after(sized=True, stated=False) == 30_000.0
