"""What the planner's window reads of the gateway's ``llm_calls`` (``ledger.pacer_window``) on a
real PostgreSQL ledger: a call's first 429 is counted as a throttle and its retries' are not
(``llm_calls.retry``), while every attempt still counts as a call and an overload or spend
error counts however often it comes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine

from ledger import pacer_window
from ledger.models import CLIENT_CLOSED
from planner.budgets import BudgetClass
from planner.classify import LimitType
from planner.drain import LOOKBACK_S
from tests import plan_tick_support
from tests.plan_tick_support import ALIAS, T0, add_calls

pytestmark = pytest.mark.postgres

plan_db = plan_tick_support.plan_db
plan_ledger = plan_tick_support.plan_ledger


def _window(eng: Engine) -> pacer_window.WindowCalls:
    with eng.connect() as conn:
        return pacer_window.read_window(
            conn, ALIAS, 0, token_class="input", cached_input_counts=False
        )


def test_a_retried_429_counts_once(plan_ledger: Engine) -> None:
    add_calls(plan_ledger, 10)
    add_calls(plan_ledger, 2, status=429, limit_type="tokens")
    add_calls(plan_ledger, 5, status=429, limit_type="tokens", retry=True)
    add_calls(plan_ledger, 1, status=429, limit_type=None)
    add_calls(plan_ledger, 3, status=429, limit_type=None, retry=True)
    add_calls(plan_ledger, 2, retry=True)  # retries that got through

    window = _window(plan_ledger)

    assert sorted(window.throttles) == sorted([LimitType.TOKENS] * 2 + [LimitType.UNKNOWN])
    assert window.calls == 23  # the request bucket is charged for every attempt
    assert window.answered == 12


def test_retried_overloads_and_spend_errors_still_count(plan_ledger: Engine) -> None:
    add_calls(plan_ledger, 2, status=529, limit_type="overload", retry=True)
    add_calls(plan_ledger, 1, status=402, limit_type="spend", retry=True)

    window = _window(plan_ledger)

    assert window.overloads == 2 and window.spend_errors == 1
    assert window.throttles == ()


def test_a_stream_the_harness_abandoned_counts_as_served(plan_ledger: Engine) -> None:
    """A 499 (the harness hung up mid-stream) was served: its tokens count against the limits,
    and it is neither a throttle nor an error."""
    add_calls(plan_ledger, 3)
    add_calls(plan_ledger, 2, status=CLIENT_CLOSED)

    window = _window(plan_ledger)

    assert window.calls == 5 and window.answered == 5
    assert window.usage[BudgetClass.TOKENS] == 5 * 1000.0
    assert window.usage[BudgetClass.OUTPUT_TOKENS] == 5 * 100.0
    assert window.throttles == () and window.overloads == 0 and window.spend_errors == 0


def test_the_drained_rates_read_what_was_served_over_the_lookback(plan_ledger: Engine) -> None:
    """The blame's drained rates (``planner.drain``): the served calls requested within the
    lookback before the tick, each class drained into a full one-minute bucket, tokens also
    counted the other way; rejections, calls before the lookback and calls after the tick are
    left out."""
    add_calls(plan_ledger, 30, at=T0 - timedelta(seconds=10), cached=400)
    add_calls(plan_ledger, 5, status=429, limit_type=None, at=T0 - timedelta(seconds=5))
    add_calls(plan_ledger, 10, at=T0 - timedelta(seconds=LOOKBACK_S + 100))
    add_calls(plan_ledger, 4, at=T0 + timedelta(seconds=5))
    with plan_ledger.connect() as conn:
        read = pacer_window.drained_rates(
            conn, ALIAS, T0, token_class="combined", cached_input_counts=False
        )
    rates = read.rates
    span = 60.0 + 10.0  # a full bucket plus the 10 s since the first of them
    assert rates[BudgetClass.REQUESTS] == pytest.approx(30 / span)
    # combined, cache reads not counted; counted the other way they are (drain_belief)
    assert rates[BudgetClass.TOKENS] == pytest.approx(30 * (1000 - 400 + 100) / span)
    assert read.other_tokens == pytest.approx(30 * (1000 + 100) / span)
    assert rates[BudgetClass.OUTPUT_TOKENS] == pytest.approx(30 * 100 / span)


def test_a_call_drains_the_bucket_when_it_is_sent_not_when_it_is_requested(
    plan_ledger: Engine,
) -> None:
    """The provider charges a call when the gateway sends it, its request plus its pacer wait,
    as the simulator's planner reads it. Read at their requests, 30 calls held 30 s at the
    pacer would spread over 40 s before the tick instead of 10, and the rate read 70/100 of
    what the bucket drained. Calls requested before the lookback and sent within it count;
    calls requested within it and sent after the tick do not."""
    add_calls(plan_ledger, 30, at=T0 - timedelta(seconds=40), pacer_wait_s=30.0)
    add_calls(plan_ledger, 6, at=T0 - timedelta(seconds=LOOKBACK_S + 20), pacer_wait_s=30.0)
    add_calls(plan_ledger, 5, at=T0 - timedelta(seconds=5), pacer_wait_s=10.0)
    with plan_ledger.connect() as conn:
        read = pacer_window.drained_rates(
            conn, ALIAS, T0, token_class="input", cached_input_counts=False
        )
        at_sends = pacer_window.drained_rates(
            conn,
            ALIAS,
            T0 - timedelta(seconds=LOOKBACK_S - 15),
            token_class="input",
            cached_input_counts=False,
        )
    assert read.rates[BudgetClass.REQUESTS] == pytest.approx(30 / (60.0 + 10.0))
    assert read.rates[BudgetClass.TOKENS] == pytest.approx(30 * 1000 / (60.0 + 10.0))
    # the 6 sent 10 s into the lookback of a tick 15 s after it: a full bucket plus 5 s
    assert at_sends.rates[BudgetClass.REQUESTS] == pytest.approx(6 / (60.0 + 5.0))


def test_the_accepted_rates_read_the_calls_answered_in_the_span(plan_ledger: Engine) -> None:
    """A repeated cut's measure (``WindowObservation.delivered``): the calls the provider
    answered over the span, as the simulator's planner counts them. Calls requested before the
    span and answered in it count; calls requested in it and answered after it, and 429s, do
    not (read by request, a 30 s span at the tick would miss every call slower than the time
    left in it)."""
    since, until = T0 - timedelta(seconds=30), T0
    add_calls(plan_ledger, 8, at=T0 - timedelta(seconds=45), pacer_wait_s=5.0, latency_s=20.0)
    add_calls(plan_ledger, 4, at=T0 - timedelta(seconds=20), latency_s=10.0, cached=400)
    add_calls(plan_ledger, 6, at=T0 - timedelta(seconds=20), latency_s=25.0)
    add_calls(plan_ledger, 3, status=429, limit_type="tokens", at=T0 - timedelta(seconds=10))
    with plan_ledger.connect() as conn:
        rates = pacer_window.accepted_rates(
            conn, ALIAS, since, until, token_class="input", cached_input_counts=False
        )
    assert rates[BudgetClass.REQUESTS] == pytest.approx((8 + 4) / 30.0)
    assert rates[BudgetClass.TOKENS] == pytest.approx((8 * 1000 + 4 * 600) / 30.0)
    assert rates[BudgetClass.OUTPUT_TOKENS] == pytest.approx(12 * 100 / 30.0)


def test_a_served_retry_drains_and_is_answered_at_its_own_send(plan_ledger: Engine) -> None:
    """An attempt's ``sent_at`` places it: 10 retries the gateway sent 40 s after their calls'
    first sends (a 429's ``retry-after`` and a short pacer wait) drain the bucket and are
    answered then, not at the request plus the pacer wait every attempt of a call shares. Rows
    without it (written before it was recorded) keep that place."""
    requested = T0 - timedelta(seconds=50)
    add_calls(
        plan_ledger,
        10,
        at=requested,
        pacer_wait_s=2.0,
        retry=True,
        latency_s=5.0,
        sent_at=requested + timedelta(seconds=42),
    )
    add_calls(plan_ledger, 4, at=requested, pacer_wait_s=2.0, latency_s=5.0)  # no sent_at
    with plan_ledger.connect() as conn:
        drained = pacer_window.drained_rates(
            conn, ALIAS, T0, token_class="input", cached_input_counts=False
        )
        accepted = pacer_window.accepted_rates(
            conn,
            ALIAS,
            T0 - timedelta(seconds=15),
            T0,
            token_class="input",
            cached_input_counts=False,
        )
    # the 10 retries sent 8 s before the tick drain fastest (the 4 sent 48 s before it too:
    # 14 over 108 s); all 14 at the older place would read 14 over 108 s
    assert drained.rates[BudgetClass.REQUESTS] == pytest.approx(10 / (60.0 + 8.0))
    # the retries answered 3 s before the tick; the 4 answered 43 s before, outside the span
    assert accepted[BudgetClass.REQUESTS] == pytest.approx(10 / 15.0)
    assert accepted[BudgetClass.TOKENS] == pytest.approx(10 * 1000 / 15.0)


def test_the_largest_served_call_is_read_per_token_class(plan_ledger: Engine) -> None:
    """Rule 8's evidence: the largest call the provider served, counted as the alias counts
    them; a 429 proves nothing and a window with nothing served has no evidence."""
    with plan_ledger.connect() as conn:
        empty = pacer_window.read_window(
            conn, ALIAS, 0, token_class="input", cached_input_counts=False
        )
    assert empty.largest_accepted() is None
    add_calls(plan_ledger, 3, tokens=1000)
    add_calls(plan_ledger, 1, tokens=9000, cached=6000)
    add_calls(plan_ledger, 2, status=429, limit_type="tokens")

    with plan_ledger.connect() as conn:
        not_counted = pacer_window.read_window(
            conn, ALIAS, 0, token_class="input", cached_input_counts=False
        ).largest_accepted()
        counted = pacer_window.read_window(
            conn, ALIAS, 0, token_class="input", cached_input_counts=True
        ).largest_accepted()
        combined = pacer_window.read_window(
            conn, ALIAS, 0, token_class="combined", cached_input_counts=False
        ).largest_accepted()

    assert not_counted == {BudgetClass.TOKENS: 3000.0, BudgetClass.OUTPUT_TOKENS: 100.0}
    assert counted is not None and counted[BudgetClass.TOKENS] == 9000.0
    assert combined is not None and combined[BudgetClass.TOKENS] == 3100.0


def test_retries_rejected_with_nothing_answered_count_once_per_type(plan_ledger: Engine) -> None:
    """A window of retries' 429s and no answer: the pacer lets through more than the provider
    accepts, so the window counts one 429 per type they named (not one per retry)."""
    add_calls(plan_ledger, 6, status=429, limit_type=None, retry=True)
    add_calls(plan_ledger, 2, status=429, limit_type="requests", retry=True)

    window = _window(plan_ledger)

    assert sorted(window.throttles) == sorted([LimitType.REQUESTS, LimitType.UNKNOWN])
    assert window.answered == 0
