"""The launch order (``planner.launch_order``) and the simulator's forecast of it
(``sim.forecast``): which instances go last, and that moving them is what shortens a run the
tail decides."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.launch_order import LaunchOrder, launch_ranks
from sim.bench import run_scenario
from sim.forecast import forecast_sizes, launched_by_forecast, launched_in_order
from sim.generate_wide import wide_scenario
from sim.workload import build_workload


def _order(ranks: dict[str, int]) -> list[str]:
    return sorted(ranks, key=ranks.__getitem__)


IDS = ["a", "b", "c", "d", "e", "f"]


def test_without_history_the_launch_order_is_the_listed_order() -> None:
    assert _order(launch_ranks(IDS, {})) == IDS
    assert _order(launch_ranks(IDS, {"zz": 5.0})) == IDS  # sizes of other instances only


def test_the_shorter_half_goes_last_shortest_at_the_end_the_rest_as_listed() -> None:
    sizes = {"a": 10.0, "b": 80.0, "c": 30.0, "d": 5.0, "e": 60.0, "f": 20.0}
    # shorter half: d (5), a (10), f (20); they go last, longest of them first
    assert _order(launch_ranks(IDS, sizes)) == ["b", "c", "e", "f", "a", "d"]
    assert launch_ranks(IDS, sizes, LaunchOrder.LISTED) == {i: k for k, i in enumerate(IDS)}


def test_instances_never_run_stay_in_front_and_bad_sizes_count_as_none() -> None:
    sizes = {"a": 10.0, "b": math.nan, "c": 30.0, "d": 0.0, "e": -4.0, "f": 20.0}
    # known: a, c, f; the shorter half of three is one instance: a
    assert _order(launch_ranks(IDS, sizes)) == ["b", "c", "d", "e", "f", "a"]


def test_ties_keep_the_listed_order_and_the_share_is_bounded() -> None:
    sizes = dict.fromkeys(IDS, 7.0)
    assert _order(launch_ranks(IDS, sizes)) == ["d", "e", "f", "a", "b", "c"]
    assert _order(launch_ranks(IDS, sizes, short_share=0.0)) == IDS
    with pytest.raises(ValueError, match="short_share"):
        launch_ranks(IDS, sizes, short_share=1.5)


def test_a_reordered_workload_keeps_every_instance_whole() -> None:
    workload = build_workload(wide_scenario(4681))
    order = np.arange(workload.n_instances)[::-1].copy()
    moved = launched_in_order(workload, order)
    np.testing.assert_allclose(moved.durations(), workload.durations()[order])
    assert moved.n_calls == workload.n_calls
    assert int(moved.output.sum()) == int(workload.output.sum())
    last = workload.n_instances - 1
    np.testing.assert_array_equal(
        moved.input[: moved.start[1]], workload.input[workload.start[last] :]
    )
    with pytest.raises(ValueError, match="permutation"):
        launched_in_order(workload, np.zeros(workload.n_instances, dtype=np.int64))


def test_forecasts_are_the_calls_perturbed_deterministically() -> None:
    workload = build_workload(wide_scenario(4681))
    calls = np.diff(workload.start).astype(float)
    np.testing.assert_allclose(forecast_sizes(workload, 0.0, 3), calls)
    noisy = forecast_sizes(workload, 1.0, 3)
    np.testing.assert_allclose(noisy, forecast_sizes(workload, 1.0, 3))
    assert not np.allclose(noisy, calls)
    assert 0.2 < np.corrcoef(np.log(noisy), np.log(calls))[0, 1] < 0.9
    with pytest.raises(ValueError, match="noise"):
        forecast_sizes(workload, -1.0, 3)
    # a perfect forecast sends the shorter half of the instances last, shortest at the end
    ordered = launched_by_forecast(workload, 0.0, 3)
    n_calls = np.diff(ordered.start)
    half = workload.n_instances // 2
    assert n_calls[-half:].max() <= np.sort(calls)[half - 1]
    assert (np.diff(n_calls[-half:]) <= 0).all()


def test_a_run_the_tail_decides_ends_sooner_with_its_short_instances_last() -> None:
    """wide-4681 ends on its longest instance, launched 3,282 s in and held 1,029 s by the
    pacer; with the instances that were short before launched last it does not."""
    scenario = wide_scenario(4681)
    listed = run_scenario(scenario, ["planner"]).results["planner"]
    ordered = run_scenario(scenario, ["planner"], forecast_noise=0.0).results["planner"]
    assert ordered["makespan_s"] < 0.95 * listed["makespan_s"]
    assert ordered["ratio"] <= 1.20 < listed["ratio"]
    assert ordered["rate_429"] <= 0.005
