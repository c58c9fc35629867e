"""A scenario's instances launched in the order ``launch_order: short_last`` gives a run whose
instances ran before (``planner.launch_order``).

The simulator launches a workload's instances in index order. Here each instance gets a
forecast of its size, its true number of LLM calls times log-normal noise (``noise`` is the
sigma of the log: 0 is a perfect forecast; at 1 the log forecast correlates 0.28-0.49 with the
log calls, median 0.40, over batch thirty-one's first 40 scenarios; 5 is no skill at all), and
the workload is re-indexed in the order ``planner.launch_order.launch_ranks`` gives, the same
function the launcher uses.
Every policy of a run sees the same order. Deterministic for the scenario's seed.
"""

from __future__ import annotations

import numpy as np

from planner.launch_order import launch_ranks
from sim.workload import Workload

__all__ = ["forecast_sizes", "launched_by_forecast", "launched_in_order"]


def forecast_sizes(workload: Workload, noise: float, seed: int) -> np.ndarray:
    """Per instance, its calls times ``exp(N(0, noise))``."""
    if not (np.isfinite(noise) and noise >= 0.0):
        raise ValueError(f"forecast noise must be a finite number >= 0, got {noise!r}")
    rng = np.random.default_rng([seed, 0x1A0C])
    calls = np.diff(workload.start).astype(np.float64)
    return np.asarray(calls * np.exp(rng.normal(0.0, noise, workload.n_instances)))


def launched_in_order(workload: Workload, order: np.ndarray) -> Workload:
    """The workload with instance ``order[k]`` as its k-th (a permutation of its indices)."""
    n = workload.n_instances
    if sorted(order.tolist()) != list(range(n)):
        raise ValueError("order must be a permutation of the workload's instances")
    counts = np.diff(workload.start)[order]
    calls = (
        np.concatenate([np.arange(workload.start[j], workload.start[j + 1]) for j in order])
        if workload.n_calls
        else np.zeros(0, dtype=np.int64)
    ).astype(np.int64)
    return Workload(
        boot=workload.boot[order],
        start=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        input=workload.input[calls],
        cached=workload.cached[calls],
        output=workload.output[calls],
        latency=workload.latency[calls],
        after=workload.after[calls],
    )


def launched_by_forecast(workload: Workload, noise: float, seed: int) -> Workload:
    """The workload launched by ``planner.launch_order`` on forecasts of ``noise``."""
    sizes = forecast_sizes(workload, noise, seed)
    ids = [str(j) for j in range(workload.n_instances)]
    ranks = launch_ranks(ids, {i: float(s) for i, s in zip(ids, sizes, strict=True)})
    order = np.array(sorted(range(workload.n_instances), key=lambda j: ranks[ids[j]]))
    return launched_in_order(workload, order)
