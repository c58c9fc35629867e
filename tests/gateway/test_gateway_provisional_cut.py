"""A call's first 429 cuts the pacer's budget of the limit it names at once, before the
planner's next tick (``planner.provisional_cut``); the planner's next budgets end the cut
where they move its class. (That a retry's 429 cuts nothing more is the simulator's and
``tests/test_provisional_cut.py``'s to show: here the pacer, cut, spaces the retries out.)"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from gateway.pacer_local import InProcessPacer
from gateway.provider_sim.profile import DEFAULT_PROFILE
from planner.budgets import BudgetClass
from planner.provisional_cut import CUT
from tests.gateway.gw_helpers import Stack, fast_aliases, sim_profile

BODY = {"model": "sim-openai", "messages": [{"role": "user", "content": "hi"}]}


def test_a_first_429_cuts_its_class_at_once_until_the_planner_moves_it(
    make_stack: Callable[..., Stack],
) -> None:
    """The provider takes 20 requests a minute; the pacer's seed is 5 calls/s. Calls go out
    until one draws a 429. It states the limit (20 a minute), which caps the request budget,
    and the cut goes from there: 20/60 x CUT. The token budget, far above the stated token limit,
    comes down to it and is not cut: the 429 is not the token limit's."""
    openai = {**DEFAULT_PROFILE["openai"], "rpm": 20.0}
    stack = make_stack(
        profile=sim_profile(openai=openai),
        aliases=lambda url: fast_aliases(url, calls_per_s=5.0),
    )
    secret = stack.new_run().gateway_key.get_secret_value()
    pacer = stack.gateway.pacer
    assert isinstance(pacer, InProcessPacer)  # make_stack's default
    seed = pacer.budgets("sim-openai")
    statuses = []
    for _ in range(40):
        r = httpx.post(
            stack.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {secret}"},
            json=BODY,
            timeout=15,
        )
        statuses.append(r.status_code)
        if pacer.budgets("sim-openai") != seed:
            break
    now = pacer.budgets("sim-openai")
    assert now.calls_per_s == pytest.approx(20.0 / 60.0 * CUT), statuses
    assert now.tokens_per_s == pytest.approx(openai["tpm"] / 60.0)
    assert 15 <= len(statuses) <= 40, statuses
    # the planner's push that does not move the request budget keeps the cut; one that does
    # ends it
    pacer.set_budgets("sim-openai", seed)
    assert pacer.budgets("sim-openai").calls_per_s == pytest.approx(20.0 / 60.0 * CUT)
    pacer.set_budgets("sim-openai", seed.with_value(BudgetClass.REQUESTS, 2.0))
    assert pacer.budgets("sim-openai").calls_per_s == 2.0
