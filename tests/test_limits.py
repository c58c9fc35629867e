"""The provider's true limit model: buckets, counting rules, changes, rejections, snapshots."""

from __future__ import annotations

import math

import pytest

from planner.classify import LimitType
from sim.limits import (
    CallCharge,
    LimitChange,
    LimitSpec,
    ProviderLimits,
    limit_schedule,
    time_to_serve,
)


def test_requests_bucket_starts_full_and_refills_at_limit_per_60() -> None:
    p = ProviderLimits(LimitSpec(rpm=60))
    admitted = sum(p.admit(0.0, CallCharge(10)).admitted for _ in range(100))
    assert admitted == 60  # one minute's worth at once
    r = p.admit(0.0, CallCharge(10))
    assert not r.admitted and r.limit is LimitType.REQUESTS
    assert r.retry_after_s == pytest.approx(1.0)  # 1 request at 1/s
    assert p.admit(1.0, CallCharge(10)).admitted
    assert not p.admit(1.5, CallCharge(10)).admitted


def test_client_honouring_retry_after_gets_the_full_rate() -> None:
    p = ProviderLimits(LimitSpec(rpm=600))
    t = 0.0
    admitted = 0
    while t < 600.0:
        a = p.admit(t, CallCharge(1))
        admitted += a.admitted
        t += 0.0 if a.admitted else a.retry_after_s  # greedy, but honours retry-after
    # 600 in the initial full bucket + 10/s for 600 s
    assert 600 + 6000 * 0.99 <= admitted <= 600 + 6000 + 1


def test_hammering_faster_than_refill_is_starved_because_rejections_count() -> None:
    p = ProviderLimits(LimitSpec(rpm=600))
    for _ in range(600):
        assert p.admit(0.0, CallCharge(1)).admitted
    admitted = sum(p.admit(0.01 * i, CallCharge(1)).admitted for i in range(1, 6001))
    # every 10 ms attempt adds 0.1 request of refill and a rejection takes it back
    assert admitted == 0
    assert p.rejected_count == 6000


def test_rejected_requests_count_against_the_request_limit() -> None:
    p = ProviderLimits(LimitSpec(rpm=60, input_tpm=100))
    assert p.admit(0.0, CallCharge(100)).admitted  # input bucket now empty
    before = p.snapshot(0.0).classes[LimitType.REQUESTS].remaining
    r = p.admit(0.0, CallCharge(50))
    assert not r.admitted and r.limit is LimitType.INPUT_TOKENS
    after = p.snapshot(0.0).classes[LimitType.REQUESTS].remaining
    assert after == before - 1
    assert r.retry_after_s == pytest.approx(50 / (100 / 60))


def test_cached_input_counts_is_configurable() -> None:
    charge = CallCharge(input_uncached=1000, input_cached=9000)
    counts = ProviderLimits(LimitSpec(input_tpm=5000, cached_input_counts=True))
    free = ProviderLimits(LimitSpec(input_tpm=5000, cached_input_counts=False))
    r = counts.admit(0.0, charge)
    assert not r.admitted and r.too_large and r.limit is LimitType.INPUT_TOKENS
    assert free.admit(0.0, charge).admitted
    assert free.snapshot(0.0).classes[LimitType.INPUT_TOKENS].remaining == 4000


def test_combined_tokens_charge_input_plus_max_output_and_settle_refunds() -> None:
    p = ProviderLimits(LimitSpec(tpm=6000))
    r = p.admit(0.0, CallCharge(1000, max_output=2000))
    assert r.admitted and r.ticket is not None
    assert p.snapshot(0.0).classes[LimitType.TOKENS].remaining == 3000
    p.settle(0.0, r.ticket, actual_output=500)
    assert p.snapshot(0.0).classes[LimitType.TOKENS].remaining == 4500
    assert p.consumed[LimitType.TOKENS] == 1500


def test_output_tokens_charged_on_max_tokens_then_corrected() -> None:
    p = ProviderLimits(LimitSpec(output_tpm=1000))
    first = p.admit(0.0, CallCharge(10, max_output=800))
    assert first.admitted
    second = p.admit(0.0, CallCharge(10, max_output=800))
    assert not second.admitted and second.limit is LimitType.OUTPUT_TOKENS
    assert first.ticket is not None
    p.settle(0.0, first.ticket, actual_output=100)
    assert p.admit(0.0, CallCharge(10, max_output=800)).admitted


