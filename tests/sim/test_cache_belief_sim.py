"""The cache-counting belief in the simulator: a wrong belief is corrected, either way, and a
right one is never flipped, however long its calls are in flight."""

from __future__ import annotations

import pytest

from planner.budgets import BudgetClass
from planner.drain import drained_rate
from sim.generate_wide import wide_scenario
from sim.planner_policy import PlannerPolicy
from sim.scenario import Latency, Scenario, parse_scenario
from sim.workload import build_workload
from tests.sim.sim_support import parametric, simulate_planner


def _belief_scenario(provider_counts: bool, believed: bool) -> Scenario:
    return parse_scenario(
        parametric(
            provider={
                "rpm": 10**6,
                # binding for a run of ~4x the longest instance, whichever way it counts
                "input_tpm": 1_500_000 if provider_counts else 300_000,
                "headers": "anthropic",
                "cached_input_counts": provider_counts,
            },
            harness={"parametric": {**parametric()["harness"]["parametric"], "cached_share": 0.8}},
            alias_config={
                "calls_per_s": 30,
                "tokens_per_s": 25_000 if believed else 5_000,
                "cached_input_counts": believed,
            },
            instances=150,
        ),
        "s",
    )


def test_a_wrong_belief_that_cache_reads_count_is_corrected() -> None:
    """Lesson: cached tokens counted or not. The operator believes the provider counts cache
    reads and it does not: a pacer that charges them runs at a fifth of the limit, with no 429
    to say so. The provider's remaining-tokens headers do say so."""
    policy, row = simulate_planner(_belief_scenario(provider_counts=False, believed=True))
    assert [counts for _, counts in policy.recounted] == [False]
    assert policy.recounted[0][0] < 600
    assert not policy.pacer.cached_input_counts and not policy.counting.cached_input_counts
    assert row["ratio"] <= 1.2 and row["rate_429"] <= 0.005


def test_a_wrong_belief_that_cache_reads_do_not_count_is_corrected() -> None:
    """The other way: the provider counts cache reads, the pacer does not, and each call costs
    the provider five times what the pacer charged. The drained bucket says so; after the flip
    the pacer keeps under the limit."""
    policy, row = simulate_planner(_belief_scenario(provider_counts=True, believed=False))
    assert [counts for _, counts in policy.recounted] == [True]
    assert policy.recounted[0][0] < 600
    assert policy.pacer.cached_input_counts
    # the first minute's 429s drained the bucket and are the evidence; a pacer that kept its
    # belief drew 429s on three calls in four
    assert row["ratio"] <= 1.2 and row["rate_429"] <= 0.1 and row["late_429"] == 0


def test_after_a_flip_the_drained_token_rate_reads_the_new_units() -> None:
    """The blame of a 429 that names no limit reads how fast each bucket was drained, tokens
    counted as believed. The planner tick reads the ledger's calls in the units of the
    moment; so does the simulated gateway: after a flip, the calls answered before it are
    counted the new way, not as the pacer charged them then."""
    scenario = _belief_scenario(provider_counts=False, believed=True)
    workload = build_workload(scenario)
    policy = PlannerPolicy(scenario, workload, lambda now: None)
    calls = range(40)
    for call in calls:
        policy.on_response(float(call), call, None)
    now = float(len(calls))
    uncached = [
        (float(c), float(workload.input[c] - workload.cached[c])) for c in calls
    ]  # answered at once: requested when answered
    with_cache = [(float(c), float(workload.input[c])) for c in calls]
    assert policy._drained(now)[BudgetClass.TOKENS] == pytest.approx(drained_rate(with_cache, now))
    policy._recount(False, now)
    assert policy._drained(now)[BudgetClass.TOKENS] == pytest.approx(drained_rate(uncached, now))
    assert drained_rate(uncached, now) < 0.5 * drained_rate(with_cache, now)


def test_a_wrong_belief_hidden_by_a_full_bucket_is_corrected_by_its_dips() -> None:
    """wide-1928 of sim.generate_wide: believed counted, 83% of the input cache reads that the
    provider does not count. The pacer sends at the stated limit in counted units, the
    provider's bucket stays 97-100% full, every span loses refill at both ends and what it sent
    is within its bound: the run went at a third of the provider's speed (ratio 3.37) with no
    429 to correct it. A call of 8% of the bucket sent just before a reading that finds it 97%
    full says the provider did not charge its cache reads."""
    from sim.generate_wide import wide_scenario

    scenario = wide_scenario(1928)
    assert scenario.alias_config.cached_input_counts and not scenario.provider.cached_input_counts
    policy, row = simulate_planner(scenario)
    assert [counts for _, counts in policy.recounted] == [False]
    assert policy.recounted[0][0] < 1_800
    assert row["ratio"] <= 1.2 and row["rate_429"] <= 0.005


