"""What the planner did, tick by tick, on one simulated scenario, beside what it could not see.

The benchmark's table says whether the planner met its targets; this says why. ``trace_planner``
runs the planner policy exactly as ``sim.bench.run_policy`` does (same provider, same workload,
same result row) and keeps, per tick:

* the fleet (live, booting, queued) and the decision (ceiling, binding constraint);
* the budgets the controller left, its cache-counting belief, the classes it cut and grew and
  its notes;
* the provider's true limits at the tick (per second; hidden from the planner) and the share
  of each the provider charged over the window (``used``);
* the window's 429s twice: as the planner was told them (the classified limit type: ``unknown``
  without headers) and the limit each truly hit (the simulator's truth, through
  ``Simulation.on_throttle``).

``PlannerTrace.phases`` splits the run where the queue emptied: the binding limit's mean use
while work was queued and in the tail after it, and the seconds of it each left unused, the two
places a run loses its time (docs/bench-planner.md). ``PlannerTrace.ends_on`` is the instance
the run ended on: when it was launched, how long it runs unthrottled, and the seconds the pacer
and 429s added to it. Its launch plus its unthrottled duration is as soon as the run could have
ended once that instance was launched when it was, so a tail splits into what the launch order
decided (no policy without a forecast of durations can move it) and what the waits added.
Nothing here changes what the planner does: the recording reads its state after each tick.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from planner.classify import Classification, LimitType
from sim.engine import FleetView, RunStats, Simulation
from sim.forecast import launched_by_forecast
from sim.limits import ProviderLimits
from sim.metrics import limit_spec, lower_bound, summarise
from sim.planner_policy import PlannerPolicy
from sim.reveal import headers_now
from sim.scenario import Scenario
from sim.workload import Workload, build_workload

__all__ = ["EndsOn", "Phase", "PlannerTrace", "TickTrace", "trace_planner"]

_LIMIT_CLASSES = (
    LimitType.REQUESTS,
    LimitType.TOKENS,
    LimitType.INPUT_TOKENS,
    LimitType.OUTPUT_TOKENS,
)


@dataclass(frozen=True, slots=True)
class TickTrace:
    """One planner tick: what it saw and decided, and what the provider really had."""

    t: float
    live: int
    booting: int
    queued: int
    ceiling: int
    binding: str
    budgets: dict[str, float | None]  # per second (in-flight: tokens)
    cached_input_counts: bool  # the planner's belief at the tick
    limits: dict[str, float]  # the provider's true limits per second, by limit type
    used: dict[str, float]  # share of each true limit charged over the window
    seen: dict[str, int]  # the window's 429s as the planner was told them, by limit type
    hit: dict[str, int]  # the limit each of them truly hit
    cut: tuple[str, ...] = ()
    grown: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "live": self.live,
            "booting": self.booting,
            "queued": self.queued,
            "ceiling": self.ceiling,
            "binding": self.binding,
            "budgets": self.budgets,
            "cached_input_counts": self.cached_input_counts,
            "limits": self.limits,
            "used": self.used,
            "seen": self.seen,
            "hit": self.hit,
            "cut": list(self.cut),
            "grown": list(self.grown),
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class Phase:
    """A stretch of the run and how much of the binding limit it used on the mean."""

    name: str
    start_s: float
    end_s: float
    used: float | None  # None: no tick fell in it, or no binding limit

    @property
    def lost_s(self) -> float | None:
        """Seconds of the binding limit left unused: the stretch x (1 - used). The two
        phases' sum is about the makespan less the lower bound, where that limit binds."""
        return None if self.used is None else (self.end_s - self.start_s) * (1.0 - self.used)


@dataclass(frozen=True, slots=True)
class EndsOn:
    """The instance the run ended on (the last to finish), and what made it end when it did.

    ``finished_s - launched_s`` is its unthrottled duration (boot included) plus the seconds
    its calls were held at the pacer and waited after 429s (the simulator's own accounting)."""

    instance: int  # its index in the workload (the order instances are launched in)
    instances: int
    longer: int  # how many instances run longer unthrottled (0: it is the longest)
    launched_s: float
    finished_s: float
    duration_s: float  # unthrottled, boot included
    paced_s: float
    throttled_s: float

    @property
    def soonest_s(self) -> float:
        """When the run could have ended at the soonest, this instance launched when it was."""
        return self.launched_s + self.duration_s

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "soonest_s": self.soonest_s}


@dataclass(frozen=True)
class PlannerTrace:
    """The planner's run: its result row (``sim.metrics.summarise``), the term that sets the
    lower bound (a limit class, ``task_cap`` or ``longest_instance``), the limit class that
    sets it (None: a cap or the longest instance does), every tick, and the instance the run
    ended on (None: it stalled)."""

    scenario: str
    result: dict[str, Any]
    bound_by: str
    binding_limit: str | None
    ticks: list[TickTrace] = field(default_factory=list)
    ends_on: EndsOn | None = None

    def phases(self) -> tuple[Phase, Phase]:
        """While work was queued (to the first tick with the queue empty) and the tail."""
        end = float(self.result.get("makespan_s") or (self.ticks[-1].t if self.ticks else 0.0))
        emptied = next((k.t for k in self.ticks if k.queued == 0), end)
        queued = [k for k in self.ticks if k.t <= emptied]
        tail = [k for k in self.ticks if k.t > emptied]
        return (
            Phase("queued", 0.0, emptied, self._mean_used(queued)),
            Phase("tail", emptied, end, self._mean_used(tail)),
        )

    def _mean_used(self, ticks: list[TickTrace]) -> float | None:
        if self.binding_limit is None:
            return None
        values = [k.used[self.binding_limit] for k in ticks if self.binding_limit in k.used]
        return sum(values) / len(values) if values else None

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "result": self.result,
            "bound_by": self.bound_by,
            "binding_limit": self.binding_limit,
            "phases": [
                {
                    "name": p.name,
                    "start_s": p.start_s,
                    "end_s": p.end_s,
                    "used": p.used,
                    "lost_s": p.lost_s,
                }
                for p in self.phases()
            ],
            "ends_on": self.ends_on.as_json() if self.ends_on is not None else None,
            "ticks": [k.as_json() for k in self.ticks],
        }


