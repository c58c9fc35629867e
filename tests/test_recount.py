"""What a change of the cache-counting belief does to the controller state (``planner.recount``)."""

from __future__ import annotations

from planner.budgets import (
    WindowObservation,
    initial_state,
    recounted,
    step,
)
from planner.classify import LimitType
from tests.budget_support import CFG, OUT, REQ, SEED, TOK


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
