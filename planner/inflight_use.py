"""How used the in-flight budget was, as the budget controller's growth rules read it.

The pacer reports each budget's use over a window (``PacerUsage.utilisation``); for in-flight
tokens, the peak held over the window divided by the budget. The controller grows a budget
that was used (rule 6) and re-bases up the seed of one held at its ceiling and used at least
``ControllerConfig.rebase_up_min_utilisation`` (rule 7). The in-flight budget is also a bound
of the fleet's size (``planner.sizing``: ``Binding.INFLIGHT_BUDGET``), and there its peak
rarely reaches that share: the sizing projects the fleet's expected in-flight tokens against
the budget, and the peak of a few tasks' calls, each a large share of it, lands anywhere below
(wide-463 of ``sim.generate_wide``: a fleet held to 13-20 tasks by an operator's in-flight
seed for 25 minutes, with every rate budget stated by headers and idle, the peak at 0.65-0.8
of the budget; ratio 1.31). So a window whose fleet the in-flight budget sized, with work
queued, while no rate budget was used in full, counts it as used in full: a larger budget
would have launched tasks to use the rates. Where a rate budget was used in full, its pacer
bucket was holding calls back and more tasks would only wait there: at the end of a run, the
endgame's launch of every queued task is sized past the in-flight budget, and a budget grown
to it launched one cohort whose calls then shared the token budget and lengthened the tail
(wide-229: 3,505 -> 3,622 s). A rate budget used at 0.8-1.0 is not yet full: the output
budget of wide-463 ran there under its limit while more tasks would have filled it (2,674 s
counted so, 2,781 s not). No provider limit stands behind the in-flight class to lag as a
per-minute bucket does; a provider that limits concurrency rejects the call at once, and the
429 cuts the class as usual.

Only where the provider states its limits (``limits_stated``: rate-limit headers seen). Without
them the rate budgets are guesses that 429s correct, and the in-flight budget that held the
fleet was a brake on a guess: counted so on header-less runs, more tasks met guessed budgets
above their limits and the 429s that followed took other paths (on the fresh seeds four runs
slower by 2.6-5.9% against two faster, one newly missing a target; thirty-third round). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from planner.budget_state import BudgetClass
from planner.decision import Binding

__all__ = ["FULL", "inflight_use", "sized_by_inflight"]

FULL = 1.0  # a budget used this much over a window was the pacer's limit: calls waited on it


def sized_by_inflight(binding: str | None, sized_by: str | None) -> bool:
    """Whether a decision's fleet was sized by the in-flight budget: its binding, or the
    constraint under a stale-config label (``Decision.sized_by``)."""
    return Binding.INFLIGHT_BUDGET.value in (binding, sized_by)


def inflight_use(
    utilisation: Mapping[BudgetClass, float],
    sized_by_inflight_budget: bool,
    *,
    limits_stated: bool,
) -> Mapping[BudgetClass, float]:
    """``utilisation`` with the in-flight class counted as used in full where the provider
    states its limits, the fleet was sized by the in-flight budget (the previous decision's,
    ``sized_by_inflight``), no rate budget was used in full, and the window was busy: it sent
    a call or held one in flight (an idle window says nothing of any budget)."""
    if not (limits_stated and sized_by_inflight_budget) or BudgetClass.INFLIGHT not in utilisation:
        return utilisation
    if not any(v > 0 for v in utilisation.values()):
        return utilisation
    rates = (v for c, v in utilisation.items() if c is not BudgetClass.INFLIGHT)
    if any(v >= FULL for v in rates):
        return utilisation
    return {**utilisation, BudgetClass.INFLIGHT: max(utilisation[BudgetClass.INFLIGHT], FULL)}
