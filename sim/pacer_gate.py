"""The planner's view of a simulated scenario: the curve it sizes on, and its pacer as the gate.

``scenario_curve``: the shipped default of the trace's harness for a trace scenario; for a
parametric harness a curve fitted (``planner.fit.fit_curve``) from simulated unthrottled
samples of the parametric model (another seed than the run's), as production fits curves from
what landed. ``PacerGate``: ``planner.pacer.PacerCore`` behind the simulator's ``Gate``
protocol (call ids are call indices), with each call's task age as the gateway knows it.
Kept apart from ``sim.planner_policy``, which wires the controller, sizing and pacer together.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from planner.curves import HarnessCurve, default_curve
from planner.fit import fit_curve
from planner.pacer import CallEstimate, CallUsage, PacerCore
from sim.scenario import Scenario
from sim.traces import TRACE_HARNESS
from sim.workload import Workload, build_workload

__all__ = ["FIT_SAMPLE_INSTANCES", "PacerGate", "scenario_curve"]

FIT_SAMPLE_INSTANCES = 400


def scenario_curve(scenario: Scenario) -> HarnessCurve:
    """The curve the planner uses for the scenario's harness (see the module docstring)."""
    trace = scenario.harness.trace
    if trace is not None:
        return default_curve(TRACE_HARNESS.get(trace, trace))
    sample_scenario = scenario.model_copy(update={"instances": FIT_SAMPLE_INSTANCES})
    sample = build_workload(sample_scenario, seed_offset=1)
    lat = scenario.harness.latency
    return fit_curve(
        sample.calls_frame(),
        f"parametric:{scenario.name}",
        instances=sample.instances_frame(),
        latency_base_s=lat.base,
        latency_per_output_token_s=lat.per_output_token,
    ).curve


class PacerGate:
    """``planner.pacer.PacerCore`` as the simulator's gate (call ids are call indices)."""

    def __init__(
        self, core: PacerCore, workload: Workload, task_timeout_s: float | None = None
    ) -> None:
        self.core = core
        self._task_timeout_s = task_timeout_s  # every task's (the scenario's instance timeout)
        self._uncached = (workload.input - workload.cached).tolist()
        self._cached = workload.cached.tolist()
        self._output = workload.output.tolist()
        self._offered: dict[int, float] = {}
        # each call's instance, and when the gate first saw one of its calls: the task's age
        # as the gateway knows it (an instance's first call is requested as its task starts)
        self._instance = np.repeat(
            np.arange(workload.n_instances), np.diff(workload.start)
        ).tolist()
        self._task_started: dict[int, float] = {}
        self.on_admit: Callable[[float, int], None] | None = None  # hears of each admission
        self.wait_s = 0.0
        self.admitted = 0

    def offer(self, now: float, call: int) -> bool:
        started = self._task_started.setdefault(self._instance[call], now)
        est = CallEstimate(
            self._uncached[call],
            self._cached[call],
            self._output[call],
            task_age_s=max(0.0, now - started),
            task_timeout_s=self._task_timeout_s,
        )
        admitted = self.core.request(str(call), est, now).admitted
        if admitted:
            self.admitted += 1
            if self.on_admit is not None:
                self.on_admit(now, call)
        else:
            self._offered[call] = now
        return admitted

    def release(self, now: float, call: int, ok: bool) -> None:
        usage = (
            CallUsage(self._uncached[call], self._cached[call], self._output[call]) if ok else None
        )
        self.core.release(str(call), usage, now)

    @property
    def waiting(self) -> int:
        return self.core.queue_len

    def admit_ready(self, now: float) -> list[int]:
        calls = [int(c) for c in self.core.poll(now)]
        for call in calls:
            self.wait_s += now - self._offered.pop(call)
            if self.on_admit is not None:
                self.on_admit(now, call)
        self.admitted += len(calls)
        return calls

    def take_waits(self) -> tuple[float, int]:
        """Seconds waited and calls admitted since the last call (the gateway's pacer figures)."""
        out = (self.wait_s, self.admitted)
        self.wait_s, self.admitted = 0.0, 0
        return out

    def next_time(self, now: float) -> float | None:
        nt = self.core.next_ready_at(now)
        if nt is None or nt == float("inf"):
            return None
        return nt
