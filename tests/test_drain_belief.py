"""The cache-counting belief tested without headers (``planner.drain_belief``): which counting
of the token rate drained at 429s of an unknown limit holds steady."""

from __future__ import annotations

import pytest

from evalfleet.errors import ConfigError
from planner.drain_belief import (
    DrainBeliefConfig,
    DrainEvidence,
    DrainSample,
    drain_confirms_belief,
    drain_contradicts_belief,
    judged,
    measured_limit,
)

# wide-582 of sim.generate_wide after its token limit dropped to 7,435 tokens/s (cache reads
# not counted, believed counted): at its token 429s the uncached rate drained read 7.05-7.25k
# while the rate counting cache reads read 4.3-5.4x that, as the tasks' contexts grew
UNCACHED = [7_180.0, 7_250.0, 7_052.0, 7_156.0, 7_221.0, 7_113.0]
CACHE_RATIO = [4.26, 4.37, 5.11, 5.41, 5.11, 4.60]
COUNTED = [u * c for u, c in zip(UNCACHED, CACHE_RATIO, strict=True)]
REQUESTS = [2.43, 2.34, 2.71, 2.54, 2.39, 2.69]


def _samples(believed: list[float], other: list[float], requests: list[float]) -> list[DrainSample]:
    return [
        DrainSample(believed=b, other=o, requests=r)
        for b, o, r in zip(believed, other, requests, strict=True)
    ]


def test_a_token_limit_that_drains_steadily_only_the_other_way_contradicts_the_belief() -> None:
    samples = _samples(COUNTED, UNCACHED, REQUESTS)
    assert drain_contradicts_belief(samples)
    # the median of the last four (7,052, 7,156, 7,221, 7,113)
    assert measured_limit(samples) == pytest.approx((7_113.0 + 7_156.0) / 2)
    assert measured_limit(samples, DrainBeliefConfig(samples=6)) == pytest.approx(
        (7_156.0 + 7_180.0) / 2
    )
    # believed the right way, the same 429s confirm it
    assert not drain_contradicts_belief(_samples(UNCACHED, COUNTED, REQUESTS))


def test_a_request_limit_that_drains_as_steadily_says_nothing_of_the_tokens() -> None:
    """429s of the request limit drain the request bucket steadily; the token rates then
    follow the calls' sizes, and whichever counting is steadier says nothing."""
    steady_requests = [2.50, 2.49, 2.51, 2.50, 2.50, 2.49]
    assert not drain_contradicts_belief(_samples(COUNTED, UNCACHED, steady_requests))


def test_an_output_limit_drained_steadily_takes_the_verdict_away() -> None:
    samples = [
        DrainSample(believed=b, other=o, requests=r, output=640.0)
        for b, o, r in zip(COUNTED, UNCACHED, REQUESTS, strict=True)
    ]
    assert not drain_contradicts_belief(samples)


def test_a_fixed_cache_share_reads_the_same_spread_both_ways_and_the_belief_stands() -> None:
    assert not drain_contradicts_belief(_samples([3.0 * u for u in UNCACHED], UNCACHED, REQUESTS))


def test_a_wandering_token_rate_both_ways_is_no_verdict() -> None:
    wandering = [7_000.0, 7_900.0, 6_600.0, 7_400.0, 8_100.0, 6_900.0]
    counted = [u * c for u, c in zip(wandering, CACHE_RATIO, strict=True)]
    assert not drain_contradicts_belief(_samples(counted, wandering, REQUESTS))


