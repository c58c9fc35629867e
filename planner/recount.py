"""What a change of the alias's cache-counting belief does to the budget controller's state.

The belief (``BudgetState.cached_input_counts``) says whether cache reads count against the
provider's token limit; the pacer charges every call, and the controller measures every token
budget, cut, 429 level and drained rate, in its units. Two things change it:
``planner.cache_counting`` (the provider's headers state its token bucket, and what it took
from it contradicts the belief) and ``planner.drain_belief`` (without headers, the rates the
token bucket drained at the 429s that name no limit, counted both ways, contradict it).
``recounted`` moves the token seed and budget into the new units and forgets what was measured
in the old ones. Split from ``planner.budgets`` (the controller's rules), which calls it and
re-exports it.

Pure: state in, state out.
"""

from __future__ import annotations

import math
from dataclasses import replace

from planner.budget_state import BudgetClass, BudgetState

__all__ = ["recounted"]


def recounted(
    state: BudgetState, cached_input_counts: bool, now: float, measured: float | None = None
) -> BudgetState:
    """The alias's cache-counting belief changed. The token seed and budget go to the stated
    limit, which measures them in the new units, or where none is stated to ``measured``, the
    limit as the drained rates read it in the new units (a budget kept at its number in the old
    units is off by the ratio of the two countings: fivefold on a trace's late calls), and the
    class's seed is then fresh (``BudgetState.class_seeded_at``: a stale config's 3x growth
    ceiling is for a guess, not for a limit measured at ``now``); with neither, they keep
    their number (the operator's seed, read in the new units). Its cuts and
    429 levels were measured in the old units and are dropped, and so are the rates accepted at
    the 429s that named no limit: their token rates were read in the old units, and the blame
    of the next such 429 (the class whose rate held steady across them) would find the token
    limit unsteady and put its 429s on another class (wide-506, started in that wrong belief:
    the request budget cut to 0.4x its limit while every 429 was the token limit's)."""
    if cached_input_counts == state.cached_input_counts:
        return state
    cls = BudgetClass.TOKENS
    seed, budgets = state.seed, state.budgets
    class_seeded_at = state.class_seeded_at
    level = state.hard_caps.get(cls, measured)
    if level is not None and math.isfinite(level) and level > 0:
        seed, budgets = seed.with_value(cls, level), budgets.with_value(cls, level)
        class_seeded_at = state.class_seed_renewed(cls, now)
    return replace(
        state,
        cached_input_counts=cached_input_counts,
        seed=seed,
        budgets=budgets,
        class_seeded_at=class_seeded_at,
        rebase_up_streak={k: v for k, v in state.rebase_up_streak.items() if k is not cls},
        proven_rate={k: v for k, v in state.proven_rate.items() if k is not cls},
        unknown_samples=(),
    ).keeping_429_memory(lambda k: k is not cls)
