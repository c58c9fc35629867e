"""The eval-fleet scaler's rule: the eval pool's concurrency follows its queue depth, in bounds.

Pure: no I/O. The supervisor applies the result to the eval work pool's Prefect limit.
"""

from __future__ import annotations

import math


def eval_pool_target(queued: int, per_slot: int, lo: int, hi: int) -> int:
    """One slot per ``per_slot`` queued evaluations, at least ``lo`` and at most ``hi``."""
    if per_slot < 1 or lo < 1 or hi < lo or queued < 0:
        raise ValueError("need queued >= 0, per_slot >= 1 and 1 <= lo <= hi")
    return max(lo, min(hi, math.ceil(queued / per_slot)))
