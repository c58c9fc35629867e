"""The planner on scenarios it was not tuned on: random scenarios of the public format, and the
issue's own example scenario.

``sim.generate.random_scenario`` draws the harness (trace or parametric), header style
(anthropic, openai, none), split or combined token limits, cache reads counted or not, a
binding token, output-token or request limit, sometimes a limit drop, a stale or off seed
(0.6-1.4x), caps, 200-500 instances — with the lower bound >= 3.5x the longest instance (not tail-bound). Every
default policy runs (planner, aimd, fixed:N*/2, N*, 2N*) and the issue's targets are checked:
planner ratio <= 1.20, rate_429 <= 0.005, and against each baseline B: makespan <= 1.05x B's,
and wherever it is not >= 5% faster, at most a tenth of B's 429s or at most 0.1% of its calls.

Seeds 0-15, 212 (fresh in the sixteenth round, a miss of the fifteenth round's code: 11 429s
where 8.5 were allowed) and 290 (fresh in the seventeenth, a miss of the sixteenth round's
code: 1.09x ``fixed:34``, an outsized call's retried 429s each cutting every budget), 401, 413
and 515 (fresh in the eighteenth, misses of the code before it: 13, 10 and 27 429s where 10,
8.4 and 22.6 were allowed, re-probes of unchanged limits taken for raised ones;
docs/bench-planner.md): every one meets every target. A seed
that missed one would be marked xfail(strict) with the reason, documenting a known weakness
(docs/bench-planner.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.classify import LimitType
from sim.bench import run_scenario
from sim.generate import random_scenario
from sim.metrics import lower_bound
from sim.scenario import load_scenario
from sim.targets import violations as _violations
from sim.workload import build_workload

pytestmark = pytest.mark.slow

SEEDS = [*range(16), 212, 290, 401, 413, 515]
ROOT = Path(__file__).resolve().parents[2]


def test_generated_scenarios_are_limit_bound_and_varied() -> None:
    scenarios = [random_scenario(s) for s in range(16)]
    styles = {s.provider.headers for s in scenarios}
    assert styles == {"anthropic", "openai", "none"}
    assert {s.harness.trace is None for s in scenarios} == {True, False}
    assert {s.provider.tpm is None for s in scenarios} == {True, False}
    assert random_scenario(3) == random_scenario(3)
    binding = set()
    for sc in scenarios:
        assert 200 <= sc.instances <= 500
        w = build_workload(sc)
        bound = lower_bound(sc, w)
        assert bound.seconds >= 3.0 * float(w.durations().max()), sc.name
        binding.add(bound.binding_class)
    # every kind of limit binds somewhere: requests, output tokens, input or combined tokens
    assert binding >= {LimitType.REQUESTS, LimitType.OUTPUT_TOKENS}
    assert binding & {LimitType.TOKENS, LimitType.INPUT_TOKENS}


@pytest.mark.parametrize("seed", SEEDS)
def test_planner_meets_the_targets_on_a_random_scenario(seed: int) -> None:
    scenario = random_scenario(seed)
    result = run_scenario(scenario)
    assert set(result.results) >= {"planner", "aimd"}
    assert _violations(result.results) == [], (scenario.description, result.results)


def test_planner_meets_the_targets_on_the_issues_example_scenario() -> None:
    """The example scenario of the issue that specified the benchmark, as written there: a
    parametric harness, Anthropic headers, the input limit halved at 30 minutes."""
    scenario = load_scenario(ROOT / "scenarios" / "outside" / "issue-example.yaml")
    assert scenario.provider.changes and scenario.provider.headers == "anthropic"
    result = run_scenario(scenario)
    assert _violations(result.results) == [], result.results


def test_the_check_catches_a_slow_or_noisy_planner() -> None:
    row = {"makespan_s": 1000.0, "ratio": 1.1, "rate_429": 0.0, "http_429": 0, "calls": 10_000}
    fixed = {"makespan_s": 900.0, "ratio": 1.0, "rate_429": 0.5, "http_429": 5000, "calls": 10_000}
    assert _violations({"planner": row, "fixed:9": fixed})  # > 1.05x slower
    close = {**fixed, "makespan_s": 990.0, "http_429": 50}
    noisy = {**row, "http_429": 20, "rate_429": 0.002}
    assert _violations({"planner": noisy, "fixed:9": close})  # not 5% faster, 20 > 10 429s
    assert _violations({"planner": row, "fixed:9": close}) == []
    assert _violations({"planner": {**row, "ratio": 1.3}}) == ["planner ratio 1.3 > 1.20"]
