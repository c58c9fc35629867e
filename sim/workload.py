"""The instances of a scenario as flat per-call arrays: what each task would do, unthrottled.

Two harness models build the same ``Workload``:

* trace replay: instances are sampled with replacement from a shipped trace; the first request
  comes ``max(t_request_s[0], 0)`` after the container starts (the boot delay); the time from a
  request to the next one comes from the trace (it holds LLM latency and tool time) and is split
  into in-flight time (the latency model, at most the whole gap) and tool time; the last call is
  followed by the rest of the instance's wall time.
* parametric: per instance a lognormal number of calls; input tokens ``first + growth x step``
  with ``cached_share`` of them cache reads; lognormal output tokens per call and tool gaps;
  in-flight time from the latency model.

Every throttling delay (pacer wait, 429 back-off) shifts the rest of the instance: the simulator
keeps the per-call in-flight and tool times and moves the clock. Deterministic for a seed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from sim.scenario import Latency, Parametric, Scenario, Spread
from sim.traces import load_calls, load_instances

Z90 = 1.2815515655446004
MIN_WALL_S = 0.001  # the shortest task the curve fit is given (seconds)


@dataclass(frozen=True)
class Workload:
    """Instances j = 0..n-1; instance j's calls are ``start[j]:start[j+1]`` of the call arrays.

    ``boot`` = launch to container start plus the first request's offset (launch to first call);
    per call: ``input`` (cached included), ``cached``, ``output``, ``latency`` (in flight) and
    ``after`` (response to the next request, or to the instance's end after its last call).
    """

    boot: NDArray[np.float64]
    start: NDArray[np.int64]
    input: NDArray[np.int64]
    cached: NDArray[np.int64]
    output: NDArray[np.int64]
    latency: NDArray[np.float64]
    after: NDArray[np.float64]

    @property
    def n_instances(self) -> int:
        return int(self.boot.size)

    @property
    def n_calls(self) -> int:
        return int(self.input.size)

    def durations(self) -> NDArray[np.float64]:
        """Unthrottled duration of each instance, boot included (seconds)."""
        per_call = (
            np.add.reduceat(self.latency + self.after, self.start[:-1]) if self.n_calls else 0
        )
        n = np.diff(self.start)
        work = np.where(n > 0, per_call, 0.0)
        return np.asarray(self.boot + work, dtype=np.float64)

    def calls_frame(self) -> pd.DataFrame:
        """The unthrottled calls as a fit_curve table (age = time since launch minus boot)."""
        inst = np.repeat(np.arange(self.n_instances), np.diff(self.start))
        step_time = self.latency + self.after
        cum = np.cumsum(step_time)
        first = self.start[:-1]
        base = np.where(first > 0, cum[np.maximum(first - 1, 0)], 0.0)
        t_request = cum - step_time - np.repeat(base, np.diff(self.start))
        return pd.DataFrame(
            {
                "instance_id": inst.astype(str),
                "t_request_s": t_request,
                "input_tokens": self.input,
                "cached_input_tokens": self.cached,
                "output_tokens": self.output,
            }
        )

    def instances_frame(self) -> pd.DataFrame:
        """One row per instance with its wall time after boot (for fit_curve), at least
        ``MIN_WALL_S``: a scenario may give calls no latency and no gap, and the fit takes a
        task of no duration for a bad table."""
        return pd.DataFrame(
            {
                "instance_id": np.arange(self.n_instances).astype(str),
                "wall_time_s": np.maximum(self.durations() - self.boot, MIN_WALL_S),
            }
        )


def _lognormal(rng: np.random.Generator, spread: Spread, size: int) -> NDArray[np.float64]:
    sigma = max(math.log(spread.p90 / spread.median), 0.0) / Z90
    return np.asarray(spread.median * np.exp(sigma * rng.standard_normal(size)), dtype=np.float64)


@dataclass(frozen=True)
class _TraceInstances:
    starts: NDArray[np.int64]
    first: NDArray[np.float64]
    input: NDArray[np.int64]
    cached: NDArray[np.int64]
    output: NDArray[np.int64]
    gap: NDArray[np.float64]


@functools.lru_cache(maxsize=4)
def _trace(name: str) -> _TraceInstances:
    calls = load_calls(name).sort_values(["instance_id", "step"], kind="stable")
    inst = load_instances(name).set_index("instance_id")
    ids = calls["instance_id"].to_numpy()
    t = calls["t_request_s"].to_numpy(dtype=np.float64)
    change = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    starts = np.r_[change, ids.size].astype(np.int64)
    nxt = np.r_[t[1:], np.nan]
    last = starts[1:] - 1
    wall = inst.loc[ids[last], "wall_time_s"].to_numpy(dtype=np.float64)
    nxt[last] = np.maximum(wall, t[last])
    gap = np.maximum(nxt - t, 0.0)
    return _TraceInstances(
        starts=starts,
        first=np.maximum(t[starts[:-1]], 0.0),
        input=calls["input_tokens"].to_numpy(dtype=np.int64),
        cached=calls["cached_input_tokens"].to_numpy(dtype=np.int64),
        output=calls["output_tokens"].to_numpy(dtype=np.int64),
        gap=gap,
    )


def _split(gap: NDArray[np.float64], out: NDArray[np.int64], lat: Latency) -> NDArray[np.float64]:
    model = np.asarray(lat.base + lat.per_output_token * out, dtype=np.float64)
    return np.asarray(np.minimum(model, gap), dtype=np.float64)


def _from_trace(
    scenario: Scenario, rng: np.random.Generator, boot: NDArray[np.float64]
) -> Workload:
    assert scenario.harness.trace is not None
    tr = _trace(scenario.harness.trace)
    n_trace = tr.starts.size - 1
    pick = rng.integers(0, n_trace, size=scenario.instances)
    lo, hi = tr.starts[pick], tr.starts[pick + 1]
    counts = hi - lo
    idx = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)])
    latency = _split(tr.gap[idx], tr.output[idx], scenario.harness.latency)
    return Workload(
        boot=boot + tr.first[pick],
        start=np.r_[0, np.cumsum(counts)].astype(np.int64),
        input=tr.input[idx],
        cached=np.minimum(tr.cached[idx], tr.input[idx]),
        output=tr.output[idx],
        latency=latency,
        after=tr.gap[idx] - latency,
    )


def _from_parametric(
    p: Parametric, lat: Latency, n: int, rng: np.random.Generator, boot: NDArray[np.float64]
) -> Workload:
    counts = np.maximum(np.rint(_lognormal(rng, p.calls, n)), 1).astype(np.int64)
    start = np.r_[0, np.cumsum(counts)].astype(np.int64)
    total = int(start[-1])
    step = np.arange(total) - np.repeat(start[:-1], counts)
    inputs = (p.first_input_tokens + p.input_growth_per_call * step).astype(np.int64)
    cached = np.floor(p.cached_share * inputs).astype(np.int64)
    output = np.maximum(np.rint(_lognormal(rng, p.output_tokens, total)), 1).astype(np.int64)
    after = _lognormal(rng, p.gap_s, total)
    after[start[1:] - 1] = 0.0
    return Workload(
        boot=boot,
        start=start,
        input=inputs,
        cached=cached,
        output=output,
        latency=np.asarray(lat.base + lat.per_output_token * output, dtype=np.float64),
        after=after,
    )


def build_workload(scenario: Scenario, seed_offset: int = 0) -> Workload:
    """The scenario's instances (deterministic for ``scenario.seed + seed_offset``)."""
    rng = np.random.default_rng([scenario.seed, seed_offset])
    b = scenario.harness.boot_s
    boot = (
        rng.uniform(b.min, b.max, size=scenario.instances)
        if b.max > b.min
        else np.full(scenario.instances, b.min)
    )
    if scenario.harness.parametric is not None:
        return _from_parametric(
            scenario.harness.parametric, scenario.harness.latency, scenario.instances, rng, boot
        )
    return _from_trace(scenario, rng, boot)
