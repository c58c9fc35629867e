"""Helpers shared by the pacer core's tests: budgets, a tiny event loop driving the core, a
flood of equal calls. Import with ``from tests.pacer_support import ...``."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from planner.budgets import Budgets
from planner.pacer import CallEstimate, CallUsage, PacerCore


def budgets(
    calls: float = 1000.0,
    tokens: float = 1e9,
    output: float | None = None,
    inflight: float = 1e12,
) -> Budgets:
    return Budgets(
        calls_per_s=calls, tokens_per_s=tokens, output_tokens_per_s=output, inflight_tokens=inflight
    )


def drive(
    pacer: PacerCore,
    arrivals: Sequence[tuple[float, str, CallEstimate, float, CallUsage | None]],
    until: float,
) -> dict[str, float]:
    """A tiny event loop: arrivals, admissions (via request/poll/next_ready_at), releases after
    each call's duration. Returns the admission time of every admitted call."""
    admitted_at: dict[str, float] = {}
    info = {a[1]: a for a in arrivals}
    events: list[tuple[float, int, str, str]] = []
    seq = 0
    for t, cid, _est, _dur, _usage in arrivals:
        heapq.heappush(events, (t, seq, "arrive", cid))
        seq += 1

    def admitted(cid: str, now: float) -> None:
        nonlocal seq
        admitted_at[cid] = now
        heapq.heappush(events, (now + info[cid][3], seq, "release", cid))
        seq += 1

    wake_at = math.inf
    while events:
        now, _, kind, cid = heapq.heappop(events)
        if now > until:
            break
        if kind == "arrive":
            if pacer.request(cid, info[cid][2], now).admitted:
                admitted(cid, now)
        elif kind == "release":
            pacer.release(cid, info[cid][4], now)
        for other in pacer.poll(now):
            admitted(other, now)
        nxt = pacer.next_ready_at(now)
        if nxt is not None and math.isfinite(nxt) and nxt != wake_at:
            wake_at = nxt
            heapq.heappush(events, (max(nxt, now), seq, "wake", ""))
            seq += 1
    return admitted_at


def flood(
    n: int, est: CallEstimate, rate: float, dur: float = 0.5, start: float = 0.0
) -> list[tuple[float, str, CallEstimate, float, CallUsage]]:
    usage = CallUsage(est.input_uncached, est.input_cached, est.max_output)
    return [(start + i / rate, f"c{i}", est, dur, usage) for i in range(n)]
