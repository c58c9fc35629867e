"""Whether the provider counts cache reads, from its stated bucket (planner/cache_counting.py)."""

from __future__ import annotations

import pytest

from evalfleet.errors import ConfigError
from planner.budget_state import BudgetClass
from planner.cache_counting import (
    BucketReading,
    ChargeWindow,
    CountingConfig,
    dip_window,
    infer_cached_input_counts,
)
from planner.drain_belief import DrainSample

LIMIT = 100_000.0  # tokens/s: a 6M-token per-minute bucket
CAP = 60 * LIMIT


def span(
    start: float, end: float, base: float, cached: float, span_s: float = 30.0
) -> ChargeWindow:
    return ChargeWindow(
        span_s=span_s,
        limit_per_s=LIMIT,
        capacity=CAP,
        remaining_start=start,
        remaining_end=end,
        base=base,
        cached=cached,
    )


def test_a_drained_bucket_that_only_cache_reads_explain_means_they_count() -> None:
    # 1M uncached + 3M cache reads sent while 30 s of refill (3M) and 1M of the bucket went:
    # the provider charged 4M, which 1M uncached alone cannot explain
    windows = [span(2e6, 1e6, base=1e6, cached=3e6)]
    assert infer_cached_input_counts(windows, believed=False) is True
    assert infer_cached_input_counts(windows, believed=True) is True


def test_cache_reads_of_a_fifth_of_the_base_that_the_provider_charged_count() -> None:
    """wide-2609 of ``sim.generate_wide``: 16% of the input cached, the provider counting it,
    the alias believing not. The provider charged 3.6M where 3M uncached and 0.6M of cache
    reads went out: the pacer's 3M undercounts every call by a fifth, and at a stated limit
    that is a 429 each time the budget re-probes it."""
    windows = [span(2e6, 1.4e6, base=3e6, cached=0.6e6)]
    assert infer_cached_input_counts(windows, believed=False) is True
    # charged only the uncached tokens: the belief stands
    assert (
        infer_cached_input_counts([span(2e6, 2e6, base=3e6, cached=0.6e6)], believed=False) is False
    )


def test_cache_reads_of_a_tenth_of_the_base_that_the_provider_charged_count() -> None:
    """wide-3791 of ``sim.generate_wide``: 9% of the input cached (9.9% of the uncached base),
    the provider counting it, the alias believing not. Held at the limit the headers state,
    the pacer undercounts every call by a tenth and draws a 429 each time the provider's
    bucket runs down (28 in a 4,800 s run, rate 0.0062). The provider charged 3.3M where 3M
    uncached and 0.3M of cache reads went out: they count."""
    windows = [span(2e6, 1.7e6, base=3e6, cached=0.3e6)]
    assert infer_cached_input_counts(windows, believed=False) is True
    # charged only the uncached tokens: the belief stands
    assert (
        infer_cached_input_counts([span(2e6, 2e6, base=3e6, cached=0.3e6)], believed=False) is False
    )
    # charged a little over the base, but less than half the cache reads over it: it stands
    assert (
        infer_cached_input_counts([span(2e6, 1.9e6, base=3e6, cached=0.3e6)], believed=False)
        is False
    )


def test_a_bucket_drained_from_full_is_a_floor_on_the_charge() -> None:
    # from full to empty in 30 s: refill may have been lost at the top, but 6M left the bucket
    windows = [span(CAP, 0.0, base=1e6, cached=7e6)]
    assert windows[0].charge_floor(0.9) == CAP
    assert infer_cached_input_counts(windows, believed=False) is True


def test_a_charge_the_uncached_tokens_explain_keeps_them_uncounted() -> None:
    # charged 3M + 0.2M: the uncached tokens sent (3.1M), not the cache reads
    windows = [span(2e6, 1.8e6 + 1e5, base=3.1e6, cached=5e6)]
    assert infer_cached_input_counts(windows, believed=False) is False


