"""What the provider accepted of each class, by request time: the simulated planner's read of
how fast each bucket was drained (``planner.drain``), as the planner tick reads the ledger.

Owns the accepted calls of the last ``drain.LOOKBACK_S`` (plus a latency of slack: they are
appended at their responses, out of request order), tokens counted both ways (cache reads
counted or not, so that after a recount the rates read the new units at once), and three reads:
the rates up to now (the blame of a 429 that names no limit), the token rate counted the other
way (the cache-counting belief's test without headers), and the rates up to an earlier time,
once every call requested before it is answered (a re-probe's settlement,
``planner.settled_drain``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from planner.budget_state import BudgetClass
from planner.drain import LOOKBACK_S, drained_rate

__all__ = ["DRAIN_TRIM_SLACK_S", "DrainBook"]

# responses arrive out of request order by up to a call's latency: the events older than the
# lookback by this much are trimmed
DRAIN_TRIM_SLACK_S = 120.0


class DrainBook:
    """The accepted calls' (request time, amount) per class; see the module docstring."""

    def __init__(self, counted_as: Mapping[bool, list[float]], output: list[float]) -> None:
        self._counted_as = (
            counted_as  # per call, its counted tokens with cache reads counted or not
        )
        self._output = output
        self._requests: deque[tuple[float, float]] = deque()
        self._outputs: deque[tuple[float, float]] = deque()
        self._tokens: dict[bool, deque[tuple[float, float]]] = {True: deque(), False: deque()}

    def accepted(self, requested_at: float, now: float, call: int) -> None:
        """The provider accepted ``call``, requested at ``requested_at``, answered at ``now``."""
        for events, amount in (
            (self._requests, 1.0),
            (self._outputs, self._output[call]),
            (self._tokens[True], self._counted_as[True][call]),
            (self._tokens[False], self._counted_as[False][call]),
        ):
            events.append((requested_at, amount))
            # a call answered after longer than the slack is itself trimmed, emptying the deque
            while events and events[0][0] < now - LOOKBACK_S - DRAIN_TRIM_SLACK_S:
                events.popleft()

    def _events(self, cls: BudgetClass, cached_input_counts: bool) -> deque[tuple[float, float]]:
        if cls is BudgetClass.REQUESTS:
            return self._requests
        if cls is BudgetClass.OUTPUT_TOKENS:
            return self._outputs
        return self._tokens[cached_input_counts]

    def rate(self, cls: BudgetClass, until: float, *, cached_input_counts: bool) -> float:
        """How fast ``cls``'s bucket was drained up to ``until`` by the calls requested over
        the lookback before it (tokens counted as ``cached_input_counts`` says)."""
        events = self._events(cls, cached_input_counts)
        return drained_rate((e for e in events if until - LOOKBACK_S <= e[0] <= until), until)

    def rates(
        self, now: float, *, cached_input_counts: bool, with_output: bool
    ) -> dict[BudgetClass, float]:
        """The requests', counted tokens' (and, ``with_output``, output tokens') rates."""
        classes = [BudgetClass.REQUESTS, BudgetClass.TOKENS]
        if with_output:
            classes.append(BudgetClass.OUTPUT_TOKENS)
        return {
            cls: self.rate(cls, now, cached_input_counts=cached_input_counts) for cls in classes
        }

    def settled(
        self,
        pending: Mapping[BudgetClass, tuple[float, float, float]],
        complete_before: float,
        *,
        cached_input_counts: bool,
    ) -> dict[BudgetClass, float] | None:
        """For each unsettled re-probe (``BudgetState.unsettled_reprobe``) at or before
        ``complete_before`` (every call requested before it answered), its class's rate up to
        it (None: none is ready)."""
        out: dict[BudgetClass, float] = {
            cls: self.rate(cls, at, cached_input_counts=cached_input_counts)
            for cls, (at, _drawn, _kept) in pending.items()
            if at <= complete_before and cls is not BudgetClass.INFLIGHT
        }
        return out or None
