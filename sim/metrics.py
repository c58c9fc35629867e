"""The benchmark's figures: the physical lower bound of a scenario and the per-policy columns.

``lower_bound`` is the largest of: for each provider limit class, the time to serve the
scenario's total counted amount of that class at its limit, integrated over time when the
limit changes (``sim.limits.time_to_serve``); the sum of unthrottled instance durations (boot
included) divided by the binding task cap; the longest instance. It depends only on the
scenario and its workload, never on a policy. ``summarise`` turns a run's raw stats into the
columns of the results table (see docs/scenarios.md).

``instance_stretch`` measures what a policy does to single instances: each one's harness stage
(launch to finish, boot excluded) against its unthrottled length, and how many would have run
past the scenario's ``instance_timeout_s`` though they fit in it unthrottled: in production
(``timeouts.instance_s``) those attempts land as ``error``, a wrong result the makespan does
not show. The simulator does not end them, so every other column is unchanged by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from planner.classify import LimitType
from sim.engine import RunStats
from sim.limits import CLASS_ORDER, LimitChange, LimitSpec, time_to_serve
from sim.scenario import Scenario
from sim.workload import Workload

COLUMNS = (
    "makespan_s",
    "lower_bound_s",
    "ratio",
    "calls",
    "http_429",
    "rate_429",
    "utilisation",
    "peak_fleet",
    "ticks",
    "timeouts",
)


def limit_spec(scenario: Scenario) -> tuple[LimitSpec, list[LimitChange]]:
    """The scenario's true provider limits in sim.limits' terms."""
    p = scenario.provider
    spec = LimitSpec(
        rpm=p.rpm,
        tpm=p.tpm,
        input_tpm=p.input_tpm,
        output_tpm=p.output_tpm,
        cached_input_counts=p.cached_input_counts,
    )
    changes = [
        LimitChange(
            at_s=c.at_s, rpm=c.rpm, tpm=c.tpm, input_tpm=c.input_tpm, output_tpm=c.output_tpm
        )
        for c in p.changes
    ]
    return spec, changes


def _counted_input(scenario: Scenario, workload: Workload) -> NDArray[np.int64]:
    """Each call's input tokens that the provider counts (cache reads or not)."""
    if scenario.provider.cached_input_counts:
        return workload.input
    return workload.input - workload.cached


def class_totals(scenario: Scenario, workload: Workload) -> dict[LimitType, float]:
    """What the whole scenario asks of each limit class, unthrottled (no retries)."""
    counted = _counted_input(scenario, workload)
    out = float(workload.output.sum())
    return {
        LimitType.REQUESTS: float(workload.n_calls),
        LimitType.INPUT_TOKENS: float(counted.sum()),
        LimitType.TOKENS: float(counted.sum()) + out,
        LimitType.OUTPUT_TOKENS: out,
    }


def largest_calls(scenario: Scenario, workload: Workload) -> dict[LimitType, float]:
    """What the largest single call asks of each token class (a request asks one request)."""
    if workload.n_calls == 0:
        return {}
    counted = _counted_input(scenario, workload)
    return {
        LimitType.INPUT_TOKENS: float(counted.max()),
        LimitType.TOKENS: float((counted + workload.output).max()),
        LimitType.OUTPUT_TOKENS: float(workload.output.max()),
    }


def calls_that_never_fit(scenario: Scenario, workload: Workload) -> list[str]:
    """One message per provider limit (named by its field) that some call of the workload
    exceeds on its own at some time of the run: the provider answers such a call "request too
    large" forever, and every policy stalls on its instance. [] when every call always fits."""
    spec, changes = limit_spec(scenario)
    biggest = largest_calls(scenario, workload)
    field = {
        LimitType.INPUT_TOKENS: "input_tpm",
        LimitType.TOKENS: "tpm",
        LimitType.OUTPUT_TOKENS: "output_tpm",
    }
    out: list[str] = []
    for cls, need in biggest.items():
        values = [spec.limit(cls), *(c.limit(cls) for c in changes)]
        lowest = min((v for v in values if v is not None), default=None)
        if lowest is not None and need > lowest:
            out.append(
                f"provider.{field[cls]} ({lowest:,.0f} per minute at its lowest) is below the "
                f"largest call's {cls.value.replace('_', ' ')} ({need:,.0f}): that call can "
                "never be admitted and every policy would stall"
            )
    return out


@dataclass(frozen=True)
class LowerBound:
    """The lower bound and its terms (seconds); ``binding_class`` is the tightest limit class."""

    seconds: float
    terms: dict[str, float]
    binding_class: LimitType | None


def lower_bound(scenario: Scenario, workload: Workload) -> LowerBound:
    spec, changes = limit_spec(scenario)
    totals = class_totals(scenario, workload)
    terms: dict[str, float] = {}
    best_class, best = None, -1.0
    for cls in CLASS_ORDER:
        if spec.limit(cls) is None:
            continue
        t = time_to_serve(spec, changes, cls, totals[cls])
        terms[cls.value] = t
        if t > best:
            best_class, best = cls, t
    durations = workload.durations()
    cap = scenario.caps.binding
    if cap is not None:
        terms["task_cap"] = float(durations.sum()) / cap
    terms["longest_instance"] = float(durations.max())
    return LowerBound(seconds=max(terms.values()), terms=terms, binding_class=best_class)