def test_sending_more_than_the_provider_can_have_charged_means_they_do_not_count() -> None:
    # the bucket stayed full while 3M uncached and 8M of cache reads went out over 60 s: at most
    # 6M can have been charged
    windows = [span(CAP, CAP, base=1.5e6, cached=4e6), span(CAP, CAP, base=1.5e6, cached=4e6)]
    assert infer_cached_input_counts(windows, believed=True) is False
    assert infer_cached_input_counts(windows, believed=False) is False


def test_a_measured_over_send_of_few_cache_reads_still_says_they_do_not_count() -> None:
    """Cache reads of a fifth of the base: a pacer that charges them runs 16% under a limit
    that ignores them (wide-77 of sim.generate_wide, ratio 1.23). Sending more than the bucket
    can have charged is measured, so a smaller share is enough to say so (10%; a drained
    bucket saying that cache reads count needed 25% until the thirty-third round, and now
    10% too: wide-2609)."""
    # a bucket below capacity, steady: the provider charged exactly its refill, 3M per 30 s,
    # while 3M uncached and 0.6M of cache reads went out
    windows = [span(1e6, 1e6, base=3e6, cached=0.6e6) for _ in range(4)]
    assert infer_cached_input_counts(windows, believed=True) is False
    # the other way, a bucket drained by a fifth of the cache reads more than the base sent
    # proves nothing: they count only where it charged at least half of them
    drained = [span(2e6, 2e6 - 0.12e6, base=3e6, cached=0.6e6)]
    assert infer_cached_input_counts(drained, believed=False) is False


def test_a_pacer_at_the_limit_under_the_right_belief_keeps_it() -> None:
    # counted 3M per 30 s (the refill) with the bucket steady: consistent with counting
    windows = [span(1e6, 1e6, base=0.5e6, cached=2.5e6) for _ in range(4)]
    assert infer_cached_input_counts(windows, believed=True) is True
    # and a full bucket with sends at the limit says nothing either way
    full = [span(CAP, CAP, base=0.5e6, cached=2.5e6) for _ in range(4)]
    assert infer_cached_input_counts(full, believed=True) is True
    assert infer_cached_input_counts(full, believed=False) is False


def test_an_over_send_is_not_diluted_by_spans_that_sent_under_the_bound() -> None:
    """wide-257 of sim.generate_wide: believed counted, the pacer burst its bucket into a
    provider bucket that stayed full (the cache reads, 90% of the prompts, do not count) and
    then sent at the stated limit, as the provider allows under either belief. Summed with the
    spans around it, the burst is lost in their bound: the run went at a sixth of the limit
    with no 429 (ratio 6.6). Any run of consecutive spans that sent over the bound counts."""
    booting = span(CAP, CAP, base=0.2e6, cached=0.8e6)  # a fleet still booting: far under
    burst = [span(CAP, CAP, base=0.6e6, cached=3.9e6) for _ in range(3)]  # 4.5M; 3M bound
    steady = [span(CAP, CAP, base=0.3e6, cached=2.7e6) for _ in range(4)]  # at the limit
    windows = [booting, *burst, *steady]
    assert infer_cached_input_counts(windows, believed=True) is False
    # the same spans with the burst gone say nothing: a full bucket at the limit is no evidence
    assert infer_cached_input_counts([booting, *steady], believed=True) is True
    # and one span over its bound by less than the margin is not enough on its own
    slight = span(CAP, CAP, base=0.3e6, cached=3.0e6)  # 3.3M against 3M + 0.9M
    assert infer_cached_input_counts([booting, slight, *steady], believed=True) is True


# a call of 8% of the bucket counted, 83% of it cache reads (wide-1928 of sim.generate_wide)
CALL_BASE, CALL_CACHED = 0.0136 * CAP, 0.0664 * CAP


