"""How runs that share an alias split its ceiling: weighted by priority, each within its own cap.

Water-filling: every run gets ``ceiling x priority / Σ priority`` of what is left, but never more
than it can use (its cap, and its demand = live + queued); what a run cannot use is shared again
among the others by priority, until the ceiling is spent or every run is full. Whole tasks are
handed out by largest remainder, ties by run id, so the split is deterministic and sums exactly
to ``min(ceiling, Σ usable)``.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RunDemand:
    """One run on the alias: its priority weight and the most tasks it can use now."""

    run_id: str
    priority: float
    usable: int

    def __post_init__(self) -> None:
        if not (self.priority > 0 and math.isfinite(self.priority)):
            raise ValueError(f"run {self.run_id}: priority must be a positive number")
        if self.usable < 0:
            raise ValueError(f"run {self.run_id}: usable must not be negative")


def fair_shares(ceiling: int, runs: Sequence[RunDemand]) -> Mapping[str, int]:
    """Split ``ceiling`` tasks among ``runs`` (see the module docstring)."""
    if ceiling < 0:
        raise ValueError("ceiling must not be negative")
    share: dict[str, float] = {r.run_id: 0.0 for r in runs}
    open_runs = [r for r in runs if r.usable > 0]
    left = float(min(ceiling, sum(r.usable for r in runs)))
    while open_runs and left > 1e-9:
        weight = sum(r.priority for r in open_runs)
        full = [r for r in open_runs if share[r.run_id] + left * r.priority / weight >= r.usable]
        if not full:
            for r in open_runs:
                share[r.run_id] += left * r.priority / weight
            break
        for r in full:
            left -= r.usable - share[r.run_id]
            share[r.run_id] = float(r.usable)
        open_runs = [r for r in open_runs if r not in full]
    whole = {k: math.floor(v + 1e-9) for k, v in share.items()}
    spare = round(sum(share.values())) - sum(whole.values())
    order = sorted(share, key=lambda k: (-(share[k] - whole[k]), k))
    for run_id in order[: max(0, spare)]:
        whole[run_id] += 1
    return whole
