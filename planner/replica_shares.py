"""How gateway replicas that serve one alias split its budgets: by demand, summing to one.

Several gateway processes behind a load balancer each pace the alias locally (the pacer core
is per process, and a per-call round trip to a shared store would cost what per-call Prefect
limits cost, PREFECT-NOTES.md). Each paced at the full budget, N replicas would send N times
it. So each paces at a share of every budget, and the shares of the replicas alive sum to one:

    share_i = (1 - reserve) x demand_i / Σ demand  +  reserve / N

``demand`` is how many of the alias's calls are in a replica on average (waiting at its
pacer or sent upstream and not yet answered; ``PresenceAverage``): harnesses call in a closed
loop, each waiting for its answer before its next call, so this counts the harnesses that
want the alias now behind each replica. Their arrival rate would not do: a harness held back
calls less often, so arrivals follow the share they should set (measured: at a 3:1 split of
demand, shares by arrivals stayed at whatever the first seconds gave, 41:59). A replica whose
harnesses wait longer holds more of them, and its share grows until the waits even out. The
``reserve`` is split equally, so a replica that has had no calls can still
admit the first ones that make its demand visible; with no demand anywhere every replica gets
1/N. The split follows demand with the delay of one exchange (a second), and the sum is one at
every exchange, so replicas never pace above the alias's budget together beyond the moment
one reads an older list of replicas than another.

Pure: demands in, a share out; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["DEMAND_TAU_S", "RESERVE", "PresenceAverage", "replica_share"]

RESERVE = 0.1  # share of every budget split equally among the replicas, demand or not
DEMAND_TAU_S = 5.0  # the time constant of a replica's average presence (its demand)


def replica_share(own: str, demands: Mapping[str, float], reserve: float = RESERVE) -> float:
    """This replica's (``own``) share of the alias's budgets, given every live replica's demand
    (``own`` included; it is counted with no demand when it is missing, as before its first
    report lands)."""
    if not 0.0 < reserve <= 1.0:
        raise ValueError(f"reserve must be in (0, 1], got {reserve}")
    for replica, demand in demands.items():
        if not (math.isfinite(demand) and demand >= 0.0):
            raise ValueError(f"replica {replica}: demand must be a finite number >= 0: {demand}")
    everyone = {**demands, own: demands.get(own, 0.0)}
    total = sum(everyone.values())
    equal = 1.0 / len(everyone)
    if total <= 0.0:
        return equal
    return (1.0 - reserve) * everyone[own] / total + reserve * equal


class PresenceAverage:
    """The time-weighted exponential average of a count that changes by steps (calls present
    in a replica), with time constant ``tau_s``; the time is passed in."""

    def __init__(self, now: float, tau_s: float = DEMAND_TAU_S) -> None:
        if not tau_s > 0:
            raise ValueError(f"tau_s must be > 0, got {tau_s}")
        self.tau_s = tau_s
        self.present = 0
        self._average = 0.0
        self._at = now

    def _advance(self, now: float) -> None:
        dt = now - self._at
        if dt > 0:
            self._average += (1.0 - math.exp(-dt / self.tau_s)) * (self.present - self._average)
            self._at = now

    def step(self, delta: int, now: float) -> None:
        """The count changes by ``delta`` at ``now`` (never below zero)."""
        self._advance(now)
        self.present = max(0, self.present + delta)

    def average(self, now: float) -> float:
        self._advance(now)
        return self._average
