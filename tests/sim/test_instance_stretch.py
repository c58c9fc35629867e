"""The per-instance columns: how far a policy stretches single instances, and how many it takes
past the scenario's instance timeout (what production lands as ``error``)."""

from __future__ import annotations

import pytest

from sim.bench import run_policy, saturating_workers
from sim.engine import Simulation
from sim.limits import ProviderLimits
from sim.metrics import limit_spec, lower_bound, summarise
from sim.planner_policy import PlannerPolicy
from sim.reveal import headers_now
from sim.scenario import load_scenario, parse_scenario
from sim.workload import build_workload
from tests.sim.sim_support import ROOT, parametric


def test_an_unthrottled_fleet_stretches_nothing_and_times_nothing_out() -> None:
    scenario = parse_scenario(
        parametric(provider={"rpm": 10**7, "input_tpm": 10**9}, instances=30), "s"
    )
    workload = build_workload(scenario)
    stages = workload.durations() - workload.boot
    tight = scenario.model_copy(update={"instance_timeout_s": float(stages.max())})
    row = run_policy(tight, workload, "fixed:30", lower_bound(tight, workload))
    assert row["http_429"] == 0
    assert row["stretch_max"] == pytest.approx(1.0, abs=1e-6)
    assert row["timeouts"] == 0


def test_instances_held_past_the_timeout_are_counted_only_if_they_fit_unthrottled() -> None:
    scenario = parse_scenario(parametric(instances=150), "s")
    workload = build_workload(scenario)
    bound = lower_bound(scenario, workload)
    crowded = f"fixed:{round(2 * saturating_workers(scenario, workload))}"
    loose = scenario.model_copy(update={"instance_timeout_s": 604_800.0})
    row = run_policy(loose, workload, crowded, bound)
    assert row["http_429"] > 0 and row["stretch_max"] > 1.5
    assert row["timeouts"] == 0
    stages = workload.durations() - workload.boot
    # a timeout every instance fits in unthrottled, but under the most stretched one's stage
    timeout = float(stages.max())
    tight = scenario.model_copy(update={"instance_timeout_s": timeout})
    counted = run_policy(tight, workload, crowded, bound)
    assert counted["timeouts"] > 0
    # the timeout is counted, not enforced: the run itself is the same
    assert {k: v for k, v in counted.items() if k != "timeouts"} == {
        k: v for k, v in row.items() if k != "timeouts"
    }
    # below every instance's unthrottled stage nothing is the policy's doing
    short = scenario.model_copy(update={"instance_timeout_s": float(stages.min()) * 0.99})
    assert run_policy(short, workload, crowded, bound)["timeouts"] == 0


def test_the_timeout_is_checked_like_every_scenario_field() -> None:
    from evalfleet.errors import ConfigError

    with pytest.raises(ConfigError, match="instance_timeout_s"):
        parse_scenario(parametric(instance_timeout_s=0), "s")
    assert parse_scenario(parametric(), "s").instance_timeout_s == 3600.0


def test_tasks_near_their_timeout_first_at_the_pacer_take_fewer_past_it() -> None:
    """Under a token limit the pacer serves small prompts first, and a task whose context has
    grown waits at each call: some run past the timeout. With an urgent share, calls of tasks
    that have run that share of it go first, and fewer do."""
    scenario = load_scenario(ROOT / "scenarios" / "trace-cached-counted.yaml")
    workload = build_workload(scenario)
    bound = lower_bound(scenario, workload)

    def timeouts(urgent_share: float | None) -> int:
        spec, changes = limit_spec(scenario)
        provider = ProviderLimits(spec, changes)
        style = scenario.provider.headers
        policy = PlannerPolicy(
            scenario,
            workload,
            lambda now: headers_now(style, provider, now),
            urgent_share=urgent_share,
        )
        stats = Simulation(workload, policy, provider, style).run()
        return int(summarise(stats, scenario, workload, bound)["timeouts"])

    held_past = timeouts(None)
    assert held_past > 0
    assert timeouts(0.75) < held_past
