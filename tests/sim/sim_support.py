"""Helpers shared by the simulator's tests: the project root, a small parametric scenario
document to vary, the planner's run (its policy and result row) under a given controller, or
with its budgets recorded (``simulate_planner``), and the ``evalfleet`` command run in-process
(``run_cli``), and a result row as ``bench planner --json`` prints one (``result_row``). Import with ``from tests.sim.sim_support import ...``."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
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


def run_cli(args: list[str]) -> tuple[int, str]:
    """``evalfleet ARGS`` in this process: its exit code, and its stdout then its stderr."""
    from evalfleet.cli import main

    out = io.StringIO()
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue() + err.getvalue()


def planner_and_run(
    scenario: Scenario, controller: ControllerConfig | None = None
) -> tuple[PlannerPolicy, Callable[[], dict[str, Any]]]:
    """The planner policy for a run on ``scenario`` with ``controller`` (default: the
    shipped), and the call that runs it on a fresh provider and returns its result row (a
    test that records wraps the policy's methods before that call)."""
    workload = build_workload(scenario)
    spec, changes = limit_spec(scenario)
    provider = ProviderLimits(spec, changes)
    style = scenario.provider.headers
    policy = PlannerPolicy(
        scenario, workload, lambda now: headers_now(style, provider, now), controller=controller
    )

    def run() -> dict[str, Any]:
        stats = Simulation(workload, policy, provider, style).run()
        return summarise(stats, scenario, workload, lower_bound(scenario, workload))

    return policy, run


def planner_run(
    scenario: Scenario, controller: ControllerConfig | None = None
) -> tuple[PlannerPolicy, dict[str, Any]]:
    """The planner policy after a run on ``scenario`` (its decisions, recounts, state), with
    ``controller`` (default: the shipped), and its result row."""
    policy, run = planner_and_run(scenario, controller)
    return policy, run()


def simulate_planner(scenario: Scenario) -> tuple[PlannerPolicy, dict[str, Any]]:
    """The planner's run on ``scenario`` (the shipped controller), its result row extended
    with what the lesson tests read: ``budgets`` (the calls and token budgets after each
    tick), ``late_429`` (429s after 900 s) and ``after_429`` (the token budget the pacer paces
    at right after each 429: a call's first 429 cuts it at once, ``planner.provisional_cut``)."""
    policy, run = planner_and_run(scenario)
    budgets_seen: list[dict[str, float | None]] = []
    tick = policy.tick
    throttled: list[float] = []
    on_response = policy.on_response

    after_429: list[tuple[float, float]] = []  # (time, pacer's token budget) after each 429

    def recording_response(now: float, call: int, classification: Any) -> None:
        if classification is not None:
            throttled.append(now)
        on_response(now, call, classification)
        if classification is not None:
            after_429.append((now, policy.pacer.budgets.tokens_per_s))

    policy.on_response = recording_response  # type: ignore[method-assign]

    def recording_tick(fleet: Any) -> int:
        ceiling = tick(fleet)
        b = policy.state.budgets
        budgets_seen.append(
            {"t": fleet.now, "calls": b.calls_per_s, "tokens": b.tokens_per_s, "cut": None}
        )
        return ceiling

    policy.tick = recording_tick  # type: ignore[method-assign]
    row = run()
    row["budgets"] = budgets_seen
    row["late_429"] = sum(1 for t in throttled if t > 900)
    row["after_429"] = after_429
    return policy, row


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


def result_row(
    makespan: float | None,
    http_429: int = 0,
    calls: int = 10_000,
    bound: float = 1000.0,
    binding: str | None = "requests",
    timeouts: int = 0,
) -> dict[str, Any]:
    """A policy's row of ``bench planner --json`` with the columns the targets and the tally
    read (``makespan`` None: stalled)."""
    return {
        "makespan_s": makespan,
        "lower_bound_s": bound,
        "ratio": None if makespan is None else round(makespan / bound, 3),
        "calls": calls,
        "http_429": http_429,
        "rate_429": http_429 / calls,
        "binding_limit": binding,
        "timeouts": timeouts,
    }
