"""HarnessCurve: evaluation properties, serialisation, validation and the shipped default."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from evalfleet.errors import ConfigError, NotFound
from planner.curves import HarnessCurve, default_curve

AGES = np.concatenate([[0.0], np.logspace(-3, 6, 2000)])


def small_curve(**overrides: object) -> HarnessCurve:
    params = {
        "format": 1,
        "harness": "toy",
        "rates": {
            "age_s": [30.0, 90.0, 150.0],
            "calls_per_s": [0.2, 0.1, 0.1],
            "cached_input_tokens_per_s": [0.0, 500.0, 900.0],
            "uncached_input_tokens_per_s": [400.0, 300.0, 300.0],
            "output_tokens_per_s": [40.0, 10.0, 10.0],
            "inflight_tokens": [1000.0, 4000.0, 9000.0],
            "inflight_calls": [0.5, 0.4, 0.4],
        },
        "survival": {"age_s": [0.0, 60.0, 120.0], "value": [1.0, 0.5, 0.25], "tail_s": 100.0},
        "latency": {"base_s": 1.0, "per_output_token_s": 0.01},
        "fit": {},
    }
    params.update(overrides)
    return HarnessCurve.from_params(params)


@pytest.fixture(scope="module")
def curve() -> HarnessCurve:
    return default_curve("mini-swe-agent")


def test_default_curve_survival_is_a_survival_function(curve: HarnessCurve) -> None:
    s = curve.survival(AGES)
    assert s[0] == 1.0
    assert np.all(np.diff(s) <= 0)
    assert np.all((s >= 0) & (s <= 1))
    assert s[-1] < 1e-9  # -> 0 far beyond the fitted range
    assert curve.survival(-5.0) == 1.0


@pytest.mark.parametrize(
    "method",
    [
        "calls_per_s",
        "input_tokens_per_s",
        "cached_input_tokens_per_s",
        "uncached_input_tokens_per_s",
        "output_tokens_per_s",
        "inflight_tokens",
        "inflight_calls",
        "survival",
        "log_survival",
    ],
)
def test_default_curve_rates_finite_and_non_negative_for_all_ages(
    curve: HarnessCurve, method: str
) -> None:
    values = getattr(curve, method)(AGES)
    assert values.shape == AGES.shape
    if method == "log_survival":
        assert np.all(np.isfinite(values)) and np.all(values <= 0)
    else:
        assert np.all(np.isfinite(values)) and np.all(values >= 0)


def test_input_is_cached_plus_uncached_and_shape_of_the_trace(curve: HarnessCurve) -> None:
    ages = np.array([30.0, 180.0, 420.0])
    total = curve.input_tokens_per_s(ages)
    np.testing.assert_allclose(
        total, curve.cached_input_tokens_per_s(ages) + curve.uncached_input_tokens_per_s(ages)
    )
    # The design's facts about mini-swe-agent: input rate grows with age, calls/s falls,
    # and most input is cache reads after the first minutes.
    assert total[2] > 2.5 * total[0]
    assert curve.calls_per_s(420.0) < curve.calls_per_s(30.0)
    assert curve.cached_input_tokens_per_s(420.0) > 0.8 * total[2]


def test_rates_interpolate_between_nodes_and_are_flat_outside() -> None:
    c = small_curve()
    assert c.calls_per_s(0.0) == pytest.approx(0.2)
    assert c.calls_per_s(60.0) == pytest.approx(0.15)
    assert c.calls_per_s(1e7) == pytest.approx(0.1)
    assert c.input_tokens_per_s(120.0) == pytest.approx(700.0 + 300.0)
    assert c.survival(30.0) == pytest.approx(0.75)
    assert c.survival(220.0) == pytest.approx(0.25 * np.exp(-1.0))


def test_mean_duration_is_the_integral_of_survival() -> None:
    c = small_curve()
    # trapezoids 60*(1+.5)/2 + 60*(.5+.25)/2 = 67.5, tail .25*100 = 25
    assert c.mean_duration_s() == pytest.approx(92.5)
    d = default_curve()
    grid = np.linspace(0, 20000, 200001)
    assert d.mean_duration_s() == pytest.approx(np.trapezoid(d.survival(grid), grid), rel=1e-4)


def test_survival_ratio_matches_the_quotient_and_never_nans() -> None:
    c = small_curve()
    ages = np.array([0.0, 30.0, 100.0, 500.0])
    np.testing.assert_allclose(
        c.survival_ratio(ages, 45.0), c.survival(ages + 45.0) / c.survival(ages)
    )
    deep = c.survival_ratio(np.array([1e5, 1e6]), 50.0)
    np.testing.assert_allclose(deep, np.exp(-0.5))  # memoryless tail, though S underflows to 0
    assert np.all(c.survival_ratio(AGES, 1e6) >= 0)
    assert not np.any(np.isnan(c.survival_ratio(AGES, AGES)))


def test_params_round_trip_exactly(curve: HarnessCurve) -> None:
    params = curve.to_params()
    again = HarnessCurve.from_params(json.loads(json.dumps(params)))
    assert again == curve
    assert again.to_params() == params
    np.testing.assert_array_equal(again.inflight_tokens(AGES), curve.inflight_tokens(AGES))


def test_evaluation_is_vectorised_and_matches_scalar_calls(curve: HarnessCurve) -> None:
    ages = np.random.default_rng(1).uniform(0, 2000, 10_000)
    rates = curve.input_tokens_per_s(ages)
    assert rates.shape == (10_000,)
    for i in (0, 17, 9_999):
        assert rates[i] == pytest.approx(float(curve.input_tokens_per_s(ages[i])))
    start = time.perf_counter()
    for _ in range(20):
        curve.calls_per_s(ages)
        curve.input_tokens_per_s(ages)
        curve.survival(ages)
    per_round = (time.perf_counter() - start) / 20
    assert per_round < 0.02  # measured ~0.3 ms; generous bound for a shared 2-core machine


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"format": 2}, "format"),
        ({"harness": ""}, "harness"),
        ({"extra": 1}, "extra"),
        ({"survival": {"age_s": [0.0, 60.0], "value": [1.0, 1.2], "tail_s": 10.0}}, "survival"),
        ({"survival": {"age_s": [0.0, 60.0], "value": [1.0, 0.5], "tail_s": 0.0}}, "tail_s"),
        ({"survival": {"age_s": [5.0, 60.0], "value": [1.0, 0.5], "tail_s": 9.0}}, "age 0"),
    ],
)
def test_bad_params_raise_config_error_naming_the_field(
    change: dict[str, object], needle: str
) -> None:
    with pytest.raises(ConfigError) as err:
        small_curve(**change)
    assert needle in str(err.value)


def test_bad_rate_arrays_are_rejected() -> None:
    base = small_curve().to_params()
    base["rates"]["calls_per_s"] = [0.2, -0.1, 0.1]
    with pytest.raises(ConfigError, match=r"rates\.calls_per_s"):
        HarnessCurve.from_params(base)
    base["rates"]["calls_per_s"] = [0.2, 0.1]
    with pytest.raises(ConfigError, match="2 values for 3 ages"):
        HarnessCurve.from_params(base)
    base["rates"]["calls_per_s"] = [0.2, 0.1, 0.1]
    base["rates"]["age_s"] = [30.0, 30.0, 150.0]
    with pytest.raises(ConfigError, match="strictly increasing"):
        HarnessCurve.from_params(base)


def test_unknown_default_harness_is_not_found() -> None:
    with pytest.raises(NotFound, match="no-such-harness"):
        default_curve("no-such-harness")
    with pytest.raises(NotFound):
        default_curve("../curves")
