"""Runs on one alias share its ceiling by priority, each within its cap; unused share moves."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.shares import RunDemand, fair_shares


def test_priorities_one_and_three_split_about_one_to_three() -> None:
    shares = fair_shares(40, [RunDemand("a", 1.0, 100), RunDemand("b", 3.0, 100)])
    assert shares == {"a": 10, "b": 30}


def test_a_run_that_cannot_use_its_share_gives_it_to_the_others() -> None:
    shares = fair_shares(40, [RunDemand("a", 1.0, 100), RunDemand("b", 3.0, 5)])
    assert shares == {"a": 35, "b": 5}
    # the second run finished: the first takes the whole ceiling
    assert fair_shares(40, [RunDemand("a", 1.0, 100), RunDemand("b", 3.0, 0)]) == {"a": 40, "b": 0}


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="priority"):
        RunDemand("a", 0.0, 1)
    with pytest.raises(ValueError, match="ceiling"):
        fair_shares(-1, [])


@given(
    st.integers(0, 500),
    st.lists(st.tuples(st.floats(0.1, 10), st.integers(0, 200)), min_size=1, max_size=8),
)
def test_shares_sum_to_what_can_be_used_and_respect_caps(
    ceiling: int, spec: list[tuple[float, int]]
) -> None:
    runs = [RunDemand(f"r{i}", p, u) for i, (p, u) in enumerate(spec)]
    shares = fair_shares(ceiling, runs)
    assert sum(shares.values()) == min(ceiling, sum(r.usable for r in runs))
    for r in runs:
        assert 0 <= shares[r.run_id] <= r.usable
