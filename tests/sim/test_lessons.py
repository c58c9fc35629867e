"""The design's lessons replayed end to end by the planner in the simulator: the budgets after
request-count and token 429s, a limit that drops or is raised, an unknown 429, booting tasks."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import yaml

from planner.budgets import BudgetClass, ControllerConfig
from sim.bench import run_scenario, saturating_workers
from sim.engine import FleetView, Simulation
from sim.limits import ProviderLimits
from sim.metrics import limit_spec, lower_bound, summarise
from sim.planner_policy import PlannerPolicy
from sim.reveal import headers_now
from sim.scenario import parse_scenario
from sim.workload import build_workload
from tests.sim.sim_support import ROOT, parametric, simulate_planner


def test_planner_keeps_the_limit_busy_without_429s_and_beats_baselines() -> None:
    doc = parametric(instances=120)
    doc["provider"]["input_tpm"] = 300_000  # the limit binds for ~4x the longest instance
    scenario = parse_scenario(doc, "s")
    workload = build_workload(scenario)
    star = saturating_workers(scenario, workload)
    policies = ["planner", "aimd", f"fixed:{round(star)}", f"fixed:{round(2 * star)}"]
    results = run_scenario(scenario, policies).results
    ours = results["planner"]
    assert ours["ratio"] <= 1.2 and ours["rate_429"] <= 0.005
    for name, row in results.items():
        if name != "planner":
            assert ours["makespan_s"] <= 1.05 * row["makespan_s"], name


def test_request_count_429s_cut_only_the_calls_budget() -> None:
    """Lesson: a request-count 429 leaves the token budgets alone. (The headers state the
    limit, so the pacer keeps under it; the request limit then drops to a tenth mid-run and the
    bucket runs dry before the next reading. A drop to a fifth no longer draws a 429: the pacer
    mirrors what the provider says remains, a minute deep.)"""
    scenario = parse_scenario(
        parametric(
            provider={
                "rpm": 300,
                "input_tpm": 10**8,
                "headers": "openai",
                "changes": [{"at_s": 200, "rpm": 30}],
            },
            alias_config={"calls_per_s": 9, "tokens_per_s": 50_000},
            instances=100,
        ),
        "s",
    )
    policy, row = simulate_planner(scenario)
    tokens = [b["tokens"] for b in row["budgets"]]
    calls = [b["calls"] for b in row["budgets"]]
    assert min(calls) < 9  # the request budget was cut ...
    assert all(later >= earlier for earlier, later in itertools.pairwise(tokens))
    assert BudgetClass.REQUESTS in policy.state.last_429_at  # a request 429 was seen
    assert BudgetClass.TOKENS not in policy.state.last_429_at


def test_token_429s_cut_only_the_token_budget() -> None:
    """Lesson: a token 429 leaves the request budget alone. The token limit drops to a tenth
    mid-run, and the provider's bucket runs dry before the headers say so (a drop to a quarter
    no longer draws a 429: the pacer mirrors what the provider says remains, a minute deep)."""
    scenario = parse_scenario(
        parametric(
            provider={
                "rpm": 10**6,
                "input_tpm": 120_000,
                "headers": "openai",
                "changes": [{"at_s": 200, "input_tpm": 12_000}],
            },
            alias_config={"calls_per_s": 30, "tokens_per_s": 2_000},
            instances=100,
        ),
        "s",
    )
    policy, row = simulate_planner(scenario)
    calls = [b["calls"] for b in row["budgets"]]
    assert all(later >= earlier for earlier, later in itertools.pairwise(calls))
    assert BudgetClass.TOKENS in policy.state.last_429_at  # a token 429 was seen
    assert BudgetClass.REQUESTS not in policy.state.last_429_at


def test_a_dropped_limit_is_followed_down_and_not_reprobed() -> None:
    """Lesson: a limit that drops below the seed is followed down (no headers: through 429s)
    and the old level is not re-probed every few windows."""
    scenario = parse_scenario(
        parametric(
            provider={
                "rpm": None,
                "input_tpm": 300_000,
                "headers": "none",
                "changes": [{"at_s": 300, "input_tpm": 120_000}],
            },
            alias_config={"calls_per_s": 50, "tokens_per_s": 5_000},
            instances=150,
        ),
        "s",
    )
    policy, row = simulate_planner(scenario)
    memory_s = policy.controller.memory_s
    settled = [b["tokens"] for b in row["budgets"] if 900 < b["t"] <= 900 + memory_s]
    # followed down to about the new 2,000/s (from a 5,000 seed and a 7,500 probe); it may sit
    # a little above: each rare 429 then holds the pacer for a few seconds of refill. Growth
    # may probe again only once the 429's level is forgotten (memory_s after it). With the
    # pacer's 20 s bucket (2 s until the fortieth round) it settles at up to 1.19x, where the
    # 2 s bucket left it at 1.11x with 12 429s in all, not 8
    assert settled and max(settled) <= 2_000 * 1.2
    assert policy.state.seed.tokens_per_s < 5_000  # the seed was re-based
    # not re-probed every few windows: no 429 burst after it settled
    assert row["late_429"] <= 5


def test_unknown_429s_of_a_token_limit_do_not_cut_the_output_budget_to_nothing() -> None:
    """Lesson (no headers: every 429 is of an unknown limit): the token seed is 3x the input
    limit, the output seed is right. Blaming the class used most relative to its budget cuts
    output at each 429 of the token limit, the cut output budget is then the most used, and
    it stays far below the provider's output limit: the run becomes output-bound. Blaming the
    class whose accepted rate held steady across the 429s cuts the token budget instead."""
    doc = yaml.safe_load((ROOT / "scenarios" / "parametric-seed-high-no-headers.yaml").read_text())
    scenario = parse_scenario(doc, "s")
    output_limit_per_s = 400_000 / 60.0

    def run(controller: ControllerConfig) -> tuple[float, dict[str, Any]]:
        """The median output budget after 30 min, and the result row."""
        workload = build_workload(scenario)
        spec, changes = limit_spec(scenario)
        provider = ProviderLimits(spec, changes)
        policy = PlannerPolicy(
            scenario,
            workload,
            lambda now: headers_now("none", provider, now),
            controller=controller,
        )
        seen: list[float] = []
        tick = policy.tick

        def recording_tick(fleet: Any) -> int:
            ceiling = tick(fleet)
            if fleet.now > 1800.0:
                seen.append(policy.state.budgets.output_tokens_per_s or 0.0)
            return ceiling

        policy.tick = recording_tick  # type: ignore[method-assign]
        stats = Simulation(workload, policy, provider, "none").run()
        return statistics.median(seen), summarise(
            stats, scenario, workload, lower_bound(scenario, workload)
        )

    steady_output, steady_row = run(ControllerConfig())
    naive_output, naive_row = run(ControllerConfig(blame_samples=0))
    assert steady_output >= 0.5 * output_limit_per_s, steady_output
    assert naive_output < 0.3 * output_limit_per_s, naive_output  # the naive blame starves it
    # the naive run is output-bound, where the pacer's task-age order recovers part of its
    # loss: 6,653 s vs 7,323 s (9%) before that order, 6,683 s vs 7,005 s (4.6%) with it,
    # 6,631 s vs 7,021 s (5.6%) with the launch ramp from 100 (from 50 the ramp's first cohort
    # met the first 429s at a level the share rule blamed rightly: no loop in this file);
    # 6,641 s vs 6,832 s (2.8%) since a re-base up comes once the acceptance proves the seed
    # (the naive run's starved output budget climbs back sooner); 6,667 s vs 6,790 s (1.8%)
    # since the sizing keeps tasks within the instance timeout (both fleets are smaller)
    assert steady_row["makespan_s"] < 0.99 * naive_row["makespan_s"]
    assert steady_row["ratio"] <= 1.2


def test_a_429_that_states_a_lower_limit_caps_the_budget_at_once() -> None:
    """An OpenAI-style limit drop: the first 429 after it carries the new limit in its headers,
    and the pacer's budget comes under it there and then (``planner.provisional_cut``, as the
    gateway's pacer does), not a blind cut left above the new limit until the planner's next
    tick while the pacer keeps sending into the provider's emptier bucket."""
    scenario = parse_scenario(
        parametric(
            provider={
                "rpm": None,
                "input_tpm": None,
                "tpm": 600_000,
                "headers": "openai",
                "changes": [{"at_s": 391, "tpm": 60_000}],
            },
            alias_config={"calls_per_s": 50, "tokens_per_s": 10_000},
            instances=150,
        ),
        "s",
    )
    _, row = simulate_planner(scenario)
    after_drop = [budget for t, budget in row["after_429"] if t >= 391]
    assert after_drop, "the drop drew no 429 to act on"
    assert after_drop[0] <= 60_000 / 60 * 1.0001
    assert row["rate_429"] < 0.005


