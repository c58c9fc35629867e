"""Helpers shared by the budget controller's tests: the seed, a fresh state, one window and a
run of clean windows. Import with ``from tests.budget_support import ...``."""

from __future__ import annotations

from planner.budgets import (
    BudgetClass,
    Budgets,
    BudgetState,
    ControllerActions,
    ControllerConfig,
    WindowObservation,
    initial_state,
    step,
)
from planner.classify import LimitType

CFG = ControllerConfig()
SEED = Budgets(calls_per_s=50.0, tokens_per_s=25_000.0, output_tokens_per_s=5_000.0,
               inflight_tokens=2_000_000.0)  # fmt: skip


def fresh(now: float = 0.0, **kw: object) -> BudgetState:
    """A state seeded from ``SEED`` at ``now`` (an input token class, cache reads not counted)."""
    return initial_state(
        SEED,
        now,
        cached_input_counts=False,
        token_class="input",
        **kw,  # type: ignore[arg-type]
    )


def window(
    state: BudgetState, now: float, *throttles: LimitType, **kw: object
) -> tuple[BudgetState, ControllerActions]:
    """One window ending at ``now`` with these 429s (no retry-after) and observation fields."""
    obs = WindowObservation(now=now, throttles=tuple((t, None) for t in throttles), **kw)  # type: ignore[arg-type]
    return step(state, obs, CFG)


def clean_until(s: BudgetState, t: float, until: float) -> tuple[BudgetState, float]:
    """Clean windows of 15 s from ``t`` until ``until``: the state and the time then."""
    while t < until:
        t += 15.0
        s, _ = window(s, t)
    return s, t


TOK, REQ, OUT = BudgetClass.TOKENS, BudgetClass.REQUESTS, BudgetClass.OUTPUT_TOKENS