def integrated_limit(scenario: Scenario, cls: LimitType, until_s: float) -> float:
    """∫0..until limit(t)/60 dt for a class (what the provider could serve in that time)."""
    spec, changes = limit_spec(scenario)
    steps = [(0.0, spec.limit(cls))]
    for ch in changes:
        lim = ch.limit(cls)
        if lim is not None:
            steps.append((ch.at_s, lim))
    total = 0.0
    for i, (start, lim) in enumerate(steps):
        end = min(steps[i + 1][0] if i + 1 < len(steps) else math.inf, until_s)
        if lim is not None and end > start:
            total += (end - start) * lim / 60.0
    return total


@dataclass(frozen=True)
class InstanceStretch:
    """Per-instance figures of one run (``None`` when no instance both ran and finished)."""

    timeouts: int
    """Instances whose harness stage ran past the timeout though it fits in it unthrottled."""
    stretch_p99: float | None
    """99th percentile of harness stage / unthrottled harness stage."""
    stretch_max: float | None
    """The largest such stretch."""


#: Unthrottled stages shorter than this are measured against it (a stretch of a few seconds
#: held at the pacer means nothing for an instance of no calls).
MIN_STAGE_S = 10.0


def instance_stretch(stats: RunStats, workload: Workload, timeout_s: float) -> InstanceStretch:
    """The run's per-instance stretch and its instances past ``timeout_s`` (module docstring)."""
    launched = np.asarray(stats.launched_at, dtype=np.float64)
    finished = np.asarray(stats.finished_at, dtype=np.float64)
    if launched.size != workload.n_instances:
        return InstanceStretch(timeouts=0, stretch_p99=None, stretch_max=None)
    unthrottled = workload.durations() - workload.boot
    stage = finished - launched - workload.boot
    done = np.isfinite(stage)
    timeouts = int(np.sum(done & (stage > timeout_s) & (unthrottled <= timeout_s)))
    if not done.any():
        return InstanceStretch(timeouts=timeouts, stretch_p99=None, stretch_max=None)
    stretch = stage[done] / np.maximum(unthrottled[done], MIN_STAGE_S)
    return InstanceStretch(
        timeouts=timeouts,
        stretch_p99=round(float(np.percentile(stretch, 99)), 2),
        stretch_max=round(float(stretch.max()), 2),
    )


def summarise(
    stats: RunStats, scenario: Scenario, workload: Workload, bound: LowerBound
) -> dict[str, Any]:
    """The results columns of one policy's run.

    A run that stalled (no call admitted for a long time: a retry livelock) has no makespan:
    ``makespan_s``, ``ratio`` and ``utilisation`` are None and ``stalled_at_s`` says when.
    """
    stretch = instance_stretch(stats, workload, scenario.instance_timeout_s)
    if stats.stalled_at is not None:
        return {
            "makespan_s": None,
            "lower_bound_s": round(bound.seconds, 1),
            "ratio": None,
            "calls": stats.calls,
            "http_429": stats.http_429,
            "rate_429": round(stats.http_429 / stats.calls, 5) if stats.calls else 0.0,
            "utilisation": None,
            "peak_fleet": stats.peak_fleet,
            "ticks": stats.ticks,
            "timeouts": stretch.timeouts,
            "stalled_at_s": round(stats.stalled_at, 1),
            "finished": stats.finished,
            "binding_limit": bound.binding_class.value if bound.binding_class else None,
            "stretch_p99": stretch.stretch_p99,
            "stretch_max": stretch.stretch_max,
        }
    util = float("nan")
    if bound.binding_class is not None and math.isfinite(stats.makespan_s):
        served = integrated_limit(scenario, bound.binding_class, stats.makespan_s)
        used = stats.consumed.get(bound.binding_class.value, 0.0)
        util = used / served if served > 0 else float("nan")
    ratio = stats.makespan_s / bound.seconds if bound.seconds > 0 else float("nan")
    return {
        "makespan_s": round(stats.makespan_s, 1),
        "lower_bound_s": round(bound.seconds, 1),
        "ratio": round(ratio, 3),
        "calls": stats.calls,
        "http_429": stats.http_429,
        "rate_429": round(stats.http_429 / stats.calls, 5) if stats.calls else 0.0,
        "utilisation": round(util, 3) if not np.isnan(util) else None,
        "peak_fleet": stats.peak_fleet,
        "ticks": stats.ticks,
        "timeouts": stretch.timeouts,
        "mean_fleet": round(stats.fleet_s / stats.makespan_s, 1) if stats.makespan_s else 0.0,
        "pacer_wait_s_per_call": round(stats.pacer_wait_s / stats.calls, 3) if stats.calls else 0,
        "binding_limit": bound.binding_class.value if bound.binding_class else None,
        "stretch_p99": stretch.stretch_p99,
        "stretch_max": stretch.stretch_max,
    }