def test_fewer_samples_than_the_verdict_reads_leave_the_belief_alone() -> None:
    reads = DrainBeliefConfig().samples
    few = _samples(COUNTED, UNCACHED, REQUESTS)[: reads - 1]
    assert not drain_contradicts_belief(few)
    assert drain_contradicts_belief(few, DrainBeliefConfig(samples=reads - 1))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("samples", 2),
        ("samples", 6.0),
        ("steady_spread", 0.9),
        ("share", 1.5),
        ("margin", 0.5),
        ("confirmed_samples", 3),
        ("confirmed_samples", 8.0),
    ],
)
def test_a_bad_constant_is_named(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        DrainBeliefConfig(**{field: value})  # type: ignore[arg-type]
    assert field in str(err.value)


def test_judged_keeps_the_last_samples_and_spends_them_on_a_verdict() -> None:
    samples = _samples(COUNTED, UNCACHED, REQUESTS)[: DrainBeliefConfig().samples]
    kept = DrainEvidence()
    for sample in samples[:-1]:
        kept, measured = judged(kept, sample)
        assert measured is None
    assert kept == DrainEvidence(tuple(samples[:-1]))
    kept, measured = judged(kept, samples[-1])
    assert kept == DrainEvidence()
    assert measured == pytest.approx(measured_limit(samples))
    # a wandering start that confirmed nothing does not hold the verdict back
    start = DrainSample(believed=9e4, other=3e3, requests=1.0)
    kept = DrainEvidence((start,))
    for sample in samples:
        kept, measured = judged(kept, sample)
    assert kept == DrainEvidence() and measured == pytest.approx(measured_limit(samples))


# random-4088 of sim.generate (cache reads not counted, believed so): the uncached rate drained
# at four token 429s held within 2.4% while the rate counting cache reads wandered; then the
# token limit dropped from 9,675 to 6,165 tokens/s while the fleet aged, and across the next
# four 429s the uncached rate fell while the other held within 4.3%
CONFIRMING = _samples(
    [9_345.6, 9_454.1, 9_566.6, 9_499.6],
    [21_612.5, 25_596.7, 32_146.5, 51_699.0],
    [4.17, 4.08, 3.93, 3.78],
)
AFTER_A_DROP = _samples(
    [8_925.0, 8_696.2, 7_873.2, 6_651.1],
    [48_850.5, 48_170.6, 47_365.4, 46_779.0],
    [3.42, 3.35, 3.01, 2.54],
)


def test_a_belief_the_samples_confirmed_is_not_flipped_by_a_limit_moving_under_four() -> None:
    assert drain_confirms_belief(CONFIRMING)
    assert drain_contradicts_belief(AFTER_A_DROP)  # alone, four samples would flip it
    kept = DrainEvidence()
    for sample in [*CONFIRMING, *AFTER_A_DROP]:
        kept, measured = judged(kept, sample)
        assert measured is None
    assert kept.confirmed
    assert kept.samples == tuple([*CONFIRMING, *AFTER_A_DROP])
    # never confirmed, the same last four flip it
    unconfirmed = DrainEvidence()
    verdicts = []
    for sample in AFTER_A_DROP:
        unconfirmed, measured = judged(unconfirmed, sample)
        verdicts.append(measured)
    assert verdicts[-1] == pytest.approx(measured_limit(AFTER_A_DROP))


def test_a_confirmed_belief_still_flips_when_the_other_counting_holds_over_the_longer_read() -> (
    None
):
    """A belief wrongly confirmed (a limit moved under its samples) is contradicted once the
    other counting's rate holds steady over ``confirmed_samples`` 429s."""
    cfg = DrainBeliefConfig()
    wrong = _samples(COUNTED + COUNTED[:2], UNCACHED + UNCACHED[:2], REQUESTS + REQUESTS[:2])
    assert len(wrong) == cfg.confirmed_samples
    kept = DrainEvidence(confirmed=True)
    verdicts = []
    for sample in wrong:
        kept, measured = judged(kept, sample, cfg)
        verdicts.append(measured)
    assert verdicts[: cfg.confirmed_samples - 1] == [None] * (cfg.confirmed_samples - 1)
    assert verdicts[-1] == pytest.approx(measured_limit(wrong, cfg, reads=cfg.confirmed_samples))
    assert kept == DrainEvidence()
