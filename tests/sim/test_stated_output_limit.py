"""An output limit that only a 429's message states (OpenAI) is used in full once stated, not
held 5% under it for the 429's memory (``planner.budget_state.BudgetState.level_cap``)."""

from __future__ import annotations

import pytest

from planner.budgets import BudgetClass
from sim.generate_wide import wide_scenario
from tests.sim.sim_support import planner_run


def test_an_output_limit_a_429_stated_is_used_in_full() -> None:
    """wide-2574: OpenAI headers state requests and tokens, never the output limit; the alias
    has no output budget, so the first 429 (at 64 s) was drawn unpaced and states the limit,
    3,309 tokens/s. Remembered at that limit, it held the output budget at 0.95x it for the
    rest of this 12-minute run, and a fixed fleet that stormed the limit (11,609 429s)
    finished 7% sooner (714 s against 665 s)."""
    scenario = wide_scenario(2574)
    assert (
        scenario.provider.headers == "openai" and scenario.alias_config.output_tokens_per_s is None
    )
    assert scenario.provider.output_tpm is not None
    stated = scenario.provider.output_tpm / 60.0
    policy, row = planner_run(scenario)
    assert policy.state.hard_caps[BudgetClass.OUTPUT_TOKENS] == pytest.approx(stated)
    assert policy.state.budgets.output_tokens_per_s == pytest.approx(stated)
    assert row["http_429"] <= 2
    assert row["makespan_s"] <= 700.0  # 714 s held 5% under the limit; the storm's 665 s x 1.05