@pytest.mark.parametrize("counts", [True, False])
def test_a_right_belief_is_never_flipped(counts: bool) -> None:
    policy, row = simulate_planner(_belief_scenario(provider_counts=counts, believed=counts))
    assert policy.recounted == []
    assert row["ratio"] <= 1.2 and row["rate_429"] <= 0.005


LATENCY_BASE_S = 20.0  # calls of 20-30 s: under the old 15 s lag most of a span was missed


@pytest.mark.parametrize("counts", [True, False])
def test_calls_still_in_flight_never_flip_a_right_belief(counts: bool) -> None:
    """Calls of 30-40 s: a span of sent calls closed a fixed 15 s after its end misses the
    calls still in flight, the provider seems to have charged more than was sent, and "cache
    reads count" (wide-62 of sim.generate_wide ran at half speed so). The span waits for the
    longest recent latency."""
    scenario = _belief_scenario(provider_counts=counts, believed=counts)
    assert scenario.harness.parametric is not None
    slow = scenario.harness.model_copy(
        update={
            "latency_s": Latency(base=LATENCY_BASE_S, per_output_token=0.01),
            "parametric": scenario.harness.parametric.model_copy(update={"cached_share": 0.5}),
        }
    )
    policy, row = simulate_planner(scenario.model_copy(update={"harness": slow}))
    assert policy.recounted == []
    assert row["rate_429"] <= 0.005


def test_the_gateways_verdict_paces_at_once_and_the_planner_adopts_it_at_its_tick() -> None:
    """As in production: at a token 429 whose span shows cache reads counted against a belief
    that they are not, the gateway's pacer counts them from that 429 on, and the planner
    (budgets, sizing) adopts the verdict at its next tick, not there and then (wide-53 of
    ``sim.generate_wide``: Anthropic headers, the provider counts cache reads, the operator
    believes not)."""
    from sim.bench import make_policy
    from sim.engine import Simulation
    from sim.generate_wide import wide_scenario
    from sim.limits import ProviderLimits
    from sim.metrics import limit_spec

    scenario = wide_scenario(53)
    assert scenario.provider.cached_input_counts and not scenario.alias_config.cached_input_counts
    workload = build_workload(scenario)
    spec, changes = limit_spec(scenario)
    provider = ProviderLimits(spec, changes)
    policy = make_policy("planner", scenario, workload, provider)
    assert isinstance(policy, PlannerPolicy)
    pacer_at: list[tuple[float, bool]] = []  # (when the pacer flipped, the planner's belief)
    planner_at: list[float] = []
    on_response, tick = policy.on_response, policy.tick

    def recording_response(now: float, call: int, classification: object) -> None:
        on_response(now, call, classification)  # type: ignore[arg-type]
        if policy.pacer.cached_input_counts and not pacer_at:
            pacer_at.append((now, policy.counting.cached_input_counts))

    def recording_tick(fleet: object) -> int:
        ceiling = tick(fleet)  # type: ignore[arg-type]
        if policy.counting.cached_input_counts and not planner_at:
            planner_at.append(fleet.now)  # type: ignore[attr-defined]
        return ceiling

    policy.on_response = recording_response  # type: ignore[method-assign]
    policy.tick = recording_tick  # type: ignore[method-assign]
    Simulation(workload, policy, provider, scenario.provider.headers).run()
    assert pacer_at and planner_at, (pacer_at, planner_at)
    (flipped, believed_then), (adopted,) = pacer_at[0], planner_at
    assert not believed_then  # the pacer first, on the gateway's word
    assert flipped < adopted <= flipped + 15.0  # the planner at its next tick


def test_cache_reads_of_a_tenth_of_the_base_are_found_to_count_at_a_stated_limit() -> None:
    """``wide-3791`` (OpenAI headers): 9% of the input is cached and the provider counts it,
    the operator believes not, and the stated input limit drops to 0.57x at 974 s. Paced at
    the stated limit in uncounted units, every call was a tenth over what the pacer charged,
    and each time the provider's bucket ran down a 429 cut the budget and it grew back: 28
    429s, rate 0.0062. The remaining-tokens headers say the cache reads were charged."""
    policy, row = simulate_planner(wide_scenario(3791))
    assert [counts for _, counts in policy.recounted] == [True]
    assert policy.recounted[0][0] < 974  # before the drop
    assert row["rate_429"] <= 0.001 and row["ratio"] <= 1.2
