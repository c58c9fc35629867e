"""How gateway replicas that serve one alias split its budgets: by demand, summing to one.

Several gateway processes behind a load balancer each pace the alias locally (the pacer core
is per process, and a per-call round trip to a shared store would cost what per-call Prefect
limits cost, PREFECT-NOTES.md). Each paced at the full budget, N replicas would send N times
it. So each paces at a share of every budget, and the shares of the replicas alive sum to one:

    share_i = (1 - reserve) x demand_i / Σ demand  +  reserve / N

``demand`` is what reaches a replica's pacer (calls that arrived over the last seconds, and
those still waiting): what the harnesses behind it want, not what it admitted, which its own
share would cap. The ``reserve`` is split equally, so a replica that has had no calls can still
admit the first ones that make its demand visible; with no demand anywhere every replica gets
1/N. The split follows demand with the delay of one exchange (a second), and the sum is one at
every exchange, so replicas never pace above the alias's budget together beyond the moment
one reads an older list of replicas than another.

Pure: demands in, a share out; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["RESERVE", "replica_share"]

RESERVE = 0.1  # share of every budget split equally among the replicas, demand or not


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
