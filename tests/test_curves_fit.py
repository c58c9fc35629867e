"""Fitting curves: exposure arithmetic, recovery of a known curve, and the 80/20 trace check."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import numpy as np
import pandas as pd
import pytest

from evalfleet.errors import ConfigError
from planner.curves import HarnessCurve, default_curve
from planner.fit import check_curve, fit_curve, interval_mass
from sim.traces import load_calls, load_instances, split_ids, split_trace, synthesize_calls


class _RawFit(TypedDict):
    mean_preserving: bool
    smooth: bool
    min_exposure_s: float


RAW: _RawFit = {"mean_preserving": False, "smooth": False, "min_exposure_s": 1.0}


def calls_frame(rows: Sequence[tuple[str, float | str, int, int, int]]) -> pd.DataFrame:
    """A calls frame from ``rows``; a ``str`` time builds a malformed frame for the checks."""
    return pd.DataFrame(
        rows,
        columns=[
            "instance_id",
            "t_request_s",
            "input_tokens",
            "cached_input_tokens",
            "output_tokens",
        ],
    )


def test_rates_are_events_over_alive_task_seconds() -> None:
    calls = calls_frame(
        [("a", 10.0, 1000, 0, 10), ("a", 70.0, 3000, 1000, 10), ("b", 30.0, 2000, 0, 10)]
    )
    instances = pd.DataFrame({"instance_id": ["a", "b"], "wall_time_s": [120.0, 60.0]})
    curve = fit_curve(calls, "toy", instances=instances, **RAW).curve
    # minute 0: both alive (120 task-s), 2 calls, 3000 input tokens; minute 1: a alone (60 task-s)
    assert curve.rate_age_s == (30.0, 90.0)
    assert curve.calls_per_s_at == pytest.approx((2 / 120, 1 / 60))
    assert curve.uncached_input_tokens_per_s_at == pytest.approx((3000 / 120, 2000 / 60))
    assert curve.cached_input_tokens_per_s_at == pytest.approx((0.0, 1000 / 60))
    assert curve.survival(0.0) == 1.0
    assert curve.mean_duration_s() == pytest.approx(90.0)


def test_inflight_uses_the_latency_model_cut_at_the_next_request() -> None:
    # call 1: latency 1 + 0.01*100 = 2 s but the next request comes at 1.5 s; call 2: 2 s.
    calls = calls_frame([("a", 0.0, 900, 0, 100), ("a", 1.5, 1900, 0, 100)])
    instances = pd.DataFrame({"instance_id": ["a"], "wall_time_s": [60.0]})
    curve = fit_curve(calls, "toy", instances=instances, **RAW).curve
    token_seconds = 1000 * 1.5 + 2000 * 2.0
    assert curve.inflight_tokens_at == pytest.approx((token_seconds / 60,))
    assert curve.inflight_calls_at == pytest.approx((3.5 / 60,))


def test_interval_mass_splits_intervals_across_bins() -> None:
    edges = np.array([0.0, 10.0, 20.0, 30.0])
    mass = interval_mass(np.array([5.0, 0.0]), np.array([25.0, 3.0]), np.array([2.0, 1.0]), edges)
    np.testing.assert_allclose(mass, [2 * 5 + 3, 2 * 10, 2 * 5])


def test_mean_preserving_fit_reproduces_bin_rates_in_sample() -> None:
    calls, inst = load_calls(), load_instances()
    fitted = fit_curve(calls, "mini-swe-agent", instances=inst, smooth=False)
    check = check_curve(fitted.curve, calls, inst, n_bins=8)
    assert check["rel_error"].abs().max() < 0.01


def parametric_curve() -> HarnessCurve:
    ages = [float(a) for a in range(0, 1200, 60)]
    return HarnessCurve.from_params(
        {
            "format": 1,
            "harness": "parametric",
            "rates": {
                "age_s": [a + 30 for a in ages],
                "calls_per_s": [0.25 * np.exp(-a / 600) + 0.08 for a in ages],
                "cached_input_tokens_per_s": [5.0 * a for a in ages],
                "uncached_input_tokens_per_s": [600.0 - 0.3 * a for a in ages],
                "output_tokens_per_s": [30.0] * len(ages),
                "inflight_tokens": [0.0] * len(ages),
                "inflight_calls": [0.0] * len(ages),
            },
            "survival": {
                "age_s": [0.0, 60.0, 600.0],
                "value": [1.0, 1.0, 0.4],
                "tail_s": 300.0,
            },
            "latency": {"base_s": 1.0, "per_output_token_s": 0.01},
        }
    )


def test_pooled_bins_are_capped_at_max_nodes_and_a_fit_under_the_cap_is_untouched() -> None:
    """Tasks of many hours at 60 s bins pool into thousands of nodes, and the solves grow faster
    than their square (a fuzzed harness's fit ran for hours): the pooling is coarsened to at
    most ``max_nodes``, where the rates still come out right."""
    rows = [
        (f"i{k}", float(t), 1000, 0, 10) for k in range(50) for t in np.arange(0.0, 6000.0, 30.0)
    ]
    instances = pd.DataFrame({"instance_id": [f"i{k}" for k in range(50)], "wall_time_s": 6000.0})
    natural = fit_curve(calls_frame(rows), "long", instances=instances, smooth=False)
    assert natural.quality["nodes"] == 100  # 60 s bins of 50 tasks: 3,000 task-s each
    capped = fit_curve(calls_frame(rows), "long", instances=instances, smooth=False, max_nodes=20)
    assert capped.quality["nodes"] <= 20
    ages = np.arange(300.0, 5700.0, 60.0)
    np.testing.assert_allclose(capped.curve.calls_per_s(ages), 1 / 30, rtol=0.05)
    np.testing.assert_allclose(capped.curve.input_tokens_per_s(ages), 1000 / 30, rtol=0.05)
    with pytest.raises(ConfigError, match="max_nodes"):
        fit_curve(calls_frame(rows), "long", instances=instances, max_nodes=1)


@pytest.mark.parametrize("known", [default_curve(), parametric_curve()], ids=["trace", "param"])
def test_fit_recovers_a_curve_from_calls_generated_with_it(known: HarnessCurve) -> None:
    calls, instances = synthesize_calls(known, 1500, seed=11)
    fitted = fit_curve(calls, known.harness, instances=instances).curve
    grid = np.arange(600.0) + 0.5  # first 10 minutes, per-minute means

    def per_minute(curve: HarnessCurve, method: str) -> np.ndarray:
        means: np.ndarray = getattr(curve, method)(grid).reshape(10, 60).mean(axis=1)
        return means

    for method in ("input_tokens_per_s", "calls_per_s", "uncached_input_tokens_per_s"):
        error = per_minute(fitted, method) / per_minute(known, method) - 1
        assert np.abs(error).max() < 0.10, (method, np.round(error, 3))
    assert fitted.mean_duration_s() == pytest.approx(known.mean_duration_s(), rel=0.05)
    median_known = np.interp(0.5, known.survival(grid)[::-1], grid[::-1])
    assert np.median(instances["wall_time_s"]) == pytest.approx(median_known, rel=0.05)


def test_synthesized_calls_are_deterministic_and_well_formed() -> None:
    a_calls, a_inst = synthesize_calls(default_curve(), 50, seed=5)
    b_calls, _ = synthesize_calls(default_curve(), 50, seed=5)
    pd.testing.assert_frame_equal(a_calls, b_calls)
    assert (a_calls["cached_input_tokens"] <= a_calls["input_tokens"]).all()
    merged = a_calls.merge(a_inst, on="instance_id")
    assert (merged["t_request_s"] <= merged["wall_time_s"]).all()
    assert (a_calls.groupby("instance_id")["step"].min() == 1).all()


def test_split_is_deterministic_disjoint_and_80_20() -> None:
    ids = load_instances()["instance_id"].tolist()
    train, test = split_ids(ids)
    assert (len(train), len(test)) == (400, 100)
    assert set(train).isdisjoint(test) and set(train) | set(test) == set(ids)
    assert split_ids(list(reversed(ids))) == (train, test)  # independent of row order
    assert split_ids(ids, salt="other")[1] != test


@pytest.fixture(scope="module")
def held_out_check() -> pd.DataFrame:
    split = split_trace(load_calls(), load_instances())
    return check_curve(default_curve(), split.test_calls, split.test_instances, n_bins=8)


def test_shipped_default_is_the_refit_on_the_80_percent() -> None:
    split = split_trace(load_calls(), load_instances())
    refit = fit_curve(split.train_calls, "mini-swe-agent", instances=split.train_instances)
    shipped = default_curve().to_params()
    fresh = refit.curve.to_params()
    for key in ("rates", "survival", "latency"):
        for name, values in fresh[key].items():
            np.testing.assert_allclose(shipped[key][name], values, rtol=1e-9, err_msg=name)
    assert shipped["fit"]["train_instances"] == 400
    assert shipped["fit"]["test_instances"] == 100


@pytest.mark.parametrize("quantity", ["calls_per_s", "input_tokens_per_s"])
def test_default_curve_within_15_percent_on_held_out_20_percent(
    held_out_check: pd.DataFrame, quantity: str
) -> None:
    rows = held_out_check[held_out_check["quantity"] == quantity]
    assert len(rows) == 8
    assert rows["rel_error"].abs().max() <= 0.15, rows[["bin_start_s", "rel_error"]]


def test_default_curve_uncached_within_15_percent_for_first_6_minutes(
    held_out_check: pd.DataFrame,
) -> None:
    rows = held_out_check[held_out_check["quantity"] == "uncached_input_tokens_per_s"]
    assert rows["rel_error"].iloc[:6].abs().max() <= 0.15, rows[["bin_start_s", "rel_error"]]


@pytest.mark.xfail(
    strict=True,
    reason="known shortfall, from the data: uncached input at minute 7 is +69% (minute 6: +9%) "
    "on the held-out 20%. ~4% of calls miss the cache and resend the whole ~30k-token context; "
    "the held-out minute 7 has 18 tasks, 96 calls and 1 such miss, so its mean (223 tokens/s, "
    "95% bootstrap 114-379) moves ~16% per miss, and the whole trace has 5 misses at minute 7 "
    "against ~20 expected. Even the 80%'s raw minute means miss (+34%, +27%); over 300 random "
    "splits the per-minute means of all 500 instances pass only 18%. See docs/bench-planner.md",
)
def test_default_curve_uncached_within_15_percent_for_8_minutes(
    held_out_check: pd.DataFrame,
) -> None:
    rows = held_out_check[held_out_check["quantity"] == "uncached_input_tokens_per_s"]
    assert rows["rel_error"].abs().max() <= 0.15


def test_held_out_late_minutes_measure_uncached_coarser_than_the_tolerance() -> None:
    """Why the 8-minute uncached check is an xfail: the held-out data cannot resolve 15% there."""
    split = split_trace(load_calls(), load_instances())
    check = check_curve(
        default_curve(), split.test_calls, split.test_instances, n_bins=8, bootstrap=2000
    )
    rows = check[check["quantity"] == "uncached_input_tokens_per_s"].set_index("bin_start_s")
    half_width = (rows["observed_hi"] - rows["observed_lo"]) / 2 / rows["observed"]
    assert (half_width.loc[[360.0, 420.0]] > 0.3).all(), half_width
    assert (half_width.loc[[0.0, 60.0]] < 0.12).all(), half_width
    assert rows["alive"].tolist() == [100, 100, 95, 76, 49, 36, 24, 18]


def test_check_bootstrap_interval_is_seeded_and_brackets_the_observed_rate() -> None:
    calls, instances = synthesize_calls(default_curve(), 60, seed=3)
    first = check_curve(default_curve(), calls, instances, n_bins=4, bootstrap=300, seed=1)
    again = check_curve(default_curve(), calls, instances, n_bins=4, bootstrap=300, seed=1)
    pd.testing.assert_frame_equal(first, again)
    assert (first["observed_lo"] <= first["observed"]).all()
    assert (first["observed"] <= first["observed_hi"]).all()
    assert (first["observed_hi"] > first["observed_lo"]).all()
    plain = check_curve(default_curve(), calls, instances, n_bins=4)
    assert "observed_lo" not in plain.columns
    pd.testing.assert_frame_equal(plain, first.drop(columns=["observed_lo", "observed_hi"]))


def test_check_bootstrap_of_identical_instances_has_no_spread() -> None:
    rows = [(f"i{k}", t, 1000, 200, 50) for k in range(5) for t in (5.0, 30.0, 70.0)]
    instances = pd.DataFrame({"instance_id": [f"i{k}" for k in range(5)], "wall_time_s": 90.0})
    check = check_curve(default_curve(), calls_frame(rows), instances, n_bins=2, bootstrap=200)
    np.testing.assert_allclose(check["observed_lo"], check["observed"])
    np.testing.assert_allclose(check["observed_hi"], check["observed"])
    calls_rows = check[check["quantity"] == "calls_per_s"]
    assert calls_rows["observed"].tolist() == pytest.approx([2 / 60, 1 / 30])
    assert calls_rows["alive"].tolist() == [5, 5]


@pytest.mark.parametrize(
    ("calls", "instances", "needle"),
    [
        (calls_frame([("a", 1.0, 10, 0, 1)]).drop(columns="output_tokens"), None, "output_tokens"),
        (calls_frame([("a", 1.0, 10, 20, 1)]), None, "exceed input_tokens"),
        (calls_frame([("a", 1.0, -10, 0, 1)]), None, "negative"),
        (calls_frame([("a", "x", 10, 0, 1)]), None, "t_request_s"),
        (calls_frame([]), None, "no calls"),
        (
            calls_frame([("a", 1.0, 10, 0, 1)]),
            pd.DataFrame({"instance_id": ["b"], "wall_time_s": [9.0]}),
            "have no row",
        ),
        (
            calls_frame([("a", 1.0, 10, 0, 1)]),
            pd.DataFrame({"instance_id": ["a"], "wall_time_s": [0.0]}),
            "wall_time_s",
        ),
    ],
)
def test_bad_call_tables_are_clear_errors(
    calls: pd.DataFrame, instances: pd.DataFrame | None, needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        fit_curve(calls, "toy", instances=instances)


def test_without_instances_a_task_ends_after_its_last_response() -> None:
    calls = calls_frame([("a", 0.0, 100, 0, 100), ("a", 50.0, 100, 0, 100)])
    curve = fit_curve(calls, "toy").curve
    assert curve.mean_duration_s() == pytest.approx(52.0)  # last request + 1 s + 0.01 s x 100


def test_no_bin_has_negative_mass_and_every_parametric_fit_is_finite() -> None:
    """``interval_mass`` takes differences of large cumulative sums: a bin past every interval
    came out -1e-10, the fit's bin weight (its square root) NaN, and the fit of a parametric
    harness failed outright (wide-73 of sim.generate_wide: the benchmark command crashed)."""
    from planner.fit import interval_mass
    from sim.generate_wide import wide_scenario
    from sim.pacer_gate import scenario_curve

    rng = np.random.default_rng(0)
    for _ in range(10):
        ends = rng.uniform(100, 5000, size=400)
        mass = interval_mass(np.zeros(400), ends, np.ones(400), np.arange(0, 8000, 60.0))
        assert mass.min() >= 0.0
        assert mass.sum() == pytest.approx(ends.sum())
    curve = scenario_curve(wide_scenario(73))
    assert np.isfinite(curve.calls_per_s_at).all() and curve.mean_duration_s() > 0
