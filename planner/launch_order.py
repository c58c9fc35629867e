"""Which queued instance a run launches first: the ones that were shortest before go last.

A run ends when its last instance does, and the instance it ends on is most often one of its
longest, launched late and paced with the rest. The fleet policy cannot move it: nothing says
which instance is long until it has run (docs/bench-planner.md, fifty-third round). But
evaluations are run again and again on the same instances (a benchmark's 500, with another
model or prompt), and an instance that took many calls before will likely take many again.

``short_last`` (the default) moves the shorter half of the instances seen before (by their
size in earlier runs, ``ledger.forecasts``) to the end of the queue, longest of them first, so
the run's last launches are its shortest instances and the long ones start while the queue
still feeds the fleet. The rest keep the listed order. Not longest-first for all (LPT, the
textbook rule for makespan): that puts all the long tasks in the fleet together, and their
grown contexts are token-heavy, so a run with a token and a request limit spends its first
hours on the token limit with the request limit idle and its last on the reverse
(`wide-4670`: 13,815 s listed, 14,969 s longest-first). Measured in the simulator
(``evalfleet bench planner --forecast-noise``), against the listed order:

| forecast (calls x log-normal noise of sigma) | longest first | ``short_last`` |
| --- | --- | --- |
| perfect (0) | 0.962 | 0.965 |
| sigma 1 (a log correlation of about 0.4 with the truth) | 0.991 | 0.988 |

(geometric mean of the planner's makespan over batch thirty-one's 168 runs; every figure and
the targets met are in docs/bench-planner.md). A noisy forecast has a cost too: a long
instance forecast short is launched at the very end.

An instance with no size (never run, or only aborted) stays in the front part, in the listed
order: it may be long. Ties keep the listed order, so with no history the listed order is the
launch order.

Pure: sizes in, ranks out; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from enum import StrEnum

__all__ = ["SHORT_SHARE", "LaunchOrder", "launch_ranks"]

#: the share of the instances with a size that goes to the end of the queue (the shortest)
SHORT_SHARE = 0.5


class LaunchOrder(StrEnum):
    """A run config's ``launch_order``."""

    LISTED = "listed"  # the instances in the order the config lists them
    SHORT_LAST = "short_last"  # the shorter half of those run before last, shortest at the end


def launch_ranks(
    instance_ids: Sequence[str],
    sizes: Mapping[str, float],
    order: LaunchOrder = LaunchOrder.SHORT_LAST,
    short_share: float = SHORT_SHARE,
) -> dict[str, int]:
    """Each instance's launch rank (0 first). ``sizes``: a forecast of each instance's length
    in any positive unit (an instance absent, or with a size that is not a finite positive
    number, has none)."""
    if not 0.0 <= short_share <= 1.0:
        raise ValueError(f"short_share must be in [0, 1], got {short_share!r}")
    listed = list(range(len(instance_ids)))
    if order is LaunchOrder.SHORT_LAST:
        known = [k for k in listed if _usable(sizes.get(instance_ids[k]))]
        # ascending size, ties in listed order: the first ``n_short`` are the short ones
        ascending = sorted(known, key=lambda k: (sizes[instance_ids[k]], k))
        short = ascending[: math.floor(short_share * len(known))]
        moved = set(short)
        last = sorted(short, key=lambda k: (-sizes[instance_ids[k]], k))
        listed = [k for k in listed if k not in moved] + last
    return {instance_ids[k]: rank for rank, k in enumerate(listed)}


def _usable(size: float | None) -> bool:
    return size is not None and math.isfinite(size) and size > 0.0
