"""A re-probe's verdict, read again once the calls in flight at its 429 are answered.

Without headers, a re-probe that draws a 429 at about the level an earlier 429 left
remembered is told from the re-probe of a raised limit by how fast the provider's bucket was
drained (``planner.budget_moves._level_memory``). The gateway records a call when it is
answered, so the drained rate read at the planner's tick misses the calls then in flight: at
the 429s of wide-2879 it read 0.81-0.91 of the limit, and a limit raised by a third looked
unchanged at every re-probe, so growth stayed held under the old level while its memory
doubled. The rate up to the 429's step, read once every call requested before it is answered
(the gateway's ``complete_before``), misses nothing: ``drain.drained_rate`` is then the limit
within one call. Where it shows the provider served ``reprobe_rise`` x more than the kept
level allowed, the limit rose: the level remembered becomes what it served (``probe_margin``
over it, so growth stops at the drained rate; at most the level the 429 was drawn at), for
``memory_s``, as for a re-probe the tick read as a rise.

Pure: the state, the settled rates and the config in; the state out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from planner.budget_state import BudgetClass, BudgetState, ControllerConfig

__all__ = ["SETTLE_WITHIN_S", "settled"]

# a settlement read later than this after its re-probe is dropped: the calls in flight then are
# long answered, and the limit may have moved since
SETTLE_WITHIN_S = 300.0


def settled(
    state: BudgetState,
    rates: Mapping[BudgetClass, float] | None,
    now: float,
    config: ControllerConfig,
) -> tuple[BudgetState, list[str]]:
    """The state with each settled re-probe of ``rates`` judged again (see the module
    docstring), and the ones older than ``SETTLE_WITHIN_S`` dropped; with notes."""
    pending = dict(state.unsettled_reprobe)
    if not pending:
        return state, []
    notes: list[str] = []
    levels = dict(state.last_429_level)
    memory = dict(state.level_memory_s)
    for cls, (at, drawn, kept) in list(pending.items()):
        rate = (rates or {}).get(cls)
        if rate is None:
            if now - at > SETTLE_WITHIN_S:
                del pending[cls]
            continue
        del pending[cls]
        served = min(drawn, rate / (1.0 - config.probe_margin))
        if state.last_429_at.get(cls) == at and served > kept * config.reprobe_rise:
            levels[cls] = served
            memory[cls] = config.memory_s
            notes.append(
                f"{cls.value}: the re-probe at t={at:.0f} drained {rate:.6g}/s once its calls "
                f"in flight were answered, above the {kept:.6g}/s kept: the limit rose"
            )
    return (
        replace(state, unsettled_reprobe=pending, last_429_level=levels, level_memory_s=memory),
        notes,
    )
