"""Rule 8 of the budget controller: one call the provider accepted whole proves its bucket held
it, so a budget far below one call's size is re-based up to that call / a minute."""

from __future__ import annotations

from dataclasses import replace

from planner.budgets import Budgets, BudgetState, initial_state
from planner.classify import LimitType
from tests.budget_support import CFG, OUT, REQ, SEED, TOK, fresh, window

TINY = replace(SEED, tokens_per_s=24.0, output_tokens_per_s=2.0)


def _tiny() -> BudgetState:
    return initial_state(TINY, 0.0, cached_input_counts=False, token_class="input")


def test_a_call_larger_than_a_minute_of_the_budget_re_bases_it_to_that_call_a_minute() -> None:
    state = _tiny()

    state, actions = window(state, 15.0, answered=1, largest_accepted={TOK: 57_000.0, OUT: 600.0})

    assert state.budgets.tokens_per_s == 57_000.0 / CFG.provider_burst_s
    assert state.seed.tokens_per_s == 57_000.0 / CFG.provider_burst_s
    assert state.budgets.output_tokens_per_s == 600.0 / CFG.provider_burst_s
    assert state.earned_seed(TOK) == 57_000.0 / CFG.provider_burst_s  # proven, all of it
    assert TOK in actions.rebased and OUT in actions.rebased
    assert state.seed.calls_per_s == TINY.calls_per_s  # one call proves nothing of requests
    assert REQ not in actions.rebased
    assert any("accepted one call of 57000 tokens" in n for n in actions.notes)


def test_calls_within_a_minute_of_the_budget_prove_nothing_new() -> None:
    """In steady running the pacer lets through a bucket plus one call's debt: the proof of a
    call smaller than a minute of the budget is below it, and nothing moves."""
    state = fresh()
    before = state

    state, actions = window(
        state, 15.0, answered=40, largest_accepted={TOK: 25_000.0 * 59, OUT: 5_000.0 * 30}
    )

    assert state.budgets.tokens_per_s >= before.budgets.tokens_per_s  # growth only
    assert state.seed == before.seed
    assert actions.rebased == ()


def test_a_budget_cut_below_its_seed_comes_up_only_to_the_proof() -> None:
    state = fresh()
    state = replace(state, budgets=state.budgets.with_value(TOK, 1_000.0))

    state, _ = window(state, 15.0, answered=1, largest_accepted={TOK: 120_000.0})

    assert state.budgets.tokens_per_s == 2_000.0
    assert state.seed.tokens_per_s == SEED.tokens_per_s  # the seed was above the proof
    assert state.proven_rate == {}


def test_a_limit_a_header_states_is_not_second_guessed() -> None:
    stated = initial_state(
        TINY,
        0.0,
        observed_limits={LimitType.INPUT_TOKENS: 1_200.0},  # 20 tokens/s
        cached_input_counts=False,
        token_class="input",
    )

    state, _ = window(stated, 15.0, answered=1, largest_accepted={TOK: 57_000.0})

    assert state.budgets.tokens_per_s == 20.0


def test_a_class_throttled_in_the_window_is_not_re_based() -> None:
    state = _tiny()

    state, actions = window(
        state, 15.0, LimitType.INPUT_TOKENS, answered=1, largest_accepted={TOK: 57_000.0}
    )

    assert state.budgets.tokens_per_s < TINY.tokens_per_s  # cut, not lifted
    assert TOK in actions.cut and TOK not in actions.rebased


def test_without_the_evidence_nothing_is_proven() -> None:
    state = _tiny()

    state, actions = window(state, 15.0, answered=1)

    assert state.budgets.tokens_per_s <= TINY.tokens_per_s * (1 + CFG.growth) + 1e-9
    assert actions.rebased == ()


def test_requests_alone_never_move() -> None:
    tiny_requests = Budgets(
        calls_per_s=0.001, tokens_per_s=1e6, output_tokens_per_s=None, inflight_tokens=1e9
    )
    state = initial_state(
        tiny_requests,
        0.0,
        cached_input_counts=False,
        token_class="input",
    )

    state, _ = window(state, 15.0, answered=1, largest_accepted={TOK: 10.0, REQ: 1e9})

    assert state.budgets.calls_per_s <= 0.001 * (1 + CFG.growth) + 1e-12
