"""The cut a 429 makes in the pacer at once (``planner.provisional_cut``): only the classes the
controller would cut, at most once per class per cooldown, a stated limit capping its class
first, and standing until the planner's push moves the class or the hold lapses."""

from __future__ import annotations

import pytest

from planner.budgets import BudgetClass, Budgets
from planner.classify import LimitType
from planner.provisional_cut import CUT, HOLD_S, ProvisionalCuts

SEED = Budgets(calls_per_s=10.0, tokens_per_s=1000.0, output_tokens_per_s=None, inflight_tokens=1e6)


def cuts(pushed: Budgets = SEED) -> ProvisionalCuts:
    return ProvisionalCuts(pushed, cooldown_s=30.0)


def test_a_request_429_cuts_only_the_request_budget_once_per_cooldown() -> None:
    p = cuts()
    assert p.first_429(0.0, LimitType.REQUESTS, "combined") == (BudgetClass.REQUESTS,)
    assert p.budgets() == SEED.with_value(BudgetClass.REQUESTS, 10.0 * CUT)
    # 429s of calls sent before the cut add nothing within the cooldown
    assert p.first_429(10.0, LimitType.REQUESTS, "combined") == ()
    assert p.budgets().calls_per_s == pytest.approx(10.0 * CUT)
    # the token budget is not the request limit's: a token 429 cuts it alone
    assert p.first_429(11.0, LimitType.TOKENS, "combined") == (BudgetClass.TOKENS,)
    assert p.budgets().tokens_per_s == pytest.approx(1000.0 * CUT)
    assert p.budgets().calls_per_s == pytest.approx(10.0 * CUT)


def test_an_unknown_429_cuts_every_class_and_spend_overload_daily_cut_none() -> None:
    for lt in (LimitType.SPEND, LimitType.OVERLOAD, LimitType.DAILY, LimitType.NONE):
        p = cuts()
        assert p.first_429(0.0, lt, "combined") == ()
        assert p.budgets() == SEED
    p = cuts()
    assert set(p.first_429(0.0, LimitType.UNKNOWN, "combined")) == set(SEED.classes())
    assert p.budgets().inflight_tokens == pytest.approx(1e6 * CUT)


def test_a_limit_the_429_states_caps_its_class_and_an_output_limit_gets_a_budget() -> None:
    """OpenAI's output-token 429 names its limit in the message only: the alias budgets no
    output, so without the stated limit the cut would fall on the combined token budget and
    the output storm go on until the tick."""
    p = cuts()
    stated = {LimitType.REQUESTS: 300.0, LimitType.OUTPUT_TOKENS: 6000.0}  # per minute
    moved = p.first_429(0.0, LimitType.OUTPUT_TOKENS, "combined", stated)
    assert set(moved) == {BudgetClass.REQUESTS, BudgetClass.OUTPUT_TOKENS}
    now = p.budgets()
    assert now.output_tokens_per_s == pytest.approx(100.0 * CUT)  # 6,000/min, then cut
    assert now.calls_per_s == pytest.approx(5.0)  # capped at the stated 300/min, not cut
    assert now.tokens_per_s == 1000.0


def test_the_cut_stands_until_the_planner_moves_its_class_or_the_hold_lapses() -> None:
    p = cuts()
    p.first_429(0.0, LimitType.TOKENS, "combined")
    # a push that leaves the class where it was (a planner that has not caught up) keeps it
    p.settle(5.0, SEED.with_value(BudgetClass.REQUESTS, 11.0))
    assert p.budgets().tokens_per_s == pytest.approx(1000.0 * CUT)
    assert p.budgets().calls_per_s == 11.0
    # the planner's own cut replaces it, whether below or above the provisional value
    p.settle(15.0, SEED.with_value(BudgetClass.TOKENS, 800.0))
    assert p.budgets().tokens_per_s == 800.0 and not p.cut_classes
    # a planner that never acts: the cut lapses after the hold
    p.first_429(60.0, LimitType.TOKENS, "combined")
    p.settle(60.0 + HOLD_S - 1.0, p.pushed)
    assert p.cut_classes == {BudgetClass.TOKENS}
    p.settle(60.0 + HOLD_S, p.pushed)
    assert p.budgets() == p.pushed and not p.cut_classes


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="factor"):
        ProvisionalCuts(SEED, cooldown_s=30.0, factor=1.0)
    with pytest.raises(ValueError, match="cooldown_s"):
        ProvisionalCuts(SEED, cooldown_s=-1.0)
