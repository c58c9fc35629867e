"""The cut a 429 makes in the pacer at once, until the planner's next tick cuts for good.

The budget controller (``planner.budgets``) acts at the planner's tick, up to a tick (15 s)
after a 429. Until then the pacer went on at the budget that drew it (after its
``HOLD_AFTER_429_S`` hold), into a provider bucket it had just emptied: on the simulator's
fresh batch six that is 2,744 429s where a cut at the 429 draws 769 (docs/bench-planner.md,
thirty-sixth round). So the pacer cuts at once: at a call's first 429 of a rate limit (not a
retry's, which repeats its first one's evidence; not spend, overload or a per-day limit), each
budget class the controller would cut (``planner.blame.classes_of_limit``: the named limit's,
every class for an unknown one) goes down by the controller's ``cut``, at most once per class
per cooldown; a limit the 429 states caps its class first, as the controller's rule 1 does (a
stated output limit gets a budget where there is none).

The cut is provisional. It stands until the planner pushes a value of its own for the class
(one other than it had pushed when the pacer cut), or for ``HOLD_S``: the controller's own cut,
made from the level before, with the blame, the 429 memory and the measured rates, replaces it.
A push that leaves the class where it was (a planner that judged the 429 a retry's, or is not
running) does not end it before ``HOLD_S``.

The gateway's pacer (``gateway.pacer_local``) and the simulator's planner policy both keep one
``ProvisionalCuts`` per alias, so the benchmark measures what production runs. Pure: the clock
is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from planner.blame import NOT_RATE_LIMITS, classes_of_limit
from planner.budget_headers import header_budgets
from planner.budgets import BudgetClass, Budgets, TokenClass
from planner.classify import LimitType

__all__ = ["CUT", "HOLD_S", "ProvisionalCuts"]

#: The multiplier of a provisional cut: the controller's default ``ControllerConfig.cut``.
CUT = 0.75
#: How long a provisional cut stands when no push of the planner replaces it: two ticks.
HOLD_S = 30.0


@dataclass(frozen=True, slots=True)
class _Cut:
    pushed: float | None  # the planner's value of the class when the pacer cut it
    value: float  # the provisional value
    at: float


class ProvisionalCuts:
    """The planner's pushed budgets with the provisional cuts of one alias applied."""

    def __init__(
        self, pushed: Budgets, *, cooldown_s: float, factor: float = CUT, hold_s: float = HOLD_S
    ) -> None:
        if not 0.0 < factor < 1.0:
            raise ValueError(f"factor must be in (0, 1), got {factor}")
        if cooldown_s < 0 or hold_s < 0:
            raise ValueError("cooldown_s and hold_s must be >= 0")
        self.factor = factor
        self.hold_s = hold_s
        self.cooldown_s = cooldown_s
        self._pushed = pushed
        self._cuts: dict[BudgetClass, _Cut] = {}
        self._last_cut_at: dict[BudgetClass, float] = {}

    @property
    def pushed(self) -> Budgets:
        """The planner's budgets, as last pushed."""
        return self._pushed

    @property
    def cut_classes(self) -> frozenset[BudgetClass]:
        """The classes under a provisional cut."""
        return frozenset(self._cuts)

    def budgets(self) -> Budgets:
        """What the pacer paces at: the pushed budgets, each class under a cut at its value."""
        out = self._pushed
        for cls, cut in self._cuts.items():
            out = out.with_value(cls, cut.value)
        return out

    def first_429(
        self,
        now: float,
        limit_type: LimitType,
        token_class: TokenClass,
        stated: Mapping[LimitType, float] | None = None,
    ) -> tuple[BudgetClass, ...]:
        """A call's first 429, of ``limit_type``, stating the per-minute limits ``stated``:
        as the controller's rule 1, a stated limit caps its class's budget (and a stated
        output limit gets a budget where there is none); then each class the controller would
        cut (``classes_of_limit``; none for spend, overload or a per-day limit) that the pacer
        has not cut within ``cooldown_s`` goes down by ``factor``. Returns the classes moved."""
        if limit_type in NOT_RATE_LIMITS:
            return ()
        caps = (
            header_budgets(stated, token_class=token_class, has_output_budget=True)
            if stated
            else {}
        )
        current = self.budgets()
        moved: dict[BudgetClass, float] = {}
        for cls, cap in caps.items():
            value = current.get(cls)
            if cls is BudgetClass.OUTPUT_TOKENS and value is None:
                value = math.inf  # a stated output limit is a class the provider has
            if value is not None and cap < value:
                moved[cls] = cap
                current = current.with_value(cls, cap)
        for cls in classes_of_limit(limit_type, current, token_class):
            value = current.get(cls)
            if value is None or now - self._last_cut_at.get(cls, -math.inf) < self.cooldown_s:
                continue
            moved[cls] = value * self.factor
            self._last_cut_at[cls] = now
        for cls, value in moved.items():
            self._cuts[cls] = _Cut(pushed=self._pushed.get(cls), value=value, at=now)
        return tuple(moved)

    def settle(self, now: float, pushed: Budgets) -> None:
        """The planner's budgets as they read now: a cut ends where the planner has pushed a
        value of its own for its class since, or once it is ``hold_s`` old."""
        self._pushed = pushed
        for cls, cut in list(self._cuts.items()):
            if pushed.get(cls) != cut.pushed or now - cut.at >= self.hold_s:
                del self._cuts[cls]