def test_a_call_sent_just_before_a_nearly_full_reading_was_not_charged_its_cache_reads() -> None:
    """wide-1928: believed counted, the pacer sent at the stated limit in counted units into a
    provider that ignores cache reads; its bucket stayed 97-100% full, so every span lost refill
    and its bound never fell below what was sent (ratio 3.37, no 429). A bucket holds at most
    its capacity: a reading a second after an 8% call that finds it 97% full says the call was
    charged at most 1.7% + 3%."""
    readings = [BucketReading(at, LIMIT, 0.97 * CAP) for at in (15.0, 30.0)]
    dips = [dip_window(r, [(r.at - 1.0, CALL_BASE, CALL_CACHED)]) for r in readings]
    assert all(d is not None for d in dips)
    full = [span(CAP, CAP, base=0.25 * CAP * 0.17, cached=0.25 * CAP * 0.83, span_s=15.0)] * 2
    assert infer_cached_input_counts(full, believed=True) is True  # the spans cannot say it
    assert infer_cached_input_counts(full, believed=True, dips=[d for d in dips if d]) is False
    # one reading is not enough on its own (min_dips)
    assert infer_cached_input_counts(full, believed=True, dips=[d for d in dips[:1] if d]) is True


def test_a_bucket_that_dipped_by_the_whole_call_keeps_the_belief_that_cache_reads_count() -> None:
    # the provider charged the 8% call in full; a second of refill later it reads 93.7% full
    reading = BucketReading(15.0, LIMIT, CAP - (CALL_BASE + CALL_CACHED) + LIMIT)
    dip = dip_window(reading, [(14.0, CALL_BASE, CALL_CACHED)])
    assert dip is not None
    assert dip.base + dip.cached <= dip.charge_bound
    assert infer_cached_input_counts([], believed=True, dips=[dip, dip]) is True


def test_the_dip_is_the_span_before_the_reading_that_says_most() -> None:
    reading = BucketReading(15.0, LIMIT, 0.98 * CAP)
    sent = [
        (2.0, CALL_BASE, CALL_CACHED),  # long refilled by the reading: widening to it says less
        (14.0, CALL_BASE, CALL_CACHED),
        (14.5, CALL_BASE, CALL_CACHED),
        (16.0, 9 * CAP, 0.0),  # sent after the reading: not in it
    ]
    dip = dip_window(reading, sent)
    assert dip is not None
    assert dip.span_s == pytest.approx(1.0)
    assert dip.base == pytest.approx(2 * CALL_BASE)
    assert dip.cached == pytest.approx(2 * CALL_CACHED)
    assert dip.remaining_start == CAP  # the bucket taken as full at the start
    assert dip_window(reading, []) is None


def test_a_reading_counts_only_calls_sent_before_the_answered_attempt_was() -> None:
    """A header states the bucket as of some moment between its call's send and its answer: a
    call sent after that send may not be charged in it yet."""
    sent = [(14.0, CALL_BASE, CALL_CACHED)]
    stated_early = BucketReading(15.0, LIMIT, 0.97 * CAP, charged_through=13.0)
    assert dip_window(stated_early, sent) is None
    stated_late = BucketReading(15.0, LIMIT, 0.97 * CAP, charged_through=14.5)
    dip = dip_window(stated_late, sent)
    assert dip is not None and dip.span_s == pytest.approx(1.0)


def test_sends_spread_at_the_limit_into_a_full_bucket_are_no_dip() -> None:
    # the pacer at the stated limit in small calls: what the last seconds sent is their refill
    reading = BucketReading(15.0, LIMIT, 0.995 * CAP)
    sent = [(15.0 - i * 0.5, 0.17 * LIMIT * 0.5, 0.83 * LIMIT * 0.5) for i in range(1, 30)]
    dip = dip_window(reading, sent)
    assert dip is not None
    assert infer_cached_input_counts([], believed=True, dips=[dip] * 8) is True