def test_a_raise_of_a_limit_only_429s_state_is_found_within_the_429_memory() -> None:
    """OpenAI states its output-token limit only in a 429's message. A re-probe that finds the
    same limit again (here at about 1,400 s) must not hold the budget under it for a doubled
    memory, nor re-base the seed below it: the provider doubles the limit at 1,600 s, and the
    budget is above the old limit within the 429 memory after the re-probe (wide-721 of
    sim.generate_wide held it at the old limit for 40 minutes, at 0.75x for longer)."""
    old_limit, raise_at = 100.0, 1600.0  # output tokens per second
    scenario = parse_scenario(
        parametric(
            instances=150,
            provider={
                "rpm": 600,
                "input_tpm": None,
                "tpm": 6_000_000,
                "output_tpm": old_limit * 60,
                "headers": "openai",
                "changes": [{"at_s": raise_at, "output_tpm": 2 * old_limit * 60}],
            },
            alias_config={"calls_per_s": 8, "tokens_per_s": 50_000},
        ),
        "s",
    )
    policy, row = simulate_planner(scenario)
    output = [
        (d.now, d.budgets["output_tokens_per_s"])
        for d in policy.decisions
        if "output_tokens_per_s" in d.budgets
    ]
    assert output, "no 429 stated the output limit"
    found = next((t for t, b in output if t > raise_at and b > 1.2 * old_limit), None)
    assert found is not None and found <= raise_at + ControllerConfig().memory_s + 600.0
    assert row["rate_429"] < 0.005


def test_booting_blind_planner_overshoots() -> None:
    """Lesson: a planner that cannot see booting tasks launches far more than it should."""
    # enough instances that an overshoot is not hidden by the run's size (the planner that
    # sees booting tasks peaks near 200)
    doc = parametric(instances=600)
    doc["harness"]["boot_s"] = {"min": 150, "max": 240}
    scenario = parse_scenario(doc, "s")
    _, seeing = simulate_planner(scenario)

    class Blind(PlannerPolicy):
        def tick(self, fleet: FleetView) -> int:
            blind = type(fleet)(now=fleet.now, ages=fleet.ages, booting=0, queued=fleet.queued)
            # it sizes as if nothing were booting, then launches on top of what boots
            return super().tick(blind) + fleet.booting

    workload = build_workload(scenario)
    provider = ProviderLimits(*limit_spec(scenario))
    blind = Blind(scenario, workload, lambda now: headers_now("anthropic", provider, now))
    stats = Simulation(workload, blind, provider, "anthropic").run()
    assert stats.peak_fleet > 1.5 * seeing["peak_fleet"]
