"""What the pacer holds back after a throttling response: which budget classes a 429 left empty
without saying so (``classes_to_hold``) and for how many seconds of refill (``hold_seconds``).

Kept apart from the admission core (``planner.pacer``) because it is a rule on a classified
response (``planner.classify.Classification``), not on the queue: the gateway's pacer and the
simulator's gate read it to decide what to pass to ``PacerCore.hold``, and the alias file takes
its default hold from ``HOLD_AFTER_429_S``. ``planner.pacer`` re-exports it. Pure: no I/O, no
clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from planner.budgets import BudgetClass, TokenClass, header_classes
from planner.classify import Classification, LimitType

__all__ = [
    "DAILY_HOLD_MAX_S",
    "EVERY_BUCKET",
    "HOLD_AFTER_429_S",
    "classes_to_hold",
    "hold_seconds",
]

#: Seconds of refill the pacer holds back after a 429 that states nothing of the provider's
#: buckets (``PacerCore.hold``). Measured on the simulator over 32 random and 28 shipped-scenario
#: runs: 2 s and 5 s both cut no-header 429s ~10x (``parametric-limit-drop`` rate 0.0031-0.0056
#: to 0.0004) at no cost in makespan; 5 s also cleared one more random scenario.
HOLD_AFTER_429_S = 5.0
#: Longest the pacer holds an alias after a per-day limit's 429 (``LimitType.DAILY``): its
#: retry-after, at most this; later 429s of the same day hold it again.
DAILY_HOLD_MAX_S = 300.0


#: Every bucket class of the pacer (what a 429 that states no remaining at all leaves empty).
EVERY_BUCKET = frozenset({BudgetClass.REQUESTS, BudgetClass.TOKENS, BudgetClass.OUTPUT_TOKENS})


def classes_to_hold(
    view: Classification, *, token_class: TokenClass, has_output_budget: bool
) -> frozenset[BudgetClass]:
    """The budget classes whose provider bucket a throttling response left empty without
    saying so: every class when the response states no remaining at all; else the classes the
    429 names whose remaining it does not state (an output-token limit behind OpenAI-style
    headers, which state requests and combined tokens only). The pacer holds them for
    ``HOLD_AFTER_429_S`` of refill; the stated ones it mirrors (``observe_remaining``). A
    per-day limit's 429 holds every bucket: every call is refused until that limit resets."""
    if view.limit_type is LimitType.DAILY:
        return EVERY_BUCKET
    if not view.is_throttle:
        return frozenset()
    if not view.remaining:
        return EVERY_BUCKET
    if view.limit_type is LimitType.UNKNOWN:
        return frozenset()

    def budget_classes(values: Mapping[LimitType, float]) -> set[BudgetClass]:
        return set(
            header_classes(values, token_class=token_class, has_output_budget=has_output_budget)
        )

    hit = budget_classes({view.limit_type: 0.0})
    if not hit and view.limit_type is LimitType.OUTPUT_TOKENS:
        hit = {BudgetClass.TOKENS}  # no output budget: the token budget carries output
    return frozenset(hit - budget_classes(view.remaining))


def hold_seconds(view: Classification, after_429_s: float) -> float:
    """Seconds of refill a throttling response holds ``classes_to_hold`` for: ``after_429_s``;
    for a per-day limit its retry-after (at least ``after_429_s``), at most
    ``DAILY_HOLD_MAX_S``."""
    if view.limit_type is not LimitType.DAILY:
        return after_429_s
    wait = view.retry_after_s if view.retry_after_s is not None else after_429_s
    return min(max(wait, after_429_s), DAILY_HOLD_MAX_S)
