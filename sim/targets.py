"""The issue's targets for the planner, checked against one scenario's results table.

Owns one function, ``violations(results)``: every target the planner's row misses — its ratio
(makespan / physical lower bound) at most ``MAX_RATIO``, its rate_429 at most ``MAX_RATE_429``,
and against each baseline B: a makespan at most ``MAX_SLOWDOWN`` x B's, and wherever it is not
at least ``FASTER`` x faster, at most a tenth of B's 429s (or at most 0.1% of its own calls).
A baseline that stalled (a retry livelock: no makespan) is beaten by definition. Used by
``evalfleet bench planner`` (a verdict under every table) and by the robustness tests, so the
benchmark and the tests judge by one rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["FASTER", "MAX_RATE_429", "MAX_RATIO", "MAX_SLOWDOWN", "violations"]

MAX_RATIO = 1.20
MAX_RATE_429 = 0.005
MAX_SLOWDOWN = 1.05
FASTER = 0.95
_TENTH = 10.0
_CALL_SHARE = 0.001


def violations(results: Mapping[str, Mapping[str, Any]], planner: str = "planner") -> list[str]:
    """The targets ``results[planner]`` misses against the other rows ([] when all are met)."""
    ours = results[planner]
    if ours["makespan_s"] is None:
        return [f"{planner} stalled"]
    out: list[str] = []
    if ours["ratio"] > MAX_RATIO:
        out.append(f"{planner} ratio {ours['ratio']} > {MAX_RATIO:.2f}")
    if ours["rate_429"] > MAX_RATE_429:
        out.append(f"{planner} rate_429 {ours['rate_429']} > {MAX_RATE_429}")
    for name, row in results.items():
        if name == planner or row["makespan_s"] is None:
            continue
        if ours["makespan_s"] > MAX_SLOWDOWN * row["makespan_s"]:
            out.append(
                f"{planner} {ours['makespan_s']} s > {MAX_SLOWDOWN}x {name} {row['makespan_s']} s"
            )
        elif ours["makespan_s"] > FASTER * row["makespan_s"]:
            allowed = max(row["http_429"] / _TENTH, _CALL_SHARE * ours["calls"])
            if ours["http_429"] > allowed:
                out.append(
                    f"{planner} not 5% faster than {name} and drew {ours['http_429']} 429s "
                    f"(> a tenth of its {row['http_429']}, > 0.1% of calls)"
                )
    return out
