"""Helpers shared by the simulator's tests: the project root, a small parametric scenario
document to vary, and the planner's run (its policy and result row) under a given
controller. Import with ``from tests.sim.sim_support import ...``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.budgets import ControllerConfig
from sim.engine import Simulation
from sim.limits import ProviderLimits
from sim.metrics import limit_spec, lower_bound, summarise
from sim.planner_policy import PlannerPolicy
from sim.reveal import headers_now
from sim.scenario import Scenario
from sim.workload import build_workload

ROOT = Path(__file__).resolve().parents[2]


def planner_run(
    scenario: Scenario, controller: ControllerConfig | None = None
) -> tuple[PlannerPolicy, dict[str, Any]]:
    """The planner policy after a run on ``scenario`` (its decisions, recounts, state), with
    ``controller`` (default: the shipped), and its result row."""
    workload = build_workload(scenario)
    spec, changes = limit_spec(scenario)
    provider = ProviderLimits(spec, changes)
    style = scenario.provider.headers
    policy = PlannerPolicy(
        scenario, workload, lambda now: headers_now(style, provider, now), controller=controller
    )
    stats = Simulation(workload, policy, provider, style).run()
    return policy, summarise(stats, scenario, lower_bound(scenario, workload))


def planner_row(scenario: Scenario, controller: ControllerConfig | None = None) -> dict[str, Any]:
    """The planner's result row on ``scenario``, with ``controller`` (default: the shipped)."""
    return planner_run(scenario, controller)[1]


def parametric(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "t",
        "seed": 3,
        "instances": 80,
        "harness": {
            "parametric": {
                "calls": {"median": 20, "p90": 30},
                "first_input_tokens": 3000,
                "input_growth_per_call": 300,
                "output_tokens": {"median": 150, "p90": 400},
                "cached_share": 0.6,
                "gap_s": {"median": 3, "p90": 8},
            },
            "boot_s": {"min": 10, "max": 30},
        },
        "provider": {"rpm": 600, "input_tpm": 600_000, "headers": "anthropic"},
        "alias_config": {"calls_per_s": 8, "tokens_per_s": 8000, "inflight_tokens": 2e6},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return doc
