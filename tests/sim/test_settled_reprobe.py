"""A limit raised mid-run with no header to say so is found at a re-probe once the calls then in
flight are answered (``planner.settled_drain``), in the simulator. wide-2879: the input-token
limit rises from 5,773 to 7,860 tokens/s at 2,257 s; the tick read the re-probes' drained rates
at 0.81-0.90 of the new limit (the calls in flight missing), took each for the old limit, and
held the budget at 0.85 of the new one for the rest of the run, its memory doubling (ratio
1.21). Settled, the first re-probe after the raise reads it."""

from __future__ import annotations

from planner.budgets import BudgetClass
from sim.generate_wide import wide_scenario
from sim.planner_policy import PlannerPolicy
from tests.sim.sim_support import planner_and_run

RAISED_AT_S = 2257.0
RAISED_PER_S = 471_601 / 60.0


def _record_growth_caps_after_the_raise(policy: PlannerPolicy) -> list[float]:
    """The token budget's cap for its 429 memory at each tick after the raise, filled in as the
    policy runs (its tick wrapped)."""
    caps: list[float] = []
    tick = policy.tick

    def recording(fleet):  # type: ignore[no-untyped-def]
        ceiling = tick(fleet)
        cap = policy.state.level_cap(BudgetClass.TOKENS, fleet.now, policy.controller)
        if fleet.now > RAISED_AT_S and cap is not None:
            caps.append(cap)
        return ceiling

    policy.tick = recording  # type: ignore[method-assign]
    return caps


def test_a_raised_limit_is_found_at_the_first_reprobe_after_it() -> None:
    scenario = wide_scenario(2879)
    assert scenario.provider.headers == "none"
    assert [c.input_tpm for c in scenario.provider.changes] == [471_601]
    policy, run = planner_and_run(scenario)
    caps = _record_growth_caps_after_the_raise(policy)
    row = run()
    assert max(caps) >= 0.95 * RAISED_PER_S
    assert row["ratio"] <= 1.2
