"""The cache-counting belief's changes to the controller state (``planner.recount``): a counted
belief doubted at the first answers without headers, and what a recount forgets."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.budgets import (
    BudgetState,
    ControllerConfig,
    WindowObservation,
    initial_state,
    recounted,
    step,
)
from planner.classify import LimitType
from tests.budget_support import CFG, OUT, REQ, SEED, TOK


def _believing(counts: bool) -> BudgetState:
    return initial_state(SEED, 0.0, cached_input_counts=counts, token_class="input")


def _first_answers(
    state: BudgetState, now: float = 15.0, cfg: ControllerConfig = CFG, **kw: object
) -> tuple[BudgetState, list[str]]:
    obs = WindowObservation(now=now, answered=12, **kw)  # type: ignore[arg-type]
    state, actions = step(state, obs, cfg)
    return state, list(actions.notes)


def test_a_counted_belief_is_doubted_at_the_first_answers_without_headers() -> None:
    """No header came with the provider's first answers: "cache reads count" is set aside for
    "not counted", the token seed and budget keeping their number (the operator's limit, read
    in the units a wrong belief of this kind is found in)."""
    state = _believing(True)
    before, _ = step(state, WindowObservation(now=15.0), CFG)  # nothing answered yet
    assert before.cached_input_counts
    s, notes = _first_answers(before, now=30.0)
    assert not s.cached_input_counts
    assert s.seed.tokens_per_s == SEED.tokens_per_s
    assert s.budgets.tokens_per_s == pytest.approx(before.budgets.tokens_per_s * 1.05)
    assert any("not counted" in n for n in notes)


def test_the_doubt_comes_once_and_a_flip_back_stands() -> None:
    """Its 429s flip it back (``planner.drain_belief``): later answers do not doubt again."""
    s, _ = _first_answers(_believing(True))
    s = recounted(s, True, measured=40_000.0)
    s, _ = _first_answers(s, now=30.0)
    assert s.cached_input_counts and s.seed.tokens_per_s == 40_000.0


@pytest.mark.parametrize(
    ("counts", "limits", "cfg"),
    [
        (True, {LimitType.INPUT_TOKENS: 1_800_000.0}, CFG),  # headers state the bucket
        (True, None, replace(CFG, doubt_counted_cache_without_headers=False)),
        (False, None, CFG),  # "not counted" draws the 429s that correct it
    ],
)
def test_the_belief_stands_with_headers_when_off_or_when_not_counted(
    counts: bool, limits: dict[LimitType, float] | None, cfg: ControllerConfig
) -> None:
    s, _ = _first_answers(_believing(counts), cfg=cfg, observed_limits=limits)
    assert s.cached_input_counts is counts


def test_a_recount_forgets_the_rates_unknown_429s_drained_in_the_old_units() -> None:
    """Three 429s that name no limit drained the request and output buckets steadily and the
    token bucket, read as cache reads counting, unsteadily. The drain test says cache reads do
    not count, and the token budget goes to the limit it measured. At the next such 429 the
    token bucket drained at that limit: the blame is the token budget's. Kept, the rates in
    the old units made the token class look unsteady, and the 429 went on a steady class that
    was never the limit (here output; the request budget in wide-506)."""
    s = _believing(True)
    for i, tokens in enumerate([20_000.0, 26_000.0, 33_000.0]):
        s, _ = step(
            s,
            WindowObservation(
                now=15.0 + 120.0 * i,
                throttles=((LimitType.UNKNOWN, None),),
                delivered={REQ: 5.0, TOK: tokens, OUT: 1_000.0},
                drained={REQ: 5.0, TOK: tokens, OUT: 1_000.0},
            ),
            CFG,
        )
    assert len(s.unknown_samples) == 3
    s = recounted(s, False, measured=8_000.0)
    assert s.unknown_samples == () and s.budgets.tokens_per_s == 8_000.0
    s, _ = step(
        s,
        WindowObservation(
            now=400.0,
            throttles=((LimitType.UNKNOWN, None),),
            delivered={REQ: 5.0, TOK: 8_000.0, OUT: 1_000.0},
            drained={REQ: 5.0, TOK: 8_000.0, OUT: 1_000.0},
        ),
        CFG,
    )
    blamed = {cls for cls, at in s.last_429_at.items() if at == 400.0}
    assert blamed == {TOK}
