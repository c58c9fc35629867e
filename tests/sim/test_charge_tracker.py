"""The simulated gateway's record of what it sent against the provider's stated bucket
(``sim/charge_tracker.py``): spans wait for their calls in flight, and a 429 is judged as the
planner tick judges the gateway's: once its calls are answered, from a reading at most half a
minute before it, with retries counted as sent in its span."""

from __future__ import annotations

import pytest

from planner.cache_counting import THROTTLE_SPAN_S
from sim.charge_tracker import ChargeTracker

LIMIT_PER_MINUTE = 600_000.0


def test_a_span_closes_only_once_its_slow_call_is_answered() -> None:
    """The run's first calls: one of 2 s, one of 50 s admitted at 10 s. The span [0, 15) waits
    until the slow call is answered at 60 s (a fixed lag would close it at 30 s without its
    tokens, and no latency seen before would have warned), and then counts it."""
    tracker = ChargeTracker()
    tracker.admitted(1, 2.0, base=1_000.0, cached=0.0)
    tracker.admitted(2, 10.0, base=5_000.0, cached=3_000.0)
    closed: list[float] = []
    for tick in range(0, 120, 15):
        now = float(tick)
        if now == 15.0:
            tracker.sent(1, 4.0, base=1_000.0, cached=0.0)
        if now == 60.0:
            tracker.sent(2, 60.0, base=5_000.0, cached=3_000.0)
        if tracker.observe(now, LIMIT_PER_MINUTE, 500_000.0):
            closed.append(now)
    assert closed and closed[0] == 60.0
    first = tracker.windows[0]
    assert first.base == pytest.approx(6_000.0) and first.cached == pytest.approx(3_000.0)
    # and the span's end reading has its dip: the calls sent before it, the bucket taken as full
    dip = tracker.dips[0]
    assert dip.remaining_start == dip.capacity and dip.remaining_end == 500_000.0
    assert dip.span_s == pytest.approx(5.0)  # from the 50 s call's admission at 10 s to 15 s
    assert dip.base == pytest.approx(5_000.0) and dip.cached == pytest.approx(3_000.0)


def test_a_rejected_call_holds_no_span_open() -> None:
    """A call the provider rejected was charged no tokens: the span closes without waiting for
    its retry, and the retry counts where it is admitted again."""
    tracker = ChargeTracker()
    tracker.admitted(1, 5.0, base=1_000.0, cached=0.0)
    tracker.rejected(1)
    assert tracker.complete_before(20.0) == 20.0
    tracker.observe(0.0, LIMIT_PER_MINUTE, 500_000.0)
    assert tracker.observe(15.0, LIMIT_PER_MINUTE, 500_000.0)
    assert tracker.windows[-1].base == 0.0
    tracker.admitted(1, 20.0, base=1_000.0, cached=0.0)
    assert tracker.complete_before(25.0) == 20.0
    tracker.sent(1, 22.0, base=1_000.0, cached=0.0)
    assert tracker.observe(30.0, LIMIT_PER_MINUTE, 500_000.0)
    assert tracker.windows[-1].base == pytest.approx(1_000.0)


def test_a_429_is_judged_from_the_last_half_minute_once_its_calls_are_answered() -> None:
    """Spans held open by a slow call keep their bucket readings; a 429 at 110 s is judged only
    once every call admitted before it has been answered, from the earliest reading at most
    ``THROTTLE_SPAN_S`` before it (90 s): a start minutes back would add minutes of sends
    against a drop that a full bucket caps at its size. The rejected attempts count nothing,
    and the retry accepted after its rejection counts as sent in the span."""
    tracker = ChargeTracker()
    tracker.admitted(0, 1.0, base=100.0, cached=0.0)  # in flight until 130 s: spans stay open
    call = 1
    for tick in range(0, 120, 15):
        tracker.observe(float(tick), LIMIT_PER_MINUTE, LIMIT_PER_MINUTE)
        for k in range(10):
            tracker.admitted(call, tick + k * 1.0, base=2_000.0, cached=8_000.0)
            tracker.sent(call, tick + k * 1.0 + 0.5, base=2_000.0, cached=8_000.0)
            call += 1
    tracker.admitted(999, 100.0, base=2_000.0, cached=8_000.0)
    tracker.rejected(999)  # a 429 at 100 s, retried and accepted at 115 s
    tracker.admitted(1000, 108.0, base=2_000.0, cached=8_000.0)  # answered only at 125 s
    # the gateway judges it at once: the 15 calls answered at their tokens, the one in flight
    # at all its input uncached, the rejected one at nothing
    at_once = tracker.throttled(110.0, LIMIT_PER_MINUTE, 0.0)
    assert at_once is not None and at_once.span_s == pytest.approx(20.0)
    assert at_once.base == pytest.approx(15 * 2_000.0 + 10_000.0)
    assert at_once.cached == pytest.approx(15 * 8_000.0)
    # the storm's next 429s: the tick keeps the first; the gateway judges one a second
    assert tracker.throttled(110.5, LIMIT_PER_MINUTE, 0.0) is None
    assert tracker.throttled(112.0, LIMIT_PER_MINUTE, 0.0) is not None
    tracker.admitted(999, 115.0, base=2_000.0, cached=8_000.0)
    tracker.sent(999, 116.0, base=2_000.0, cached=8_000.0)
    tracker.sent(1000, 125.0, base=2_000.0, cached=8_000.0)
    assert tracker.judge_throttle(120.0) is None  # call 0 is still in flight
    tracker.sent(0, 130.0, base=100.0, cached=0.0)
    window = tracker.judge_throttle(135.0)
    assert window is not None
    assert window.span_s == pytest.approx(20.0) and window.span_s <= THROTTLE_SPAN_S
    # the ticks at 90 and 105 s sent 15 calls before 110 s, then call 1000, and the retry
    assert window.base == pytest.approx(17 * 2_000.0)
    assert window.cached == pytest.approx(17 * 8_000.0)
    assert tracker.judge_throttle(150.0) is None  # judged once
    # the storm goes on (the tick has nothing new to judge), with no reading in the half
    # minute before it for the gateway
    assert tracker.throttled(160.0, LIMIT_PER_MINUTE, 0.0) is None
    assert tracker.judge_throttle(165.0) is None
    tracker.observe(225.0, LIMIT_PER_MINUTE, LIMIT_PER_MINUTE)
    # a quiet minute since 160 s: a new storm, judged at once from the reading at 225 s
    assert tracker.throttled(230.0, LIMIT_PER_MINUTE, 0.0) is not None
    again = tracker.judge_throttle(240.0)
    assert again is not None and again.span_s == pytest.approx(5.0)