def test_limit_hit_is_the_failing_class_with_the_longest_wait() -> None:
    p = ProviderLimits(LimitSpec(rpm=60, input_tpm=600))
    p.admit(0.0, CallCharge(600))
    for _ in range(59):
        p.admit(0.0, CallCharge(0))
    r = p.admit(0.0, CallCharge(300))
    assert not r.admitted
    assert r.limit is LimitType.INPUT_TOKENS  # 30 s for tokens vs 1 s for requests
    assert r.retry_after_s == pytest.approx(30.0)


def test_changes_apply_at_their_time_and_clip_the_level() -> None:
    p = ProviderLimits(LimitSpec(input_tpm=6000), [LimitChange(at_s=100.0, input_tpm=600)])
    assert p.limit_now(LimitType.INPUT_TOKENS) == 6000
    snap = p.snapshot(100.0)
    assert snap.classes[LimitType.INPUT_TOKENS].limit == 600
    assert snap.classes[LimitType.INPUT_TOKENS].remaining == 600
    r = p.admit(100.0, CallCharge(1000))
    assert not r.admitted and r.too_large


def test_change_refills_at_old_rate_until_the_change() -> None:
    p = ProviderLimits(LimitSpec(input_tpm=6000), [LimitChange(at_s=10.0, input_tpm=60000)])
    assert p.admit(0.0, CallCharge(6000)).admitted
    # 10 s at 100/s = 1000, then 5 s at 1000/s = 5000
    assert p.snapshot(15.0).classes[LimitType.INPUT_TOKENS].remaining == 6000


def test_a_change_that_adds_a_class_limits_it_from_then_on() -> None:
    p = ProviderLimits(LimitSpec(input_tpm=60_000), [LimitChange(at_s=10.0, rpm=60)])
    assert sum(p.admit(0.0, CallCharge(10)).admitted for _ in range(100)) == 100
    # from t=10 a request bucket (full: 60) stands beside the input bucket, in class order
    assert list(p.snapshot(10.0).classes) == [LimitType.REQUESTS, LimitType.INPUT_TOKENS]
    assert sum(p.admit(10.0, CallCharge(10)).admitted for _ in range(100)) == 60
    r = p.admit(10.0, CallCharge(10))
    assert not r.admitted and r.limit is LimitType.REQUESTS
    assert r.retry_after_s == pytest.approx(1.0)
    assert p.consumed[LimitType.REQUESTS] == 60 + 41  # rejections count against it too


def test_snapshot_reset_is_time_until_full() -> None:
    p = ProviderLimits(LimitSpec(rpm=120))
    for _ in range(30):
        p.admit(0.0, CallCharge(0))
    snap = p.snapshot(0.0).classes[LimitType.REQUESTS]
    assert snap.remaining == 90 and snap.limit == 120
    assert snap.reset_s == pytest.approx(15.0)


def test_time_going_backwards_is_clamped() -> None:
    p = ProviderLimits(LimitSpec(rpm=60))
    for _ in range(60):
        p.admit(5.0, CallCharge(0))
    assert not p.admit(1.0, CallCharge(0)).admitted  # no refill from going back in time


def test_deterministic() -> None:
    def run() -> list[tuple[bool, float]]:
        p = ProviderLimits(LimitSpec(rpm=100, tpm=5000), [LimitChange(30, tpm=2000)])
        out = []
        for i in range(500):
            a = p.admit(i * 0.2, CallCharge(40 + i % 7, 3, 20))
            out.append((a.admitted, a.retry_after_s))
        return out

    assert run() == run()


def test_bad_specs_are_rejected() -> None:
    with pytest.raises(ValueError, match="at least one limit"):
        LimitSpec()
    with pytest.raises(ValueError, match="rpm"):
        LimitSpec(rpm=0)
    with pytest.raises(ValueError, match="input_tpm"):
        LimitChange(at_s=5, input_tpm=-1)


def test_time_to_serve_integrates_limit_changes() -> None:
    spec = LimitSpec(input_tpm=6000)
    changes = [LimitChange(at_s=60.0, input_tpm=600)]
    assert limit_schedule(spec, changes, LimitType.INPUT_TOKENS) == [(0.0, 6000), (60.0, 600)]
    assert time_to_serve(spec, changes, LimitType.INPUT_TOKENS, 3000) == pytest.approx(30.0)
    # 6000 in the first minute, then 10/s
    assert time_to_serve(spec, changes, LimitType.INPUT_TOKENS, 7000) == pytest.approx(160.0)
    assert time_to_serve(spec, changes, LimitType.REQUESTS, 1e9) == 0.0
    assert not math.isinf(time_to_serve(spec, [], LimitType.INPUT_TOKENS, 1e9))
