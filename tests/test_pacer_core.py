"""The pacer core: rates, burst bound, head-of-line fairness, in-flight budget, settlement.
The order of its queue is tested in ``test_pacer_order.py``; helpers in ``pacer_support``."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from planner.budgets import BudgetClass, TokenClass
from planner.classify import Classification, LimitType
from planner.pacer import (
    DAILY_HOLD_MAX_S,
    EVERY_BUCKET,
    HOLD_AFTER_429_S,
    CallEstimate,
    CallUsage,
    PacerCore,
    classes_to_hold,
    hold_seconds,
)
from planner.pacer_bucket import Bucket
from tests.pacer_support import budgets, drive, flood


def test_long_run_call_rate_within_2_percent() -> None:
    pacer = PacerCore(budgets(calls=20.0), burst_s=2.0)
    times = drive(pacer, flood(20000, CallEstimate(100), rate=50.0), until=600.0)
    admitted = sum(1 for t in times.values() if t <= 600.0)
    expected = 20.0 * 600.0 + 20.0 * 2.0  # rate x time + one burst
    assert abs(admitted - expected) / expected <= 0.02


def test_long_run_token_rate_within_2_percent() -> None:
    pacer = PacerCore(budgets(tokens=10_000.0), burst_s=1.0)
    est = CallEstimate(input_uncached=700, input_cached=5000, max_output=300)
    times = drive(pacer, flood(20000, est, rate=40.0), until=600.0)
    tokens = 700 * sum(1 for t in times.values() if t <= 600.0)  # cached not counted
    expected = 10_000.0 * 600.0
    assert abs(tokens - expected) / expected <= 0.02


def test_any_window_gets_at_most_rate_times_window_plus_burst() -> None:
    rng = random.Random(3)
    rate, burst = 10.0, 1.5
    pacer = PacerCore(budgets(calls=rate), burst_s=burst)
    arrivals = []
    t = 0.0
    for i in range(3000):
        t += rng.expovariate(30.0) if i % 200 < 150 else rng.expovariate(2.0)  # bursty
        arrivals.append((t, f"c{i}", CallEstimate(10), rng.uniform(0.1, 3.0), None))
    times = sorted(drive(pacer, arrivals, until=t + 1000).values())
    assert len(times) == 3000
    for w in (0.0, 0.5, 1.0, 5.0, 30.0):
        j = 0
        for i, start in enumerate(times):
            while j < len(times) and times[j] <= start + w + 1e-9:
                j += 1
            assert j - i <= rate * (w + burst) + 1e-6, (w, start, j - i)


def test_big_call_is_not_starved_by_a_stream_of_small_ones() -> None:
    # tokens 1000/s, bucket 1000: the big call (5000) is larger than the bucket.
    pacer = PacerCore(budgets(tokens=1000.0), burst_s=1.0)
    small = [(i * 0.05, f"s{i}", CallEstimate(100), 0.2, None) for i in range(4000)]
    big = [(10.0, "big", CallEstimate(5000), 1.0, None)]
    times = drive(pacer, sorted(small + big), until=400.0)
    assert "big" in times
    # Small calls queued ahead of it at t=10 need ~ (demand so far - budget) / rate; the big
    # call then needs one full bucket. Demand is 2000/s vs 1000/s, so by t=10 the backlog is
    # 10 s of budget; it goes by ~t=21, and small calls behind it wait for it (FIFO).
    assert times["big"] <= 23.0
    behind = [times[f"s{i}"] for i in range(201, 260)]
    assert all(t >= times["big"] for t in behind)


def test_call_larger_than_the_inflight_budget_goes_alone() -> None:
    pacer = PacerCore(budgets(inflight=10_000.0), burst_s=1.0)
    arrivals = [
        (0.0, "a", CallEstimate(4000), 5.0, None),
        (0.1, "huge", CallEstimate(30_000), 5.0, None),
        (0.2, "b", CallEstimate(1000), 5.0, None),
    ]
    times = drive(pacer, arrivals, until=100.0)
    assert times["a"] == 0.0
    assert times["huge"] == pytest.approx(5.0)  # when "a" is released, alone
    assert times["b"] == pytest.approx(10.0)  # behind it, not ahead of it


def test_inflight_budget_is_honoured() -> None:
    pacer = PacerCore(budgets(inflight=10_000.0), burst_s=1.0)
    est = CallEstimate(input_uncached=1000, input_cached=1500, max_output=500)  # 3000 in flight
    a = [pacer.request(f"c{i}", est, 0.0).admitted for i in range(5)]
    assert a == [True, True, True, False, False]
    assert pacer.inflight_tokens == 9000
    assert pacer.next_ready_at(0.0) == math.inf
    pacer.release("c0", CallUsage(1000, 1500, 200), 1.0)
    assert pacer.poll(1.0) == ["c3"]
    assert pacer.inflight_tokens == 9000


def test_release_settles_the_estimate_against_actual_usage() -> None:
    pacer = PacerCore(budgets(tokens=1000.0, output=1000.0), burst_s=1.0, token_class="combined")
    est = CallEstimate(input_uncached=200, max_output=800)  # counted 1000, output 800
    assert pacer.request("a", est, 0.0).admitted
    assert not pacer.request("b", est, 0.0).admitted
    pacer.release("a", CallUsage(200, 0, 100), 0.0)  # used 300 counted, 100 output
    assert pacer.levels(0.0)["tokens"] == pytest.approx(700.0)
    assert pacer.levels(0.0)["output_tokens"] == pytest.approx(900.0)
    assert pacer.next_ready_at(0.0) == pytest.approx(0.3)  # 300 more tokens at 1000/s


def test_failed_call_is_refunded_its_tokens_not_its_call() -> None:
    pacer = PacerCore(budgets(calls=1.0, tokens=1000.0), burst_s=1.0)
    assert pacer.request("a", CallEstimate(1000), 0.0).admitted
    pacer.release("a", None, 0.0)
    lv = pacer.levels(0.0)
    assert lv["tokens"] == pytest.approx(1000.0) and lv["calls"] == pytest.approx(0.0)


def test_usage_above_the_estimate_is_charged() -> None:
    pacer = PacerCore(budgets(tokens=1000.0), burst_s=1.0)
    assert pacer.request("a", CallEstimate(500, input_cached=500), 0.0).admitted
    pacer.release("a", CallUsage(900, 100, 0), 0.0)  # the cache missed: 900 uncached
    assert pacer.levels(0.0)["tokens"] == pytest.approx(100.0)


def test_cached_input_counts_and_combined_class() -> None:
    est = CallEstimate(input_uncached=100, input_cached=900, max_output=50)
    cases: dict[tuple[TokenClass, bool], int] = {
        ("input", False): 100,
        ("input", True): 1000,
        ("combined", False): 150,
        ("combined", True): 1050,
    }
    for (token_class, counts), charged in cases.items():
        pacer = PacerCore(
            budgets(tokens=2000.0), 1.0, token_class=token_class, cached_input_counts=counts
        )
        pacer.request("x", est, 0.0)
        assert pacer.levels(0.0)["tokens"] == pytest.approx(2000.0 - charged)


def test_set_budgets_changes_the_rate_from_now() -> None:
    pacer = PacerCore(budgets(calls=10.0), burst_s=1.0)
    for i in range(10):
        assert pacer.request(f"a{i}", CallEstimate(1), 0.0).admitted
    pacer.set_budgets(budgets(calls=1.0), 0.0)
    assert not pacer.request("b", CallEstimate(1), 0.0).admitted
    assert pacer.next_ready_at(0.0) == pytest.approx(1.0)
    pacer.set_budgets(budgets(calls=100.0), 0.5)
    assert pacer.poll(0.5) == []  # refilled 0.5 at 1/s until 0.5: not yet one call
    assert pacer.next_ready_at(0.5) == pytest.approx(0.505)


def test_queued_calls_are_reported_once_in_fifo_order() -> None:
    pacer = PacerCore(budgets(calls=1.0), burst_s=1.0)
    assert pacer.request("a", CallEstimate(1), 0.0).admitted
    assert not pacer.request("b", CallEstimate(1), 0.0).admitted
    assert not pacer.request("c", CallEstimate(1), 0.5).admitted
    # at t=2.0 the new request drains "b" (one call per second), which poll then reports
    adm = pacer.request("d", CallEstimate(1), 2.0)
    assert not adm.admitted
    assert pacer.poll(2.0) == ["b"]
    assert pacer.poll(2.0) == []
    assert pacer.poll(3.0) == ["c"]
    assert pacer.poll(4.0) == ["d"]


def test_cancel_and_duplicates() -> None:
    pacer = PacerCore(budgets(calls=1.0), burst_s=1.0)
    pacer.request("a", CallEstimate(1), 0.0)
    pacer.request("b", CallEstimate(1), 0.0)
    with pytest.raises(ValueError, match="already"):
        pacer.request("b", CallEstimate(1), 0.0)
    assert pacer.cancel("b", 0.0)
    assert not pacer.cancel("b", 0.0)
    assert pacer.next_ready_at(0.0) is None
    with pytest.raises(KeyError):
        pacer.release("zz", None, 0.0)


def test_bad_burst_is_rejected() -> None:
    with pytest.raises(ValueError, match="burst_s"):
        PacerCore(budgets(), burst_s=0.0)


def test_take_usage_reports_net_use_per_budget_and_restarts() -> None:
    pacer = PacerCore(budgets(calls=10.0, tokens=1000.0, output=1000.0, inflight=10_000.0), 1.0)
    est = CallEstimate(input_uncached=100, input_cached=400, max_output=200)
    for i in range(5):
        assert pacer.request(f"c{i}", est, 0.0).admitted
    for i in range(5):
        pacer.release(f"c{i}", CallUsage(100, 400, 50), 1.0)
    u = pacer.take_usage(2.0)
    assert u.calls == 5 and u.tokens == 500 and u.output_tokens == 250
    assert u.peak_inflight == 3500
    assert u.utilisation[BudgetClass.REQUESTS] == pytest.approx(5 / 2 / 10)
    assert u.utilisation[BudgetClass.TOKENS] == pytest.approx(500 / 2 / 1000)
    assert u.utilisation[BudgetClass.OUTPUT_TOKENS] == pytest.approx(250 / 2 / 1000)
    assert u.utilisation[BudgetClass.INFLIGHT] == pytest.approx(0.35)
    again = pacer.take_usage(3.0)
    assert again.calls == 0 and again.utilisation[BudgetClass.REQUESTS] == 0.0
    assert again.peak_inflight == 0


def test_the_providers_remaining_caps_the_buckets_and_never_raises_them() -> None:
    pacer = PacerCore(budgets(calls=10.0, tokens=1000.0), burst_s=60.0)
    assert pacer.levels(0.0) == {"calls": 600.0, "tokens": 60_000.0}
    pacer.observe_remaining({BudgetClass.REQUESTS: 3.0, BudgetClass.TOKENS: 500.0}, 0.0)
    assert pacer.levels(0.0) == {"calls": 3.0, "tokens": 500.0}
    est = CallEstimate(input_uncached=400)
    assert pacer.request("a", est, 0.0).admitted
    assert not pacer.request("b", est, 0.0).admitted  # 100 tokens left, not 59,600
    assert pacer.next_ready_at(0.0) == pytest.approx(0.3)
    pacer.observe_remaining({BudgetClass.TOKENS: 1e9}, 0.0)  # a stale, fuller reading
    assert pacer.levels(0.0)["tokens"] == pytest.approx(100.0)


def test_a_bucket_the_provider_states_becomes_its_bucket_and_no_other_does() -> None:
    pacer = PacerCore(
        budgets(calls=10.0, tokens=1000.0, output=100.0), burst_s=2.0, stated_burst_s=60.0
    )
    assert pacer.levels(0.0) == {"calls": 20.0, "tokens": 2000.0, "output_tokens": 200.0}
    pacer.observe_remaining({BudgetClass.TOKENS: 50_000.0}, 0.0)  # only tokens are stated
    # the bucket becomes the provider's: as full as it says, and a minute of its rate deep
    assert pacer.levels(0.0)["tokens"] == 50_000.0
    pacer.observe_remaining({BudgetClass.TOKENS: 55_000.0}, 1.0)  # later: never raised
    assert pacer.levels(1.0)["tokens"] == 51_000.0
    assert pacer.levels(100.0) == {"calls": 20.0, "tokens": 60_000.0, "output_tokens": 200.0}
    # a planner update keeps each class's depth
    pacer.set_budgets(replace(pacer.budgets, tokens_per_s=500.0, calls_per_s=5.0), 100.0)
    assert pacer.levels(200.0) == {"calls": 10.0, "tokens": 30_000.0, "output_tokens": 200.0}
    # what the provider says remains still caps the deeper bucket
    pacer.observe_remaining({BudgetClass.TOKENS: 700.0}, 200.0)
    assert pacer.levels(200.0)["tokens"] == 700.0
    # a bucket held empty after a 429 is deepened when first stated, not refilled
    pacer.hold({BudgetClass.REQUESTS}, 5.0, 200.0)
    pacer.observe_remaining({BudgetClass.REQUESTS: 300.0}, 200.0)
    assert pacer.levels(200.0)["calls"] == -25.0
    assert pacer.levels(400.0)["calls"] == 300.0  # a minute of 5 calls/s


def test_without_a_stated_depth_a_stated_bucket_keeps_burst_s() -> None:
    pacer = PacerCore(budgets(calls=10.0, tokens=1000.0), burst_s=2.0)
    pacer.observe_remaining({BudgetClass.REQUESTS: 500.0, BudgetClass.TOKENS: 50_000.0}, 0.0)
    assert pacer.levels(100.0) == {"calls": 20.0, "tokens": 2000.0}
    with pytest.raises(ValueError, match="stated_burst_s"):
        PacerCore(budgets(calls=10.0), burst_s=2.0, stated_burst_s=0.0)


def test_a_hold_sends_nothing_for_its_seconds_of_refill() -> None:
    pacer = PacerCore(budgets(calls=10.0, tokens=1000.0), burst_s=2.0)
    pacer.hold({BudgetClass.REQUESTS, BudgetClass.TOKENS}, 5.0, 0.0)
    assert pacer.levels(0.0) == {"calls": -50.0, "tokens": -5000.0}
    assert not pacer.request("a", CallEstimate(input_uncached=100), 0.0).admitted
    # the calls bucket needs 5 s to get back to 0 and 0.1 s more for one call
    assert pacer.next_ready_at(0.0) == pytest.approx(5.1)
    assert pacer.poll(5.0) == []
    assert pacer.poll(5.2) == ["a"]
    pacer.hold({BudgetClass.TOKENS}, 1.0, 5.2)  # a shorter hold never shortens a longer one
    pacer.hold({BudgetClass.TOKENS}, 0.5, 5.2)
    assert pacer.levels(5.2)["tokens"] <= -1000.0


def _reading(limit_type: LimitType, remaining: dict[LimitType, float]) -> Classification:
    return Classification(status=429, limit_type=limit_type, remaining=remaining)


@pytest.mark.parametrize(
    ("limit_type", "remaining", "has_output", "held"),
    [
        # it states nothing: every bucket of the provider may be empty
        (LimitType.UNKNOWN, {}, True, {"requests", "tokens", "output_tokens"}),
        (LimitType.TOKENS, {}, False, {"requests", "tokens", "output_tokens"}),
        # it names a class whose remaining it states: mirrored, not held
        (LimitType.TOKENS, {LimitType.REQUESTS: 9.0, LimitType.TOKENS: 10.0}, True, set()),
        # OpenAI-style headers state requests and combined tokens, the 429 names output
        (
            LimitType.OUTPUT_TOKENS,
            {LimitType.REQUESTS: 9.0, LimitType.TOKENS: 10.0},
            True,
            {"output_tokens"},
        ),
        # no output budget: the combined token budget carries output, and its remaining is
        # stated, so nothing is held
        (LimitType.OUTPUT_TOKENS, {LimitType.REQUESTS: 9.0, LimitType.TOKENS: 1e6}, False, set()),
        # an unknown limit with buckets stated: they are mirrored
        (LimitType.UNKNOWN, {LimitType.TOKENS: 10.0}, True, set()),
    ],
)
def test_classes_to_hold_are_those_a_429_leaves_empty_unsaid(
    limit_type: LimitType,
    remaining: dict[LimitType, float],
    has_output: bool,
    held: set[str],
) -> None:
    view = _reading(limit_type, remaining)
    got = classes_to_hold(view, token_class="combined", has_output_budget=has_output)
    assert {c.value for c in got} == held


def test_a_response_that_is_not_a_throttle_holds_nothing() -> None:
    for lt in (LimitType.NONE, LimitType.SPEND, LimitType.OVERLOAD):
        assert not classes_to_hold(_reading(lt, {}), token_class="input", has_output_budget=True)


def test_a_task_age_must_be_a_finite_number_of_seconds() -> None:
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="task_age_s"):
            CallEstimate(10, task_age_s=bad)


def test_a_per_day_limits_429_holds_every_bucket_for_its_retry_after() -> None:
    daily = Classification(
        status=429,
        limit_type=LimitType.DAILY,
        remaining={LimitType.REQUESTS: 400.0, LimitType.TOKENS: 1e6},  # per-minute room
        retry_after_s=90.0,
    )
    assert classes_to_hold(daily, token_class="combined", has_output_budget=True) == EVERY_BUCKET
    assert hold_seconds(daily, HOLD_AFTER_429_S) == 90.0
    assert hold_seconds(replace(daily, retry_after_s=36_000.0), 5.0) == DAILY_HOLD_MAX_S
    assert hold_seconds(replace(daily, retry_after_s=None), 5.0) == 5.0
    per_minute = replace(daily, limit_type=LimitType.TOKENS, remaining={})
    assert hold_seconds(per_minute, 5.0) == 5.0  # a per-minute limit: the usual hold
    pacer = PacerCore(budgets(calls=10.0, tokens=1000.0), burst_s=1.0)
    pacer.hold(EVERY_BUCKET, hold_seconds(daily, 5.0), 0.0)
    assert not pacer.request("x", CallEstimate(10), 0.0).admitted
    assert pacer.next_ready_at(0.0) == pytest.approx(90.1, abs=0.01)  # 90 s, then one call's refill


def test_a_shortfall_within_the_buckets_rounding_waits_nothing() -> None:
    """The token bucket's level is a running sum of charges and refills as large as its
    capacity: once a 13-token call found it 1.6e-8 short and waited 4e-13 s, below the clock's
    resolution at t=4,863 s, so the simulator woke at the same instant forever."""
    bucket = Bucket(rate=40_000.0, capacity=2_400_000.0)
    bucket.level = 12.99999998396379
    assert bucket.wait_for(13.0) == 0.0
    bucket.level = 12.0  # a real shortfall still waits for its refill
    assert bucket.wait_for(13.0) == pytest.approx(1.0 / 40_000.0)
