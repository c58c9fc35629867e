"""What a change of the cache-counting belief does to the controller state (``planner.recount``)."""

from __future__ import annotations

import pytest

from planner.budgets import (
    BudgetState,
    WindowObservation,
    initial_state,
    recounted,
    step,
)
from planner.classify import LimitType
from tests.budget_support import CFG, OUT, REQ, SEED, TOK, clean_until


def test_a_recount_forgets_the_rates_unknown_429s_drained_in_the_old_units() -> None:
    """Three 429s that name no limit drained the request and output buckets steadily and the
    token bucket, read as cache reads counting, unsteadily. The drain test says cache reads do
    not count, and the token budget goes to the limit it measured. At the next such 429 the
    token bucket drained at that limit: the blame is the token budget's. Kept, the rates in
    the old units made the token class look unsteady, and the 429 went on a steady class that
    was never the limit (here output; the request budget in wide-506)."""
    s = initial_state(SEED, 0.0, cached_input_counts=True, token_class="input")
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
    s = recounted(s, False, 360.0, measured=8_000.0)
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


def _stale_then_recounted(measured: float | None) -> BudgetState:
    """A seed ten hours old, cache reads believed counted, flipped at ``now`` (seven hours
    in) to not counted, to ``measured`` tokens/s; then ten minutes of clean windows."""
    hours7 = 7 * 3600.0
    s = initial_state(SEED, hours7, seeded_at=0.0, cached_input_counts=True, token_class="input")
    s = recounted(s, False, hours7, measured=measured)
    s, _ = clean_until(s, hours7, hours7 + 600.0)
    return s


def test_a_recount_to_a_measured_limit_is_a_fresh_seed_of_its_class_alone() -> None:
    """The drain test measured the token limit in the new units: that seed is no stale guess,
    and growth goes to ``max_over_seed`` x it, not to the 3x a stale config allows (which
    re-probed up to three times a limit just measured). The classes nothing measured keep
    the stale config's ceiling, and a recount with no measured limit renews nothing."""
    s = _stale_then_recounted(8_000.0)
    assert s.budgets.tokens_per_s == pytest.approx(CFG.max_over_seed * 8_000.0)
    assert s.budgets.calls_per_s == pytest.approx(CFG.stale_max_over_seed * SEED.calls_per_s)
    guessed = _stale_then_recounted(None)
    assert guessed.budgets.tokens_per_s == pytest.approx(
        CFG.stale_max_over_seed * SEED.tokens_per_s
    )
