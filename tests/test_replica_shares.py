"""Gateway replicas split an alias's budgets by demand (``planner.replica_shares``): the shares
of the live replicas sum to one, follow demand, keep a reserve for a replica with none yet, and
reject demands that are not numbers of calls."""

from __future__ import annotations

import math

import pytest

from planner.replica_shares import RESERVE, PresenceAverage, replica_share


@pytest.mark.parametrize(
    "demands",
    [
        {"a": 0.0},
        {"a": 5.0},
        {"a": 0.0, "b": 0.0, "c": 0.0},
        {"a": 30.0, "b": 10.0},
        {"a": 0.0, "b": 100.0, "c": 7.0},
        {"a": 1e-9, "b": 1e9},
    ],
)
def test_the_live_replicas_shares_sum_to_one(demands: dict[str, float]) -> None:
    total = sum(replica_share(own, demands) for own in demands)
    assert math.isclose(total, 1.0, rel_tol=1e-12)


def test_a_replica_alone_takes_everything_whatever_its_demand() -> None:
    assert replica_share("a", {"a": 0.0}) == 1.0
    assert replica_share("a", {"a": 12.0}) == 1.0
    assert replica_share("a", {}) == 1.0  # before its first report landed


def test_shares_follow_demand_with_a_reserve_split_equally() -> None:
    demands = {"a": 30.0, "b": 10.0}
    assert replica_share("a", demands) == pytest.approx((1 - RESERVE) * 0.75 + RESERVE / 2)
    assert replica_share("b", demands) == pytest.approx((1 - RESERVE) * 0.25 + RESERVE / 2)
    # an idle replica keeps only its part of the reserve, enough to admit the calls that will
    # make its demand visible
    idle = replica_share("b", {"a": 50.0, "b": 0.0})
    assert idle == pytest.approx(RESERVE / 2)
    # no demand anywhere: equal parts
    assert replica_share("c", {"a": 0.0, "b": 0.0, "c": 0.0}) == pytest.approx(1 / 3)


def test_a_replica_missing_from_the_list_counts_as_one_with_no_demand() -> None:
    share = replica_share("new", {"a": 10.0})
    assert share == pytest.approx(RESERVE / 2)
    assert share + replica_share("a", {"a": 10.0, "new": 0.0}) == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_a_demand_that_is_not_a_count_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="replica b: demand"):
        replica_share("a", {"a": 1.0, "b": bad})


@pytest.mark.parametrize("reserve", [0.0, -0.1, 1.5])
def test_the_reserve_must_be_a_share(reserve: float) -> None:
    with pytest.raises(ValueError, match="reserve"):
        replica_share("a", {"a": 1.0}, reserve=reserve)


def test_presence_averages_a_step_count_over_time() -> None:
    avg = PresenceAverage(now=0.0, tau_s=5.0)
    avg.step(+4, 0.0)
    assert avg.average(0.0) == 0.0
    assert avg.average(5.0) == pytest.approx(4 * (1 - math.exp(-1)))
    assert avg.average(100.0) == pytest.approx(4.0)
    avg.step(-4, 100.0)
    assert avg.average(105.0) == pytest.approx(4 * math.exp(-1))
    avg.step(-3, 105.0)  # never below zero
    assert avg.present == 0
    # a clock that goes back changes nothing
    assert avg.average(50.0) == avg.average(105.0)
    with pytest.raises(ValueError, match="tau_s"):
        PresenceAverage(now=0.0, tau_s=0.0)