@pytest.mark.parametrize(
    "windows",
    [
        [span(2e5, 1e5, base=2e5, cached=8e5)],  # too little sent to judge
        [span(2e6, 1e6, base=3.9e6, cached=0.1e6)],  # cache reads too few to matter
        [],
    ],
    ids=["little-volume", "few-cache-reads", "no-evidence"],
)
def test_weak_evidence_leaves_the_belief_alone(windows: list[ChargeWindow]) -> None:
    assert infer_cached_input_counts(windows, believed=False) is False
    assert infer_cached_input_counts(windows, believed=True) is True


def test_config_bounds_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match="counts_share"):
        CountingConfig(counts_share=1.5)


def test_stored_evidence_round_trips_and_bad_evidence_is_named() -> None:
    from tasks.plan_counting import CountingEvidence

    evidence = CountingEvidence(
        (BucketReading(10.0, LIMIT, CAP), BucketReading(25.0, LIMIT, 0.9 * CAP, 24.5)),
        (span(CAP, CAP, 1e6, 3e6),),
        (DrainSample(9_000.0, 2_000.0, 3.0, None), DrainSample(9_500.0, 2_010.0, 3.2, 400.0)),
        (span(CAP, 0.97 * CAP, 1e5, 4e5, span_s=1.0),),
        True,
    )
    assert CountingEvidence.from_json(evidence.to_json(), source="t") == evidence
    assert CountingEvidence.from_json(None, source="t") == CountingEvidence()
    # saved before the drained samples could confirm the belief: not confirmed
    saved = evidence.to_json()
    del saved["drained_confirmed"]
    assert CountingEvidence.from_json(saved, source="t").drained_confirmed is False
    with pytest.raises(ConfigError, match=r"counting.drained_confirmed"):
        CountingEvidence.from_json({"drained_confirmed": "yes"}, source="t")
    with pytest.raises(ConfigError, match=r"counting.anchors\[0\]"):
        CountingEvidence.from_json({"anchors": [[1.0, "x", 2.0]]}, source="pacer_states 'a'")
    with pytest.raises(ConfigError, match=r"counting.dips\[0\]"):
        CountingEvidence.from_json({"dips": [[1.0, 2.0]]}, source="t")
    with pytest.raises(ConfigError, match=r"counting.drained\[1\]"):
        CountingEvidence.from_json(
            {"drained": [[1.0, 2.0, 3.0, None], [1.0, 2.0, "x", None]]}, source="t"
        )


def test_the_tick_keeps_a_confirmed_belief_through_the_stored_evidence() -> None:
    """``judge_by_drain`` with the evidence stored and read back between ticks, as the
    planner tick keeps it: four 429s that confirm the belief, then four that alone would
    contradict it (random-4088's limit drop), leave it standing."""
    from tasks.plan_counting import CountingEvidence, judge_by_drain

    confirming = [(9_345.6, 21_612.5, 4.17), (9_454.1, 25_596.7, 4.08)]
    confirming += [(9_566.6, 32_146.5, 3.93), (9_499.6, 51_699.0, 3.78)]
    after_drop = [(8_925.0, 48_850.5, 3.42), (8_696.2, 48_170.6, 3.35)]
    after_drop += [(7_873.2, 47_365.4, 3.01), (6_651.1, 46_779.0, 2.54)]

    def run(ticks: list[tuple[float, float, float]]) -> tuple[CountingEvidence, list[bool]]:
        evidence, beliefs = CountingEvidence(), []
        for believed, other, requests in ticks:
            drained = {BudgetClass.TOKENS: believed, BudgetClass.REQUESTS: requests}
            evidence, counts, _ = judge_by_drain(evidence, drained, other, believed=False)
            evidence = CountingEvidence.from_json(evidence.to_json(), source="t")
            beliefs.append(counts)
        return evidence, beliefs

    evidence, beliefs = run(confirming + after_drop)
    assert beliefs == [False] * 8
    assert evidence.drained_confirmed
    _, beliefs = run(after_drop)
    assert beliefs == [False, False, False, True]
