"""What a change of the alias's cache-counting belief does to the budget controller's state, and
the one change the controller makes itself: a belief that cache reads count, where the provider's
first answers carry no rate-limit headers.

The belief (``BudgetState.cached_input_counts``) says whether cache reads count against the
provider's token limit; the pacer charges every call, and the controller measures every token
budget, in its units. Three things change it:

* ``planner.cache_counting``: the provider's headers state its token bucket, and what it took
  from it contradicts the belief;
* ``planner.drain_belief``: without headers, the rates the token bucket drained at the 429s
  that name no limit, counted both ways, contradict it;
* ``doubted_without_headers``: without headers, "cache reads count" is set aside at the first
  answers (below), and the drain test is left to flip it back.

Why the last one. Without headers only 429s speak, and the two wrong beliefs do not cost alike.
A belief that cache reads do not count, where they do, lets calls through at several times what
the provider takes from its bucket: 429s come within minutes, and their drained rates flip the
belief (the first answers' minutes of a few 429s). A belief that they count, where they do not,
charges each call several times what the provider does (a trace's late calls read five times
their uncached input from the cache): the pacer holds the fleet far under the limit, no 429
says so, and the few that come, after growth has climbed the budget, drain the two countings'
rates about as steadily, so the test seldom flips it. On the 207 header-less trace scenarios of
random 0-287 and wide 0-1007 (docs/bench-planner.md, twenty-ninth round), 24 held that wrong
belief: 3 met every target, 17 with the belief corrected at the start.

Pure: state in, state out.
"""

from __future__ import annotations

import math
from dataclasses import replace

from planner.budget_state import BudgetClass, BudgetState, ControllerConfig, WindowObservation

__all__ = ["doubted_without_headers", "recounted"]


def recounted(
    state: BudgetState, cached_input_counts: bool, measured: float | None = None
) -> BudgetState:
    """The alias's cache-counting belief changed. The token seed and budget go to the stated
    limit, which measures them in the new units, or where none is stated to ``measured``, the
    limit as the drained rates read it in the new units (a budget kept at its number in the old
    units is off by the ratio of the two countings: fivefold on a trace's late calls); with
    neither, they keep their number (the operator's seed, read in the new units). Its cuts and
    429 levels were measured in the old units and are dropped, and so are the rates accepted at
    the 429s that named no limit: their token rates were read in the old units, and the blame
    of the next such 429 (the class whose rate held steady across them) would find the token
    limit unsteady and put its 429s on another class (wide-506: the request budget cut to 0.4x
    its limit while every 429 was the token limit's)."""
    if cached_input_counts == state.cached_input_counts:
        return state
    cls = BudgetClass.TOKENS
    seed, budgets = state.seed, state.budgets
    level = state.hard_caps.get(cls, measured)
    if level is not None and math.isfinite(level) and level > 0:
        seed, budgets = seed.with_value(cls, level), budgets.with_value(cls, level)
    return replace(
        state,
        cached_input_counts=cached_input_counts,
        seed=seed,
        budgets=budgets,
        rebase_up_streak={k: v for k, v in state.rebase_up_streak.items() if k is not cls},
        proven_rate={k: v for k, v in state.proven_rate.items() if k is not cls},
        unknown_samples=(),
    ).keeping_429_memory(lambda k: k is not cls)


def doubted_without_headers(
    state: BudgetState, obs: WindowObservation, config: ControllerConfig
) -> BudgetState:
    """At the provider's first answers (the window that ends ``state.answered``), where no
    header has stated a limit, a belief that cache reads count becomes "not counted" (module
    docstring), the token seed and budget keeping their number; else the state unchanged. Off
    with ``config.doubt_counted_cache_without_headers``."""
    if (
        not config.doubt_counted_cache_without_headers
        or state.answered
        or obs.answered <= 0
        or obs.observed_limits
        or state.observed_at is not None
        or not state.cached_input_counts
    ):
        return state
    return recounted(state, False)
