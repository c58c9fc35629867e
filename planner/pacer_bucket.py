"""The pacer's token bucket (``planner.pacer``): a level refilled continuously at a rate up to a
capacity, waits computed from it. Kept apart so the admission logic in ``planner.pacer`` reads
as queue handling; pure, the elapsed time is an argument.
"""

from __future__ import annotations

__all__ = ["Bucket"]

_EPS = 1e-9


class Bucket:
    """One token bucket: ``rate`` per second refilled up to ``capacity``; ``level`` may go
    below 0 (a call admitted in debt, a hold after a 429)."""

    __slots__ = ("capacity", "level", "rate")

    def __init__(self, rate: float, capacity: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.level = capacity

    def refill(self, dt: float) -> None:
        capacity = self.capacity
        if dt > 0 and self.level < capacity:
            level = self.level + dt * self.rate
            self.level = level if level < capacity else capacity

    def wait_for(self, need: float) -> float:
        # on every look at the queue's head: comparisons, not min/max calls
        capacity = self.capacity
        short = (need if need < capacity else capacity) - self.level
        if short <= 0.0:
            return 0.0
        # the level is a running sum of charges and refills of up to ``capacity``: its rounding
        # error scales with that, not with ``need`` (a 13-token call once waited 4e-13 s, below
        # the clock's resolution, forever)
        scale = need if need > capacity else capacity
        if short <= _EPS * (scale if scale > 1.0 else 1.0):
            return 0.0
        return short / self.rate

    def credit(self, amount: float) -> None:
        self.level = min(self.capacity, self.level + amount)

    def settle(self, refund: float) -> None:
        """A call's estimate settled against its use: a refund is credited (up to capacity),
        a shortfall charged (the call used more than estimated)."""
        if refund >= 0:
            self.credit(refund)
        else:
            self.level += refund

    def retune(self, rate: float, capacity: float) -> None:
        """New rate and capacity; the level is clipped to the capacity, never raised."""
        self.rate = rate
        self.capacity = capacity
        self.level = min(self.level, capacity)
