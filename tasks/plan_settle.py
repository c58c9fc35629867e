"""The planner tick's read of the re-probes waiting on their calls in flight.

Without headers, a 429 that a re-probe draws at about a level an earlier 429 left remembered is
judged at the tick by how fast the provider's bucket was drained (``ledger.pacer_window``'s
``drained_rates``). The gateway records a call when it is answered, so that read misses the
calls then in flight, and a limit raised mid-run can read as unchanged. The controller keeps
such a re-probe unsettled (``BudgetState.unsettled_reprobe``); once the gateway says every call
requested before it has been answered and recorded (``tasks.plan_counting.recorded_through``),
this module reads the drained rate up to it again for ``planner.settled_drain``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Connection

from ledger import pacer_window
from planner.budget_state import BudgetClass, BudgetState
from tasks.plan_counting import recorded_through

__all__ = ["settled_drained"]


def settled_drained(
    conn: Connection, alias: str, state: BudgetState, now: datetime
) -> dict[BudgetClass, float] | None:
    """Per class with an unsettled re-probe whose calls then in flight are all recorded, how
    fast its bucket was drained up to it (None: no such class)."""
    if not state.unsettled_reprobe:
        return None
    through = recorded_through(conn, alias, now)
    out: dict[BudgetClass, float] = {}
    for cls, (at, _drawn, _kept) in state.unsettled_reprobe.items():
        if at > through:
            continue
        read = pacer_window.drained_rates(
            conn,
            alias,
            datetime.fromtimestamp(at, tz=UTC),
            token_class=state.token_class,
            cached_input_counts=state.cached_input_counts,
        )
        if cls in read.rates:
            out[cls] = read.rates[cls]
    return out or None
