"""A task's expected remaining life by its age, from a curve's survival: the pacer's endgame order.

Once no instance is left to launch, the run ends when its last task does, and a call the pacer
holds back delays only its own task. The task expected to finish last should then go first: its
expected finish is ``now + remaining(age)``, with ``remaining(a) = integral of S from a on /
S(a)`` (the mean residual life of the survival ``S``). For a curve whose durations are narrow
the young tasks have the most left (an old one is nearly done); for a long-tailed one a task
that outlived the body is a long one, and the old go first. The previous rule only chose
between old-first and arrival order by how wide durations spread: it stretched the last task
launched behind a queue of old ones, and that task was the run's tail (wide-2848 in
docs/bench-planner.md).

``RemainingLife`` is a small table (at most ``MAX_NODES`` ages, linear between them, the last
value past the last age) so that the planner can hand it to a gateway through a Prefect
variable (``gateway.pacer_prefect.QueueOrder``), and the pacer can look a call up in microseconds without numpy. Pure: no I/O.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["MAX_NODES", "RemainingLife", "remaining_life"]

#: nodes of the table: enough for a smooth survival, small enough for a Prefect variable
MAX_NODES = 48
#: the table ends where survival falls to this: past it the last value holds
_END_SURVIVAL = 1e-3


@dataclass(frozen=True, slots=True)
class RemainingLife:
    """Expected seconds left of a task of age ``a``: linear between ``ages_s``, the last value
    past the last age (``__call__``)."""

    ages_s: tuple[float, ...]
    remaining_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.ages_s or len(self.ages_s) != len(self.remaining_s):
            raise ValueError("remaining life: ages_s and remaining_s need the same length >= 1")
        if len(self.ages_s) > MAX_NODES:
            raise ValueError(f"remaining life: at most {MAX_NODES} nodes, got {len(self.ages_s)}")
        if self.ages_s[0] != 0.0 or any(b <= a for a, b in itertools.pairwise(self.ages_s)):
            raise ValueError("remaining life: ages_s must start at 0 and increase")
        if not all(math.isfinite(v) and v >= 0.0 for v in self.remaining_s):
            raise ValueError("remaining life: remaining_s must be finite numbers >= 0")

    def __call__(self, age_s: float) -> float:
        ages, values = self.ages_s, self.remaining_s
        i = bisect.bisect_right(ages, age_s)
        if i >= len(ages):
            return values[-1]
        if i == 0:
            return values[0]
        a0, a1 = ages[i - 1], ages[i]
        return values[i - 1] + (values[i] - values[i - 1]) * (age_s - a0) / (a1 - a0)


def remaining_life(age_s: NDArray[np.float64], survival: NDArray[np.float64]) -> RemainingLife:
    """The table of a survival sampled on an increasing grid from age 0 (a task alive at the
    grid's end is counted as ending there, so values near the end are low bounds)."""
    surv = np.clip(np.asarray(survival, dtype=np.float64), 0.0, 1.0)
    age = np.asarray(age_s, dtype=np.float64)
    if age.size < 2 or age[0] != 0.0:
        raise ValueError("remaining life: the grid needs two or more ages, from 0")
    # integral of S from each grid age to the grid's end (trapezoids, summed from the end)
    pieces = (surv[1:] + surv[:-1]) / 2.0 * np.diff(age)
    beyond = np.append(np.cumsum(pieces[::-1])[::-1], 0.0)
    below = np.nonzero(surv <= _END_SURVIVAL)[0]
    end = int(below[0]) if below.size else age.size - 1
    end = max(end, 1)
    nodes = np.unique(np.linspace(0, end, MAX_NODES).round().astype(np.int64))
    # a tenth of a second is plenty for an order, and keeps the variable short
    ages, first = np.unique(age[nodes].round(1), return_index=True)
    values = beyond[nodes[first]] / np.maximum(surv[nodes[first]], 1e-12)
    return RemainingLife(
        tuple(float(a) for a in ages),
        tuple(round(float(v), 1) for v in values),
    )
