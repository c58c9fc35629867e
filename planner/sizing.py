"""Projection and fleet sizing: from the live fleet, the curves and the budgets to one Decision.

Owns the planner's core arithmetic (DESIGN.md, Planner steps 1-3 and 5):

* Projection. Over a horizon (grid of ``step_s``), each budgeted quantity q (calls/s, counted
  tokens/s, output tokens/s, in-flight tokens) is projected for the live fleet — a task of age a
  contributes ``rate_q(a+t) * S(a+t)/S(a)`` — plus every booting or new task, which starts as an
  age-0 task after the boot delay. A slot whose task finishes is refilled from the queue (when
  work is queued) and contributes the slot's steady-state rate ``r_q = ∫rate_q S / (boot + ∫S)``.
  Demand is linear in the number k of new tasks: ``D_q(t; k) = A_q(t) + (booting + k) P_q(t)``.
* Sizing. The fleet target saturates the first budget to fill: the smallest k whose mean demand
  over the horizon reaches ``overdrive x budget`` (a little above it, so the pacer always has a
  call to admit: binding ``paced``). It is bounded by how long calls may wait at the pacer (no
  rate's sustained demand — its mean over the horizon once the new tasks have booted — above
  ``max_overdrive x budget``, where ``max_overdrive = 1 + max_wait_s / mean gap between a
  task's calls``: a closed fleet paced at the budget stretches every task by its overdrive)
  and by the in-flight token budget (its peak); a bound that cuts the target names its budget
  (``qps_budget``, ``arrival_budget``, ``inflight_budget``). A new cohort's first calls, which
  the projection lands together, may go above the bound for a while: the pacer's queue takes
  that transient, and a bound on it held calls-bound fleets under their budget.
* The instance timeout. With ``FleetState.instance_timeout_s`` (the live runs' shortest
  ``timeouts.instance_s``) no rate's sustained demand is projected above ``timeout_margin x
  timeout / tail age`` x its budget (at least ``timeout_floor``, 1.1x): a task stretched by
  the overdrive would otherwise run past the timeout and land as ``error`` (binding
  ``instance_timeout``).
* A launch ramp (``FleetState.ramping``, from ``planner.budget_state.BudgetState.ramping``):
  until the provider has answered, or while its headers leave a budgeted class a guess and no
  429 has come, the ceiling grows at most ``ramp_growth`` x the live fleet per tick (from
  ``ramp_floor``): a first cohort sized on a seed above the limit would all boot and call
  before the first 429 could say so (binding ``launch_ramp``).
* Caps, pause, cooldown and stale config turn the target into the ceiling and the launches
  allowed now (see ``Binding`` for the order). While work is queued the target is at least one
  task, even where one task's projected demand is above a budget (an operator's seed of 9
  output tokens/s for a harness that writes more): the pacer holds that task's calls to the
  budget, and its answers are what can correct the budget. A target of 0 would launch nothing,
  hear nothing and never finish.

Pure: the clock is an argument, nothing is read from the environment. Ages are binned (``age_bin_s``)
so one decision costs the same for 100 or 10,000 live tasks. Its inputs (the fleet, caps,
counting, constants) live in ``planner.sizing_inputs``, the overdrive controller in
``planner.overdrive``; both are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from planner.decision import Binding, Decision, Quantity
from planner.overdrive import OverdriveConfig, hold_overdrive
from planner.sizing_inputs import (
    BudgetLike,
    Caps,
    Counting,
    Curve,
    FleetState,
    FloatArray,
    SizingConfig,
    SteadyState,
)

__all__ = [
    "BudgetLike",
    "Caps",
    "Counting",
    "Curve",
    "FleetState",
    "FloatArray",
    "OverdriveConfig",
    "Projection",
    "SizingConfig",
    "SteadyState",
    "decide",
    "hold_overdrive",
    "project",
    "steady_state",
]


def _token_rate(curve: Curve, age: FloatArray, counting: Counting) -> FloatArray:
    rate = curve.uncached_input_tokens_per_s(age)
    if counting.cached_input_counts:
        rate = rate + curve.cached_input_tokens_per_s(age)
    if counting.combined:
        rate = rate + curve.output_tokens_per_s(age)
    return rate


def _rates(curve: Curve, age: FloatArray, counting: Counting) -> dict[Quantity, FloatArray]:
    return {
        Quantity.CALLS: curve.calls_per_s(age),
        Quantity.TOKENS: _token_rate(curve, age, counting),
        Quantity.OUTPUT_TOKENS: curve.output_tokens_per_s(age),
        Quantity.INFLIGHT_TOKENS: curve.inflight_tokens(age),
    }


def steady_state(curve: Curve, counting: Counting, boot_s: float, max_age_s: float) -> SteadyState:
    """A refilled slot's long-run demand per quantity, and a task's mean gap between calls."""
    age = np.linspace(0.0, max_age_s, 2881)
    surv = np.clip(curve.survival(age), 0.0, 1.0)
    life = float(np.trapezoid(surv, age))
    rates = _rates(curve, age, counting)
    slot = {q.value: float(np.trapezoid(r * surv, age)) / (boot_s + life) for q, r in rates.items()}
    totals = {q.value: float(np.trapezoid(r * surv, age)) for q, r in rates.items()}
    calls = totals[Quantity.CALLS.value]
    gap = life / calls if calls > 0 else math.inf
    below = np.nonzero(surv <= TAIL_SURVIVAL)[0]
    tail = float(age[below[0]]) if below.size else max_age_s
    return SteadyState(
        slot_rates=MappingProxyType(slot),
        mean_gap_s=gap,
        task_totals=MappingProxyType(totals),
        tail_age_s=tail,
        duration_spread=_duration_spread(age, surv),
    )


def _duration_spread(age: FloatArray, surv: FloatArray) -> float:
    """The age survival falls to 0.1 over the age it falls to 0.5 (inf if half outlive the
    grid; a grid step stands in for a median of 0)."""
    half = np.nonzero(surv <= 0.5)[0]
    if not half.size:
        return math.inf
    tenth = np.nonzero(surv <= 0.1)[0]
    p90 = float(age[tenth[0]]) if tenth.size else float(age[-1])
    return p90 / max(float(age[half[0]]), float(age[1] - age[0]))


def _bin_ages(ages: FloatArray, bin_s: float) -> tuple[FloatArray, FloatArray]:
    if ages.size == 0:
        return np.zeros(0), np.zeros(0)
    keys = np.floor(np.maximum(ages, 0.0) / bin_s).astype(np.int64)
    uniq, counts = np.unique(keys, return_counts=True)
    return (uniq.astype(np.float64) + 0.5) * bin_s, counts.astype(np.float64)


@dataclass(frozen=True, slots=True)
class Projection:
    """Demand over the horizon grid: ``live[q]`` = A_q(t), ``per_new[q]`` = P_q(t)."""

    grid: FloatArray
    live: dict[Quantity, FloatArray]
    per_new: dict[Quantity, FloatArray]
    live_finishes: float


def project(
    curve: Curve,
    ages: FloatArray,
    counting: Counting,
    config: SizingConfig,
    steady: SteadyState,
    refill: float,
) -> Projection:
    """Project every quantity for the live fleet and for one new task (refill share ``refill``)."""
    grid = np.arange(config.step_s, config.horizon_s + config.step_s / 2, config.step_s)
    centers, counts = _bin_ages(ages, config.age_bin_s)
    slot = {q: steady.slot_rates[q.value] * refill for q in Quantity}
    live: dict[Quantity, FloatArray] = {}
    finishes = 0.0
    if centers.size:
        future = (centers[:, None] + grid[None, :]).ravel()
        s_now = np.maximum(np.clip(curve.survival(centers), 0.0, 1.0), 1e-9)
        s_fut = np.clip(curve.survival(future), 0.0, 1.0).reshape(centers.size, grid.size)
        cond = np.minimum(s_fut / s_now[:, None], 1.0)
        gone = (counts[:, None] * (1.0 - cond)).sum(axis=0)
        finishes = float(gone[-1])
        for q, rate in _rates(curve, future, counting).items():
            mat = rate.reshape(centers.size, grid.size) * cond
            live[q] = counts @ mat + gone * slot[q]
    else:
        live = {q: np.zeros(grid.size) for q in Quantity}
    u = grid - config.boot_s
    started = u >= 0
    uu = np.maximum(u, 0.0)
    s_new = np.where(started, np.clip(curve.survival(uu), 0.0, 1.0), 1.0)
    per_new = {
        q: np.where(started, rate * s_new + (1.0 - s_new) * slot[q], 0.0)
        for q, rate in _rates(curve, uu, counting).items()
    }
    return Projection(grid=grid, live=live, per_new=per_new, live_finishes=finishes)


def _budget_of(budgets: BudgetLike, q: Quantity) -> float | None:
    value: float | None = getattr(budgets, q.value)
    if value is None or not math.isfinite(value):
        return None
    return max(float(value), 0.0)


_BOUND_BINDING = {
    Quantity.CALLS: Binding.QPS_BUDGET,
    Quantity.TOKENS: Binding.ARRIVAL_BUDGET,
    Quantity.OUTPUT_TOKENS: Binding.ARRIVAL_BUDGET,
    Quantity.INFLIGHT_TOKENS: Binding.INFLIGHT_BUDGET,
}
_BIG = 10**9
TAIL_SURVIVAL = 0.02


def _overdrive(config: SizingConfig, q: Quantity) -> float:
    """How far above budget q the fleet's mean demand is sized (a token budget: see
    ``SizingConfig.token_overdrive``; never below the calls' one, which the saturation
    controller scales)."""
    if q is Quantity.CALLS:
        return config.overdrive
    return max(config.token_overdrive, config.overdrive)


def _size(
    proj: Projection,
    budgets: BudgetLike,
    booting: int,
    config: SizingConfig,
    o_max: Mapping[Quantity, float],
    cap: float | None,
) -> tuple[int, Binding, Quantity | None]:
    """New tasks k to add (may be negative), the budget binding, the saturating quantity."""
    k_sat, saturating = _BIG, None
    for q in (Quantity.CALLS, Quantity.TOKENS, Quantity.OUTPUT_TOKENS):
        budget = _budget_of(budgets, q)
        per_new = float(proj.per_new[q].mean())
        if budget is None or per_new <= 0:
            continue
        need = (_overdrive(config, q) * budget - float(proj.live[q].mean())) / per_new
        k = math.ceil(need - 1e-9) - booting
        if k < k_sat:
            k_sat, saturating = k, q
    k, binding = _bound_within(proj, budgets, booting, k_sat, o_max, cap)
    return k, binding, saturating


def _stretch_cap(
    config: SizingConfig, steady: SteadyState, timeout_s: float | None
) -> float | None:
    """The most a rate budget's sustained demand may be projected over it so that the curve's
    long tasks (its tail age), stretched by that overdrive, end within ``timeout_margin`` x the
    live runs' instance timeout; at least ``timeout_floor`` (a fleet whose demand only matches
    its budget leaves the limit idle: ``SizingConfig.timeout_floor``). None: no timeout bounds
    the sizing."""
    if timeout_s is None:
        return None
    stretch = config.timeout_margin * timeout_s / max(steady.tail_age_s, 1.0)
    return max(config.timeout_floor, stretch)


def _bound_within(
    proj: Projection,
    budgets: BudgetLike,
    booting: int,
    k: int,
    o_max: Mapping[Quantity, float],
    cap: float | None,
) -> tuple[int, Binding]:
    """``_bound``, then the rate bounds cut to ``cap`` (``_stretch_cap``): where that lowers
    ``k`` further, the binding is ``instance_timeout``."""
    k, binding = _bound(proj, budgets, booting, k, o_max)
    if cap is None:
        return k, binding
    k_cap, _ = _bound(proj, budgets, booting, k, {q: min(v, cap) for q, v in o_max.items()})
    if k_cap < k:
        return k_cap, Binding.INSTANCE_TIMEOUT
    return k, binding


def _bound(
    proj: Projection, budgets: BudgetLike, booting: int, k: int, o_max: Mapping[Quantity, float]
) -> tuple[int, Binding]:
    """``k`` lowered so that no rate's sustained demand — its mean over the horizon once the
    new tasks have booted — exceeds ``o_max[q] x budget``, nor the in-flight tokens' peak
    their budget; the binding names the budget that lowered it (else ``paced``)."""
    binding = Binding.PACED
    for q in Quantity:
        budget = _budget_of(budgets, q)
        if budget is None:
            continue
        limit = budget * o_max.get(q, 1.0)
        per_task = proj.per_new[q]
        booted = per_task > 0
        if not bool(booted.any()):
            continue
        if q is Quantity.INFLIGHT_TOKENS:
            # a concurrency: what is in flight at its peak is what the budget holds
            room = float(((limit - proj.live[q][booted]) / per_task[booted]).min())
        else:
            # a rate: a new cohort's first calls land together (the projection starts every
            # booting task at the same age 0), a transient the pacer's queue absorbs; the
            # wait bound is on the level sustained after it (docs/bench-planner.md,
            # forty-fifth round: a bound on that peak held calls-bound fleets at 0.9x
            # their budget, the pacer idle)
            room = (limit - float(proj.live[q][booted].mean())) / float(per_task[booted].mean())
        k_max = math.floor(room + 1e-9) - booting
        if k_max < k:
            k, binding = k_max, _BOUND_BINDING[q]
    return k, binding


def decide(
    fleet: FleetState,
    curve: Curve,
    budgets: BudgetLike,
    counting: Counting,
    caps: Caps,
    config: SizingConfig,
    steady: SteadyState | None = None,
) -> Decision:
    """One planner decision for one alias (see the module docstring for the method).

    ``steady`` may be passed in to skip integrating the curve each tick (see ``steady_state``).
    """
    if steady is None:
        steady = steady_state(curve, counting, config.boot_s, config.integration_age_s)
    running = int(fleet.ages.size)
    live = running + fleet.booting
    o_max, o_end = _wait_bounds(config, steady.mean_gap_s)
    cap = _stretch_cap(config, steady, fleet.instance_timeout_s)

    ages = fleet.ages * fleet.progress if fleet.progress != 1.0 else fleet.ages
    proj = project(curve, ages, counting, config, steady, refill=1.0)
    k, binding, saturating = _size(proj, budgets, fleet.booting, config, o_max, cap)
    expected_finishes = proj.live_finishes + max(k + fleet.booting, 0) * float(
        1.0 - curve.survival(np.array([max(config.horizon_s - config.boot_s, 0.0)]))[0]
    )
    spare = fleet.queued - max(k, 0)
    if spare < expected_finishes:
        refill = max(spare, 0) / expected_finishes if expected_finishes > 0 else 0.0
        proj = project(curve, ages, counting, config, steady, refill=refill)
        k, binding, saturating = _size(proj, budgets, fleet.booting, config, o_max, cap)

    if _endgame(fleet.queued, budgets, steady, saturating):
        # What is left fits in about one long task's life at every budget: work launched later
        # only lengthens the tail (the limit idles while the last tasks finish alone), so
        # launch it now, as far as the pacer may hold calls longer (``endgame_max_wait_s``).
        k_end, b_end = _bound_within(proj, budgets, fleet.booting, fleet.queued, o_end, cap)
        if k_end > k:
            k, binding = k_end, b_end
    k = min(k, fleet.queued)
    # a budget below one task's projected demand still gets a task while work is queued: the
    # pacer holds its calls to the budget, while a fleet of none would draw no answer, header
    # or 429 to correct the budget by, and would never finish
    target = max(live + k, 1 if fleet.queued > 0 else 0)
    ceiling = target
    for cap, name in (
        (caps.static, Binding.AT_CAPACITY),
        (caps.run, Binding.RUN_CAP),
        (caps.override, Binding.CEILING_OVERRIDE),
    ):
        if cap is not None and cap <= ceiling:
            ceiling, binding = max(cap, 0), name
    if fleet.ramping:
        ramp = max(config.ramp_floor, math.ceil(config.ramp_growth * live - 1e-9))
        if ramp < ceiling:
            ceiling, binding = ramp, Binding.LAUNCH_RAMP
    sized_by = binding if saturating is not None else None
    if fleet.stale:
        if fleet.queued > 0 and ceiling < config.stale_floor and binding not in _OPERATOR_CAPS:
            ceiling = min(config.stale_floor, *_present_caps(caps))
        binding = Binding.STALE_CONFIG if binding not in _OPERATOR_CAPS else binding
    launches = max(0, min(ceiling - live, fleet.queued))
    if fleet.in_cooldown:
        binding, ceiling, launches = Binding.COOLDOWN, min(ceiling, live), 0
    if fleet.queued == 0:
        binding, launches = Binding.NO_WORK, 0
    if fleet.paused:
        binding, ceiling, launches = Binding.PAUSED, min(ceiling, live), 0

    # the queue's last tasks are all live: an old task there is a long one only where the
    # durations spread wide (``SizingConfig.old_first_min_spread``)
    old_tasks_first = (
        fleet.queued > 0
        or fleet.booting > 0
        or steady.duration_spread >= config.old_first_min_spread
    )
    n_new = fleet.booting + max(ceiling - live, 0)
    projections = {
        q.value: float((proj.live[q] + n_new * proj.per_new[q]).mean()) for q in Quantity
    }
    budget_view = {q.value: v for q in Quantity if (v := _budget_of(budgets, q)) is not None}
    return Decision(
        now=fleet.now,
        live=live,
        booting=fleet.booting,
        queued=fleet.queued,
        ceiling=ceiling,
        launches_allowed=launches,
        binding=binding,
        target=target,
        saturating=saturating,
        projections=MappingProxyType(projections),
        budgets=MappingProxyType(budget_view),
        stale=fleet.stale,
        sized_by=sized_by,
        old_tasks_first=old_tasks_first,
    )


def _wait_bounds(
    config: SizingConfig, mean_gap_s: float
) -> tuple[dict[Quantity, float], dict[Quantity, float]]:
    """Per quantity, the most its sustained demand may exceed its budget by (in steady state
    and in the endgame): a closed fleet paced at a budget stretches each task by the overdrive,
    so ``1 + max wait / mean gap`` bounds the wait a call may take at the pacer."""

    def over(wait_s: float) -> float:
        return 1.0 + (wait_s / mean_gap_s if mean_gap_s > 0 else 0.0)

    calls = max(over(config.max_wait_s), config.overdrive)
    tokens = max(over(config.token_max_wait_s), _overdrive(config, Quantity.TOKENS))
    end = max(over(config.endgame_max_wait_s), calls)
    steady = {Quantity.CALLS: calls, Quantity.TOKENS: tokens, Quantity.OUTPUT_TOKENS: tokens}
    endgame = {
        Quantity.CALLS: end,
        Quantity.TOKENS: max(end, tokens),
        Quantity.OUTPUT_TOKENS: max(end, tokens),
    }
    return steady, endgame


def _endgame(
    queued: int, budgets: BudgetLike, steady: SteadyState, saturating: Quantity | None
) -> bool:
    """True when the queued tasks' total demand of every rate quantity budgeted (calls,
    counted tokens, output tokens) takes at most the curve's tail age to serve at its budget.

    Every one, not only the saturating one: which budget saturates now is the live fleet's
    mix, and where contexts grow an old fleet saturates the token budget while the queued
    tasks' output would take the output budget longer than the tail. Launched at once, those
    tasks form one cohort whose output the run then waits on (wide-1494: 271 tasks launched
    together, their calls held by the token budget while the output budget idled at half
    use; docs/bench-planner.md, twenty-eighth round)."""
    if saturating is None or queued <= 0:
        return False
    budget = _budget_of(budgets, saturating)
    per_task = steady.task_totals.get(saturating.value, 0.0)
    if budget is None or budget <= 0 or per_task <= 0:
        return False
    for q in (Quantity.CALLS, Quantity.TOKENS, Quantity.OUTPUT_TOKENS):
        other = _budget_of(budgets, q)
        total = steady.task_totals.get(q.value, 0.0)
        if other is not None and other > 0 and queued * total / other > steady.tail_age_s:
            return False
    return True


_OPERATOR_CAPS = (Binding.RUN_CAP, Binding.CEILING_OVERRIDE)


def _present_caps(caps: Caps) -> list[int]:
    return [c for c in (caps.static, caps.run, caps.override) if c is not None] + [_BIG]
