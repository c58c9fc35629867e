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

from evalfleet.errors import ConfigError
from planner.bounds import within

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
    """The planner's sizing constants; each default is bounded (``ConfigError`` names every
    field out of bounds)."""

    horizon_s: float = 300.0  # how far ahead demand is projected [15, 3600]
    step_s: float = 15.0  # the projection grid [1, horizon_s]
    boot_s: float = 60.0  # a slot's time per task not running the harness [0, 86400]
    overdrive: float = 1.10  # demand sized over the saturating budget: the pacer holds it [1, 4]
    max_wait_s: float = 6.0  # the longest sustained pacer wait per call projected [0, 600]
    # the same while the queue's last tasks run (the endgame) [max_wait_s, 3600]
    endgame_max_wait_s: float = 6.0
    # Under a token budget the pacer admits the smallest prompts first (planner.pacer), so a
    # larger fleet there buys young tasks' cheap steps, not waits for all: the queue of
    # instances drains sooner and the tail with it. 2x from the third round, 2.5x from the
    # forty-third (docs/bench-planner.md: 1,716 runs, +9 meeting every target, mean makespan
    # -0.2%). [1, 4] and [max_wait_s, 600]
    token_overdrive: float = 2.5
    token_max_wait_s: float = 30.0
    age_bin_s: float = 5.0  # live tasks' ages are binned to this [0.1, 600]
    stale_floor: int = 1  # the ceiling a stale config never goes under [1, 100000]
    integration_age_s: float = 7200.0  # how far a curve is integrated [600, 604800]
    # the launch ramp (``FleetState.ramping``): the ceiling is at most max(ramp_floor,
    # ramp_growth x live) per tick; 100 tasks at 1.2x reach 500 in 9 ticks (about 2 minutes)
    # [1, 100000] and (1, 4]
    ramp_floor: int = 100
    ramp_growth: float = 1.2
    # Once no instance is left to launch, the pacer keeps ranking an output-bound queue by task
    # age (old first) only when the curve's task durations spread at least this much (its 90th
    # over its 50th percentile age of survival): there an old task is likely a long one, which
    # the run ends on. Narrower, an old task is nearly done, and favouring it only stretches
    # the young ones; calls then go in arrival order (docs/bench-planner.md, twenty-sixth
    # round). [1, 100]
    old_first_min_spread: float = 1.7
    # A closed fleet paced at a budget stretches each task by its overdrive, and past the run's
    # instance timeout a task lands as ``error``. So no rate budget's sustained demand is
    # projected above ``timeout_margin x instance timeout / the curve's tail age`` x the budget
    # (at least ``timeout_floor`` x): the curve's long tasks, so stretched, still end within
    # this share of the timeout. Measured on batch twenty-six (docs/bench-planner.md, fiftieth
    # round). [0.1, 1]
    timeout_margin: float = 0.8
    # The least that bound allows, whatever the curve's long tasks: a fleet whose demand only
    # matches its budget leaves the limit idle while tasks sit in tool calls (the output limit
    # at 0.91 in wide-5392), and where the long tasks nearly fill the timeout the bound above
    # would hold every run there. 1.1 met 11 more of batches 37-41's 840 runs (71 of the 77
    # whose bound was under 1.2, 60 at 1x), 1.9% faster on those, for 29% more instances past
    # the timeout there (docs/bench-planner.md, fifty-ninth round). [1, 2]
    timeout_floor: float = 1.1

    def __post_init__(self) -> None:
        p: list[str] = []
        within("horizon_s", self.horizon_s, 15.0, 3600.0, p)
        within("step_s", self.step_s, 1.0, self.horizon_s, p)
        within("boot_s", self.boot_s, 0.0, 86_400.0, p)
        # below 1 the pacer would have no demand to hold back
        within("overdrive", self.overdrive, 1.0, 4.0, p)
        within("max_wait_s", self.max_wait_s, 0.0, 600.0, p)
        within("endgame_max_wait_s", self.endgame_max_wait_s, self.max_wait_s, 3600.0, p)
        within("token_overdrive", self.token_overdrive, 1.0, 4.0, p)
        within("token_max_wait_s", self.token_max_wait_s, self.max_wait_s, 600.0, p)
        within("age_bin_s", self.age_bin_s, 0.1, 600.0, p)
        within("stale_floor", self.stale_floor, 1, 100_000, p)
        within("timeout_margin", self.timeout_margin, 0.1, 1.0, p)
        within("timeout_floor", self.timeout_floor, 1.0, 2.0, p)
        within("integration_age_s", self.integration_age_s, 600.0, 604_800.0, p)
        within("ramp_floor", self.ramp_floor, 1, 100_000, p)
        within("old_first_min_spread", self.old_first_min_spread, 1.0, 100.0, p)
        if not 1.0 < self.ramp_growth <= 4.0:
            p.append(f"ramp_growth: must be within (1, 4], got {self.ramp_growth!r}")
        if p:
            raise ConfigError("sizing config", p)


@dataclass(frozen=True, slots=True)
class FleetState:
    """The alias's fleet and flags at one tick. ``ages`` are the running tasks' ages (seconds).

    ``progress`` (0, 1] is the share of its unthrottled speed a task has progressed at (1 /
    stretch; the gateway measures it from the pacer's waits: ``1 / (1 + wait per call / mean
    gap between calls)``). Curves are functions of unthrottled age, so a paced task of age a
    is projected as a task of age ``a x progress``: without it a paced fleet looks older —
    and, for a growing curve, hungrier — than it is, and the planner under-launches.

    ``instance_timeout_s`` is the shortest instance timeout of the alias's live runs (their
    ``timeouts.instance_s``); None: none bounds the sizing.
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
    instance_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.progress <= 1.0:
            raise ValueError("progress must be in (0, 1]")
        if self.instance_timeout_s is not None and not self.instance_timeout_s > 0.0:
            raise ValueError("instance_timeout_s must be > 0 (or None)")


@dataclass(frozen=True, slots=True)
class SteadyState:
    """Per-slot figures of a curve, integrated once: steady-state rate per quantity, mean gap,
    one task's total demand per quantity, the tail age (survival down to
    ``planner.sizing.TAIL_SURVIVAL``) and the spread of task durations."""

    slot_rates: MappingProxyType[str, float]
    mean_gap_s: float
    task_totals: MappingProxyType[str, float] = field(default_factory=lambda: MappingProxyType({}))
    tail_age_s: float = 0.0
    # the curve's duration spread: the age its survival falls to 0.1 over the age it falls to
    # 0.5 (1 for a point mass; inf when half the tasks outlive the integration)
    duration_spread: float = 1.0
