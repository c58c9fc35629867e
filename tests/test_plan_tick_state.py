"""The planner tick's persisted controller state (``ledger.pacer_state``): the budget
controller's state round-trips through the JSON ``pacer_states`` holds, and a malformed stored
state is a config error naming the field. Split from ``test_plan_tick.py``."""

from __future__ import annotations

import math

import pytest

from evalfleet.errors import ConfigError
from ledger import pacer_state
from planner.budgets import BudgetClass, Budgets, initial_state

pytestmark = pytest.mark.postgres


# ---------------------------------------------------------------------------------------------
# the persisted state


def test_state_round_trips_through_json_without_infinities() -> None:
    seed = Budgets(
        calls_per_s=9.0, tokens_per_s=27_000.0, output_tokens_per_s=None, inflight_tokens=4e5
    )
    state = initial_state(seed, 100.0, cached_input_counts=True, token_class="combined")
    assert math.isinf(state.cooldown_until)
    data = pacer_state.state_to_json(state)
    assert data["cooldown_until"] is None
    assert pacer_state.state_from_json(data, source="t") == state
    from dataclasses import replace

    busy = replace(
        state,
        cooldown_until=130.0,
        last_429_level={BudgetClass.REQUESTS: 9.0},
        last_429_at={BudgetClass.REQUESTS: 100.0},
        cuts_below_seed={BudgetClass.TOKENS: (90.0, 95.0)},
        hard_caps={BudgetClass.REQUESTS: 8.0},
        observed={BudgetClass.REQUESTS: 8.0},
        observed_at=99.0,
        last_stated={BudgetClass.REQUESTS: 8.0, BudgetClass.OUTPUT_TOKENS: 900.0},
        at_ceiling_since={BudgetClass.INFLIGHT: 97.0},
        at_ceiling_used_s={BudgetClass.INFLIGHT: 2.5},
        usage_carry={BudgetClass.TOKENS: 1.5},
        unknown_samples=((98.0, {BudgetClass.TOKENS: 21_000.0, BudgetClass.REQUESTS: 7.5}),),
        share_rebased_at={BudgetClass.TOKENS: 95.0},
        level_memory_s={BudgetClass.REQUESTS: 2400.0},
        rebase_up_streak={BudgetClass.TOKENS: 2},
        proven_rate={BudgetClass.TOKENS: 24_000.0},
        class_seeded_at={BudgetClass.TOKENS: 96.0},
        unsettled_reprobe={BudgetClass.TOKENS: (99.0, 30_000.0, 20_000.0)},
    )
    assert pacer_state.state_from_json(pacer_state.state_to_json(busy), source="t") == busy
    # a state saved before the re-base-up rule (or the steadiest-class blame) lacks their fields
    old = pacer_state.state_to_json(state)
    for key in (
        "at_ceiling_since",
        "at_ceiling_used_s",
        "usage_carry",
        "unknown_samples",
        "share_rebased_at",
        "level_memory_s",
        "rebase_up_streak",
        "proven_rate",
        "last_stated",
        "class_seeded_at",
        "unsettled_reprobe",
    ):
        del old[key]
    assert pacer_state.state_from_json(old, source="t") == state


def test_a_malformed_stored_state_is_a_config_error_naming_the_field() -> None:
    seed = Budgets(
        calls_per_s=9.0, tokens_per_s=27_000.0, output_tokens_per_s=None, inflight_tokens=4e5
    )
    data = pacer_state.state_to_json(
        initial_state(seed, 100.0, cached_input_counts=True, token_class="combined")
    )
    data["budgets"]["calls_per_s"] = -1.0
    data["token_class"] = "bytes"
    data["unknown_samples"] = [
        {"at": 1.0, "rates": {"tokens": 5.0}},
        {"at": 2.0, "rates": {"x": 1}},
    ]
    data["unsettled_reprobe"] = {"tokens": {"at": 1.0, "drawn": "high", "kept": 2.0}}
    with pytest.raises(ConfigError) as err:
        pacer_state.state_from_json(data, source="pacer_states 'x'")
    text = str(err.value)
    assert "budgets.calls_per_s" in text and "token_class" in text and "pacer_states" in text
    assert "unknown_samples[1].rates.x" in text and "unknown_samples[0]" not in text
    assert "unsettled_reprobe.tokens" in text
