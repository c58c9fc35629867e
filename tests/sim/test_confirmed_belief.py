"""A cache-counting belief the drained rates confirmed is not flipped by a limit that drops
under it (``planner.drain_belief``, ``DrainBeliefConfig.confirmed_samples``)."""

from __future__ import annotations

from sim.generate import random_scenario
from sim.targets import MAX_RATIO
from tests.sim.sim_support import planner_run


def test_a_token_limit_dropping_by_a_third_does_not_flip_a_confirmed_belief() -> None:
    """random-4088: no headers, cache reads not counted and believed so; the input limit
    drops from 9,675 to 6,165 tokens/s at 1,422 s while the fleet ages. Four 429s before the
    drop held the uncached drained rate within 2.4%; across the four after it the uncached
    rate fell and the rate counting cache reads held within 4.3%. Read alone those four flip
    the belief, and the token budget, in units counting cache reads, held the fleet to one
    task for 17 minutes (ratio 1.22, 1.18x a fixed fleet of 42)."""
    scenario = random_scenario(4088)
    assert scenario.provider.headers == "none"
    assert not scenario.provider.cached_input_counts
    assert not scenario.alias_config.cached_input_counts
    policy, row = planner_run(scenario)
    assert policy.recounted == []
    assert policy.counting.cached_input_counts is False
    assert row["ratio"] <= MAX_RATIO
    queued_at_one = [
        d.now for d in policy.decisions if d.queued > 0 and d.ceiling <= 2 and d.now > 600
    ]
    assert len(queued_at_one) <= 4  # no long spell of a fleet held to a task or two
