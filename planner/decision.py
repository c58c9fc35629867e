"""The planner's output: one frozen decision record per alias and tick, and the binding constraint.

It owns the vocabulary the rest of the system reads (the dispatcher admits ``launches_allowed``,
the ledger stores a row of ``planner_decisions`` from ``as_row()``, the UI shows ``binding``).
Pure data: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any


class Binding(StrEnum):
    """Which constraint decided the fleet size this tick (the first that applies, in this order).

    ``paused``: the run or pool is paused, nothing launches. ``no_work``: nothing is queued.
    ``cooldown``: a 429 froze launches. ``stale_config``: the alias config is older than the
    staleness limit and no header re-seeded it; the ceiling is computed from it but never 0 while
    work is queued. ``launch_ramp``: the provider has not answered yet (or its headers leave a
    budgeted limit a guess) and no 429 has come, so the fleet grows by a bounded factor per
    tick, not to the target at once (``planner.sizing.SizingConfig.ramp_growth``).
    ``ceiling_override`` / ``run_cap`` / ``at_capacity``: an operator override, the
    run's cap or the static cap is below what the budgets allow. ``inflight_budget`` /
    ``qps_budget`` / ``arrival_budget``: projected in-flight tokens, calls/s or a token class would
    exceed what the pacer may hold back, so that budget stops the fleet short of its target.
    ``instance_timeout``: the pacer would hold a larger fleet's calls back long enough to
    stretch the curve's long tasks past the live runs' instance timeout
    (``planner.sizing.SizingConfig.timeout_margin``), so the fleet stops short of its target.
    ``paced``: the healthy state, the fleet is sized so the binding budget's demand sits a little
    above the budget and the pacer absorbs the excess.
    """

    ARRIVAL_BUDGET = "arrival_budget"
    QPS_BUDGET = "qps_budget"
    INFLIGHT_BUDGET = "inflight_budget"
    PACED = "paced"
    COOLDOWN = "cooldown"
    AT_CAPACITY = "at_capacity"
    RUN_CAP = "run_cap"
    CEILING_OVERRIDE = "ceiling_override"
    PAUSED = "paused"
    STALE_CONFIG = "stale_config"
    NO_WORK = "no_work"
    LAUNCH_RAMP = "launch_ramp"
    INSTANCE_TIMEOUT = "instance_timeout"


class Quantity(StrEnum):
    """A budgeted quantity the planner projects (one per pacer budget)."""

    CALLS = "calls_per_s"
    TOKENS = "tokens_per_s"
    OUTPUT_TOKENS = "output_tokens_per_s"
    INFLIGHT_TOKENS = "inflight_tokens"


@dataclass(frozen=True, slots=True)
class Decision:
    """What the planner decided for one alias at one tick.

    ``ceiling`` is the fleet size (running + booting) the dispatcher may fill up to;
    ``launches_allowed`` = max(0, ceiling - live) except during a cooldown or pause (0).
    ``projections`` maps each budgeted quantity to its projected mean demand over the horizon at
    the chosen ceiling; ``budgets`` holds the budgets the decision used; ``target`` is the fleet
    the budgets alone asked for (before caps, cooldown and pause); ``saturating`` names the
    budget whose demand the target is sized on; ``sized_by`` is what set the ceiling (``paced``,
    the budget that bounded the target, or a cap) before a stale config, a cooldown, a pause or
    an empty queue took ``binding`` over (None: no budget saturates). ``old_tasks_first`` is
    the pacer's queue order while its output bucket holds calls back (``planner.pacer``):
    off once no instance is left to launch and the curve's task durations are narrow
    (``planner.sizing``), so the youngest tasks, which the run then ends on, are not stretched.
    """

    now: float
    live: int
    booting: int
    queued: int
    ceiling: int
    launches_allowed: int
    binding: Binding
    target: int
    saturating: Quantity | None
    projections: MappingProxyType[str, float] = field(default_factory=lambda: MappingProxyType({}))
    budgets: MappingProxyType[str, float] = field(default_factory=lambda: MappingProxyType({}))
    stale: bool = False
    sized_by: Binding | None = None
    old_tasks_first: bool = True

    @property
    def feeds_saturation(self) -> bool:
        """Whether the next window's use of the saturating budget measures this sizing: the
        budgets set the fleet (``paced``: no cap below them) and nothing but a stale label
        overrode that. The
        saturation controller (``planner.sizing.hold_overdrive``) learns only from these."""
        return (
            self.sized_by is Binding.PACED
            and self.saturating is not None
            and self.binding in (Binding.PACED, Binding.STALE_CONFIG)
        )

    def __post_init__(self) -> None:
        if self.ceiling < 0 or self.launches_allowed < 0:
            raise ValueError("ceiling and launches_allowed are never negative")
        if self.launches_allowed > max(0, self.ceiling - self.live):
            raise ValueError("launches_allowed cannot exceed ceiling - live")

    def as_row(self) -> dict[str, Any]:
        """The columns of a ``planner_decisions`` row (without alias and tick time)."""
        return {
            "live": self.live,
            "booting": self.booting,
            "queued": self.queued,
            "ceiling": self.ceiling,
            "launches_allowed": self.launches_allowed,
            "binding": self.binding.value,
            "saturating": self.saturating.value if self.saturating is not None else None,
            "sized_by": self.sized_by.value if self.sized_by is not None else None,
            "old_tasks_first": self.old_tasks_first,
            "projections": dict(self.projections),
            "budgets": dict(self.budgets),
        }
