"""The drained rate of a provider bucket (``planner.drain``), against the simulated provider's
own per-minute buckets (``sim.limits``): never above the limit, at the limit when it rejects."""

from __future__ import annotations

import numpy as np
import pytest

from planner.drain import BUCKET_S, LOOKBACK_S, drained_rate
from sim.limits import CallCharge, LimitSpec, ProviderLimits

RPM = 240.0  # 4 calls/s


def _bursty_arrivals(seed: int, until_s: float) -> list[float]:
    """Request times: quiet spells and bursts at up to three times the limit."""
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    while t < until_s:
        rate = rng.choice([0.5, 2.0, 6.0, 12.0])  # calls/s for the next spell
        end = t + rng.uniform(10.0, 90.0)
        while t < end:
            t += rng.exponential(1.0 / rate)
            out.append(t)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_drained_rate_bounds_the_limit_and_reads_it_at_each_first_rejection(seed: int) -> None:
    """What the provider accepted drained its bucket at most at its limit at every moment (a
    full bucket plus the refill). At the first rejection of an episode (none in the minute
    before) the bucket is empty, and the drained rate is the limit within a few percent,
    or lower where rejected requests of an earlier episode took part of its refill (they are
    not counted: how much a rejection costs is the provider's business). The rate accepted
    over the last 30 s (what a cut reads) runs up to three times the limit after a quiet
    spell."""
    provider = ProviderLimits(LimitSpec(rpm=RPM))
    limit = RPM / 60.0
    admitted: list[tuple[float, float]] = []
    first_rejections: list[float] = []
    last_30s: list[float] = []
    last_rejection = -1e9
    for t in _bursty_arrivals(seed, 1800.0):
        while admitted and admitted[0][0] < t - LOOKBACK_S:
            admitted.pop(0)
        if provider.admit(t, CallCharge(1)).admitted:
            admitted.append((t, 1.0))
            if len(admitted) % 7 == 0:  # every call would do; a sample keeps the test quick
                assert drained_rate(admitted, t) <= limit * (1 + 1e-9) + 1.0 / BUCKET_S
            continue
        if t - last_rejection > BUCKET_S:
            first_rejections.append(drained_rate(admitted, t))
            last_30s.append(sum(1 for e, _ in admitted if e > t - 30.0) / 30.0)
        last_rejection = t
    assert len(first_rejections) >= 3, "the arrivals never overran the limit"
    assert max(first_rejections) <= limit + 1.0 / BUCKET_S
    assert sorted(first_rejections)[len(first_rejections) // 2] >= limit * 0.97
    assert min(first_rejections) >= limit * 0.8
    assert max(last_30s) > 1.5 * limit  # the burst the drained rate sees through


def test_events_after_now_are_ignored_and_none_drain_nothing() -> None:
    assert drained_rate([], 100.0) == 0.0
    assert drained_rate([(101.0, 50.0)], 100.0) == 0.0
    # 120 tokens over the last 20 s of a 60 s bucket: 120 / 80
    assert drained_rate([(80.0, 60.0), (90.0, 60.0), (101.0, 500.0)], 100.0) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="bucket_s"):
        drained_rate([(1.0, 1.0)], 2.0, bucket_s=0.0)
