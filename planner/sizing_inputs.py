"""What fleet sizing reads: the curve and budget protocols, the fleet at one tick, the caps,
the token counting, the sizing constants, and a curve's per-slot steady state.

``planner.sizing`` owns the arithmetic; this module owns its inputs, so that the callers (the
planner task, the simulator, the benchmark) and the arithmetic share one set of types.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "BudgetLike",
    "Caps",
    "Counting",
    "Curve",
    "FleetState",
    "FloatArray",
    "SizingConfig",
    "SteadyState",
]

FloatArray = NDArray[np.float64]


class Curve(Protocol):
    """What sizing needs from a harness curve (planner.curves.HarnessCurve provides it).

    Every rate is per task still running at that age; ``survival`` is the share still running.
    """

    def calls_per_s(self, age: FloatArray) -> FloatArray: ...

    def cached_input_tokens_per_s(self, age: FloatArray) -> FloatArray: ...

    def uncached_input_tokens_per_s(self, age: FloatArray) -> FloatArray: ...

    def output_tokens_per_s(self, age: FloatArray) -> FloatArray: ...

    def inflight_tokens(self, age: FloatArray) -> FloatArray: ...

    def survival(self, age: FloatArray) -> FloatArray: ...


class BudgetLike(Protocol):
    """The pacer budgets sizing reads (planner.budgets.Budgets provides them). Per second."""

    @property
    def calls_per_s(self) -> float: ...

    @property
    def tokens_per_s(self) -> float: ...

    @property
    def output_tokens_per_s(self) -> float | None: ...

    @property
    def inflight_tokens(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Counting:
    """Which tokens the alias's token budget counts: uncached input always, cache reads when
    ``cached_input_counts``, output too when the provider has one ``combined`` token limit."""

    cached_input_counts: bool = False
    combined: bool = False


@dataclass(frozen=True, slots=True)
class Caps:
    """Task caps on the alias's fleet: static (pool), per run, operator override; None = none."""

    static: int | None = None
    run: int | None = None
    override: int | None = None


@dataclass(frozen=True, slots=True)
class SizingConfig:
    """The planner's tuning constants."""

    horizon_s: float = 300.0
    step_s: float = 15.0
    boot_s: float = 60.0
    overdrive: float = 1.10
    max_wait_s: float = 6.0
    endgame_max_wait_s: float = 6.0
    # Under a token budget the pacer admits the smallest prompts first (planner.pacer), so a
    # larger fleet there buys young tasks' cheap steps, not waits for all: the queue of
    # instances drains sooner and the tail with it (docs/bench-planner.md).
    token_overdrive: float = 2.0
    token_max_wait_s: float = 30.0
    age_bin_s: float = 5.0
    stale_floor: int = 1
    integration_age_s: float = 7200.0
    # the launch ramp (``FleetState.ramping``): the ceiling is at most max(ramp_floor,
    # ramp_growth x live) per tick; 100 tasks at 1.2x reach 500 in 9 ticks (about 2 minutes)
    ramp_floor: int = 100
    ramp_growth: float = 1.2

    def __post_init__(self) -> None:
        if not (self.horizon_s > 0 and self.step_s > 0 and self.horizon_s >= self.step_s):
            raise ValueError("horizon_s and step_s must be positive, horizon_s >= step_s")
        if self.boot_s < 0 or self.max_wait_s < 0 or self.age_bin_s <= 0:
            raise ValueError("boot_s and max_wait_s must be >= 0, age_bin_s > 0")
        if self.endgame_max_wait_s < self.max_wait_s:
            raise ValueError("endgame_max_wait_s must be >= max_wait_s")
        if self.overdrive < 1.0 or self.token_overdrive < 1.0:
            raise ValueError(
                "overdrive and token_overdrive must be >= 1 (the pacer must have demand to "
                "hold back)"
            )
        if self.token_max_wait_s < self.max_wait_s:
            raise ValueError("token_max_wait_s must be >= max_wait_s")
        if self.stale_floor < 1:
            raise ValueError("stale_floor must be >= 1")
        if self.ramp_floor < 1 or not 1.0 < self.ramp_growth <= 4.0:
            raise ValueError("ramp_floor must be >= 1 and ramp_growth within (1, 4]")


@dataclass(frozen=True, slots=True)
class FleetState:
    """The alias's fleet and flags at one tick. ``ages`` are the running tasks' ages (seconds).

    ``progress`` (0, 1] is the share of its unthrottled speed a task has progressed at (1 /
    stretch; the gateway measures it from the pacer's waits: ``1 / (1 + wait per call / mean
    gap between calls)``). Curves are functions of unthrottled age, so a paced task of age a
    is projected as a task of age ``a x progress``: without it a paced fleet looks older —
    and, for a growing curve, hungrier — than it is, and the planner under-launches.
    """

    now: float
    ages: FloatArray
    booting: int
    queued: int
    paused: bool = False
    in_cooldown: bool = False
    stale: bool = False
    progress: float = 1.0
    ramping: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.progress <= 1.0:
            raise ValueError("progress must be in (0, 1]")


@dataclass(frozen=True, slots=True)
class SteadyState:
    """Per-slot figures of a curve, integrated once: steady-state rate per quantity, mean gap,
    one task's total demand per quantity, and the tail age (survival down to
    ``planner.sizing.TAIL_SURVIVAL``)."""

    slot_rates: MappingProxyType[str, float]
    mean_gap_s: float
    task_totals: MappingProxyType[str, float] = field(default_factory=lambda: MappingProxyType({}))
    tail_age_s: float = 0.0
