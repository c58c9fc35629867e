"""Fleet policies of the simulator: the baselines people use today, and the name parser.

* ``fixed:N`` — a fixed worker count (the SWE-bench harness, OpenHands): ceiling min(N, caps).
* ``aimd`` — Inspect-style adaptive concurrency: start at 20, +5% per clean 15 s round, x0.8 on
  a 429 followed by a 15 s cooldown (no growth, no further cut), at most 500, within the caps.

Neither has a pacer: their instances call the provider directly and retry after a 429. The
planner policy (ours) lives in ``sim.planner_policy``.
"""

from __future__ import annotations

from planner.classify import Classification
from sim.engine import FleetView, Gate


class FixedPolicy:
    """A fixed number of workers, within the task caps."""

    gate: Gate | None = None
    reads_headers = False

    def __init__(self, workers: int, cap: int | None) -> None:
        self.name = f"fixed:{workers}"
        self.ceiling = workers if cap is None else min(workers, cap)

    def tick(self, fleet: FleetView) -> int:
        return self.ceiling

    def on_response(self, now: float, call: int, classification: Classification | None) -> None:
        return None


class AimdPolicy:
    """Additive-increase (5% per clean round) multiplicative-decrease (x0.8 per 429) workers."""

    gate: Gate | None = None
    reads_headers = False
    name = "aimd"

    def __init__(
        self,
        cap: int | None,
        *,
        start: float = 20.0,
        growth: float = 1.05,
        cut: float = 0.8,
        cooldown_s: float = 15.0,
        maximum: int = 500,
    ) -> None:
        self.level = start
        self.growth = growth
        self.cut = cut
        self.cooldown_s = cooldown_s
        self.maximum = maximum if cap is None else min(maximum, cap)
        self.cooldown_until = -1.0
        self.saw_429 = False

    def tick(self, fleet: FleetView) -> int:
        if not self.saw_429 and fleet.now >= self.cooldown_until and fleet.now > 0:
            self.level = min(self.level * self.growth, float(self.maximum))
        self.saw_429 = False
        return max(1, min(int(self.level), self.maximum))

    def on_response(self, now: float, call: int, classification: Classification | None) -> None:
        if classification is None:
            return
        self.saw_429 = True
        if now >= self.cooldown_until:
            self.level = max(1.0, self.level * self.cut)
            self.cooldown_until = now + self.cooldown_s
