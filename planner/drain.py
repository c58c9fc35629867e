"""How fast the provider's per-minute bucket of one limit class was drained, from what it accepted.

A provider's per-minute limit ``L`` is a bucket that holds one minute of it and refills at ``L``
per minute. What it accepted of a class between ``s`` and ``now``, ``A(s, now)``, can never
exceed a full bucket plus the refill: ``A(s, now) <= L x (bucket_s + now - s)``. So

    drained(now) = max over s of A(s, now) / (bucket_s + now - s)

is a lower bound on ``L`` at every moment, and at a 429 of that class (its bucket empty) it is
``L`` itself, within one call. The rate accepted over the last cooldown is not: after a quiet
spell the bucket was full, and a 30 s burst drains it at up to three times ``L``. That spread
made the blame of a header-less 429 (``planner.blame``) a guess: across a request limit's 429s
the accepted request rate read 7.3, 4.9, 4.5 and 7.6 calls/s against a limit of 3.9, no
steadier than the token rate, so the token budget took the blame and its seed was re-based to
a third of the provider's token limit (random-1439, ratio 1.44). The drained rate of the class
whose limit binds reads its limit at each of its 429s; the other classes' move with the mix of
calls.

The gateway records a call at its response, so calls still in flight are missing from ``A``:
the drained rate is at most a little low, never high. Pure: events and the time in, a rate out.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["BUCKET_S", "LOOKBACK_S", "drained_rate"]

BUCKET_S = 60.0  # a per-minute limit's bucket holds one minute of it
LOOKBACK_S = 600.0  # how far back the accepted calls are read (ten buckets' worth)


def drained_rate(
    events: Iterable[tuple[float, float]], now: float, *, bucket_s: float = BUCKET_S
) -> float:
    """``max over s of A(s, now) / (bucket_s + now - s)`` for ``events`` of (requested at,
    amount) at or before ``now`` (later ones are ignored); 0 when there are none. The maximum
    is reached at an event's time, so only those are tried."""
    if bucket_s <= 0:
        raise ValueError(f"bucket_s must be > 0, got {bucket_s}")
    best = total = 0.0
    for at, amount in sorted(((t, a) for t, a in events if t <= now), reverse=True):
        total += amount
        best = max(best, total / (bucket_s + now - at))
    return best
