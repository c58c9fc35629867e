"""Running a scenario under several policies and collecting the results table.

Owns the choice of default policies (``planner``, ``aimd`` and three ``fixed:N`` around the
concurrency N* that would, unthrottled, meet the binding provider limit on average: N*/2, N*,
2N*, within the caps), building each policy, and one result row per policy. Every policy runs
against a fresh provider with the same workload (same seed), so the rows are comparable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from evalfleet.errors import ConfigError
from planner.classify import LimitType
from sim.engine import Policy, Simulation
from sim.forecast import launched_by_forecast
from sim.limits import ProviderLimits
from sim.metrics import (
    LowerBound,
    calls_that_never_fit,
    class_totals,
    limit_spec,
    lower_bound,
    summarise,
)
from sim.policies import AimdPolicy, FixedPolicy
from sim.reveal import headers_now
from sim.scenario import Scenario, check_policy
from sim.workload import Workload, build_workload


def saturating_workers(scenario: Scenario, workload: Workload) -> float:
    """N*: the concurrency whose unthrottled demand meets the binding provider limit."""
    spec, changes = limit_spec(scenario)
    totals = class_totals(scenario, workload)
    from sim.limits import time_to_serve

    longest = max(
        (
            time_to_serve(spec, changes, c, totals[c])
            for c in LimitType
            if c in totals and spec.limit(c) is not None
        ),
        default=0.0,
    )
    work = float(workload.durations().sum())
    if longest <= 0:
        return float(scenario.instances)
    return max(1.0, work / longest)


def default_policies(scenario: Scenario, workload: Workload) -> list[str]:
    """The scenario's ``policies``, or planner, aimd and fixed:N at N*/2, N*, 2N*."""
    if scenario.policies is not None:
        return list(scenario.policies)
    star = saturating_workers(scenario, workload)
    cap = scenario.caps.binding
    top = min(cap, scenario.instances) if cap is not None else scenario.instances
    sizes = sorted({max(1, min(top, round(star * f))) for f in (0.5, 1.0, 2.0)})
    return ["planner", "aimd", *[f"fixed:{n}" for n in sizes]]


def make_policy(
    name: str, scenario: Scenario, workload: Workload, provider: ProviderLimits
) -> Policy:
    """Build a policy from its name (planner, aimd, fixed:N)."""
    check_policy(name)
    cap = scenario.caps.binding
    if name == "aimd":
        return AimdPolicy(cap)
    if name.startswith("fixed:"):
        return FixedPolicy(int(name.split(":", 1)[1]), cap)
    from sim.planner_policy import PlannerPolicy

    style = scenario.provider.headers
    return PlannerPolicy(scenario, workload, lambda now: headers_now(style, provider, now))


@dataclass(frozen=True)
class ScenarioResult:
    """Rows of one scenario (policy -> columns) and the seconds the simulations took."""

    scenario: str
    results: dict[str, dict[str, Any]]
    bound: LowerBound
    sim_seconds: float
    cpu_seconds: float

    def as_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "results": self.results}


def run_policy(
    scenario: Scenario, workload: Workload, name: str, bound: LowerBound
) -> dict[str, Any]:
    """Simulate one policy on a fresh provider; the result columns."""
    spec, changes = limit_spec(scenario)
    provider = ProviderLimits(spec, changes)
    policy = make_policy(name, scenario, workload, provider)
    stats = Simulation(workload, policy, provider, scenario.provider.headers).run()
    return summarise(stats, scenario, workload, bound)


def run_scenario(
    scenario: Scenario, policies: list[str] | None = None, forecast_noise: float | None = None
) -> ScenarioResult:
    """Run every policy (default: ``default_policies``) on the scenario; ConfigError if a
    call of its workload can never fit a provider limit (every policy would stall). With
    ``forecast_noise``, every policy launches the instances as ``launch_order: short_last``
    (``sim.forecast``) instead of in the workload's order."""
    workload = build_workload(scenario)
    if forecast_noise is not None:
        workload = launched_by_forecast(workload, forecast_noise, scenario.seed)
    never = calls_that_never_fit(scenario, workload)
    if never:
        raise ConfigError(f"scenario {scenario.name}", never)
    bound = lower_bound(scenario, workload)
    names = policies if policies else default_policies(scenario, workload)
    started = time.perf_counter()
    cpu_started = time.process_time()
    results = {name: run_policy(scenario, workload, name, bound) for name in dict.fromkeys(names)}
    return ScenarioResult(
        scenario=scenario.name,
        results=results,
        bound=bound,
        sim_seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - cpu_started,
    )
