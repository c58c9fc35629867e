"""Lessons of providers without rate-limit headers, in the simulator: what the controller does
with a guess (a stale seed, the share rule's blame of an unknown 429) decides the run.

Each test runs the shipped planner and the planner with the naive rule on a file written
outside the generator (``scenarios/outside/``), and fails on the naive rule; the last one
drives the policy's 429 handling directly (a retry's 429 is no new evidence).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from planner.budgets import ControllerConfig
from planner.classify import Classification, LimitType
from sim.planner_policy import PlannerPolicy
from sim.scenario import load_scenario
from sim.targets import MAX_RATIO
from sim.workload import build_workload
from tests.sim.sim_support import planner_row

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ROOT / "scenarios" / "outside"


def run_planner(name: str, controller: ControllerConfig) -> dict[str, Any]:
    """The planner's result row on ``scenarios/outside/NAME.yaml`` with this controller."""
    return planner_row(load_scenario(OUTSIDE / f"{name}.yaml"), controller)


def test_a_stale_seed_far_below_the_limits_is_not_held_to_one_and_a_half_times_it() -> None:
    """A ten-hour-old config at 0.35x the token limit and 0.5x the request limit, no headers
    to re-seed it. Held to 1.5x the stale seed until a re-base up, and thrown back to it by
    the first 429 above it, the run climbs for a quarter of an hour (4,007 s, ratio 1.18,
    1.10x ``fixed:77``); growth to 3x the stale seed, and a 429 that cuts from the level
    reached: 3,802 s, ratio 1.12, within 5% of every baseline. (Since a guessed blame is held
    5 minutes, not 10, the thirty-second round: 3,860 s against 3,966 s.)"""
    shipped = run_planner("tr-stale-low-none", ControllerConfig())
    naive = run_planner(
        "tr-stale-low-none", ControllerConfig(stale_max_over_seed=ControllerConfig().max_over_seed)
    )
    assert shipped["makespan_s"] < 0.98 * naive["makespan_s"], (shipped, naive)
    assert shipped["ratio"] <= MAX_RATIO
    assert shipped["rate_429"] <= 0.005


def test_a_guessed_blame_does_not_hold_the_wrong_budget_for_twenty_minutes() -> None:
    """The output seed 2.5x the output limit, input nearly binding, no headers. The first 429s
    are the output limit's; the share rule puts them on the token budget (used most relative
    to its budget), which is cut to half the input limit. Remembered for 20 minutes, that
    guess holds the run token-bound at half its limit (8,055 s, ratio 1.27); remembered for
    10 minutes and re-probed, 7,537 s, ratio 1.18. Measured with the level a guess leaves not
    capped by its drained rate (``drained_memory_over`` at its bound): that later rule limits
    what a wrong guess holds too, and with it the file ran 7,682 s (ratio 1.21) against
    7,877 s with a guess remembered for 20 minutes. Since the controller acts on a 429 at the
    tick, as in production (the pacer's provisional cut meanwhile, thirty-sixth round), the
    uncapped figures are 7,838 s and 7,907 s, and the shipped controller's 7,266 s (ratio
    1.14) against 8,207 s (1.29): measured with the shipped rules. Since the memory is 15
    minutes (thirty-seventh round), a guess held for all of it is within 1% of the shipped
    controller here (7,456 s against 7,417 s, ratio 1.17): the rule is measured at the
    20-minute memory it was written for, and the shipped controller meets the targets."""
    twenty = replace(ControllerConfig(), memory_s=1200.0, stated_cap_memory_s=1200.0)
    rule = run_planner("issue-example-none-out-tight", twenty)
    naive = run_planner(
        "issue-example-none-out-tight", replace(twenty, unchecked_memory_s=twenty.memory_s)
    )
    assert rule["makespan_s"] < 0.96 * naive["makespan_s"], (rule, naive)
    assert rule["ratio"] <= MAX_RATIO < naive["ratio"]
    shipped = run_planner("issue-example-none-out-tight", ControllerConfig())
    assert shipped["ratio"] <= MAX_RATIO
    assert shipped["rate_429"] <= 0.005


def test_the_retries_of_a_rejected_call_cut_nothing_more() -> None:
    """A call too big for the provider's bucket at the moment is rejected and retried until it
    fits (random-290: a 65,536-output-token call, rejected three times in 83 s while the rest
    of the fleet's traffic was well inside every limit). Its first 429 is evidence; its
    retries' repeat it, as the gateway records them (``llm_calls.retry``). Counted each time,
    they cut every budget of a header-less alias again once the cooldown is over, and the
    share rule, measuring rates its own cuts just lowered, re-based the token seed to 0.4x its
    limit (5,535 s, 1.09x ``fixed:34``)."""
    scenario = load_scenario(ROOT / "scenarios" / "parametric-seed-high-no-headers.yaml")
    workload = build_workload(scenario)
    policy = PlannerPolicy(scenario, workload, lambda now: None)
    bare = Classification(status=429, limit_type=LimitType.UNKNOWN)
    cooldown = policy.controller.cooldown_s

    policy.on_response(100.0, 7, bare)
    # the first one cuts the pacer at once (the controller acts at the tick) and is evidence
    after_first = policy.pacer.budgets
    assert after_first.tokens_per_s < policy.state.budgets.tokens_per_s
    assert policy._throttles == [(LimitType.UNKNOWN, None)]
    policy.on_response(100.0 + 2 * cooldown, 7, bare)  # its retry, after the cooldown
    assert policy.pacer.budgets == after_first
    assert len(policy._throttles) == 1
    policy.on_response(100.0 + 3 * cooldown, 8, bare)  # another call's first 429 cuts
    assert policy.pacer.budgets.tokens_per_s < after_first.tokens_per_s
    assert len(policy._throttles) == 2