class _TracingPlanner(PlannerPolicy):
    """The planner policy, recording each tick after it ran (and the 429s it was told of)."""

    def __init__(
        self, scenario: Scenario, workload: Workload, provider: ProviderLimits, tick_s: float
    ) -> None:
        style = scenario.provider.headers
        super().__init__(scenario, workload, lambda now: headers_now(style, provider, now))
        self.provider = provider
        self.tick_s = tick_s
        self.trace: list[TickTrace] = []
        self._seen: Counter[str] = Counter()
        self._hit: Counter[str] = Counter()
        self._consumed = dict(provider.consumed)
        self._last_tick: float | None = None

    def on_response(self, now: float, call: int, classification: Classification | None) -> None:
        if classification is not None:
            self._seen[classification.limit_type.value] += 1
        super().on_response(now, call, classification)

    def throttled(self, now: float, limit: LimitType | None) -> None:
        self._hit[limit.value if limit is not None else "none"] += 1

    def tick(self, fleet: FleetView) -> int:
        ceiling = super().tick(fleet)
        now = fleet.now
        window = now - self._last_tick if self._last_tick is not None else self.tick_s
        limits: dict[str, float] = {}
        used: dict[str, float] = {}
        for cls in _LIMIT_CLASSES:
            per_minute = self.provider.limit_now(cls)
            if per_minute is None:
                continue
            limits[cls.value] = per_minute / 60.0
            charged = self.provider.consumed.get(cls, 0.0) - self._consumed.get(cls, 0.0)
            if window > 0 and per_minute > 0:
                used[cls.value] = charged / (per_minute / 60.0 * window)
        self._consumed = dict(self.provider.consumed)
        self._last_tick = now
        decision = self.decisions[-1]
        budgets = self.state.budgets
        actions = self.last_actions
        self.trace.append(
            TickTrace(
                t=now,
                live=int(fleet.ages.size),
                booting=fleet.booting,
                queued=fleet.queued,
                ceiling=ceiling,
                binding=str(decision.binding),
                budgets={
                    "calls_per_s": budgets.calls_per_s,
                    "tokens_per_s": budgets.tokens_per_s,
                    "output_tokens_per_s": budgets.output_tokens_per_s,
                    "inflight_tokens": budgets.inflight_tokens,
                },
                cached_input_counts=self.counting.cached_input_counts,
                limits=limits,
                used=used,
                seen=dict(self._seen),
                hit=dict(self._hit),
                cut=tuple(c.value for c in actions.cut) if actions else (),
                grown=tuple(c.value for c in actions.grown) if actions else (),
                notes=actions.notes if actions else (),
            )
        )
        self._seen.clear()
        self._hit.clear()
        return ceiling


def trace_planner(
    scenario: Scenario, *, tick_s: float = 15.0, forecast_noise: float | None = None
) -> PlannerTrace:
    """Run the planner on ``scenario`` as the benchmark does, recording every tick (with
    ``forecast_noise``, launched longest-forecast first, as ``sim.bench.run_scenario``)."""
    workload = build_workload(scenario)
    if forecast_noise is not None:
        workload = launched_by_forecast(workload, forecast_noise, scenario.seed)
    bound = lower_bound(scenario, workload)
    spec, changes = limit_spec(scenario)
    provider = ProviderLimits(spec, changes)
    policy = _TracingPlanner(scenario, workload, provider, tick_s)
    stats = Simulation(
        workload,
        policy,
        provider,
        scenario.provider.headers,
        tick_s=tick_s,
        on_throttle=policy.throttled,
    ).run()
    bound_by = max(bound.terms, key=lambda term: bound.terms[term])
    binding = bound_by if bound_by not in ("task_cap", "longest_instance") else None
    return PlannerTrace(
        scenario.name,
        summarise(stats, scenario, workload, bound),
        bound_by,
        binding,
        policy.trace,
        _ends_on(stats, workload),
    )


def _ends_on(stats: RunStats, workload: Workload) -> EndsOn | None:
    """The last instance to finish, or None when some never did (a stalled run)."""
    finished = stats.finished_at
    if not finished or any(math.isnan(t) for t in finished):
        return None
    last = max(range(len(finished)), key=finished.__getitem__)
    durations = workload.durations()
    return EndsOn(
        instance=last,
        instances=len(finished),
        longer=int((durations > durations[last]).sum()),
        launched_s=stats.launched_at[last],
        finished_s=finished[last],
        duration_s=float(durations[last]),
        paced_s=stats.paced_s[last],
        throttled_s=stats.throttled_s[last],
    )
