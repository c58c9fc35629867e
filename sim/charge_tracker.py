"""The simulated gateway's record of what it sent and what the provider's headers said was left,
cut into ``planner.cache_counting.ChargeWindow`` spans for the cache-counting inference.

A call is charged by the provider when it is admitted, so what was sent is attributed to the
time the pacer admitted the call (its last admission, for a retried call) and recorded when its
successful response arrives. A span is closed only once every call admitted before its end has
been answered (or rejected: a rejected call is charged no tokens), as the planner tick does with
the gateway's word (``alias_observations.limits.complete_before``): a span closed while calls sent in it are
still in flight under-states what was sent, and reads as "cache reads count". One snapshot of
the counted token class's stated limit and remaining per planner tick marks the span
boundaries; a span across a change of the stated limit is dropped. Each closed span also yields
the ``planner.cache_counting.dip_window`` of its end reading, from the calls sent in it.
"""

from __future__ import annotations

from collections import deque

from planner.cache_counting import BucketReading, ChargeWindow, dip_window

SPAN_TICKS = 1  # a span is 1 planner tick (15 s)
KEEP = 8  # spans kept as evidence
DRAIN_S = 30.0  # how far back a 429's drained bucket is compared with what was admitted


class ChargeTracker:
    """Spans of sent tokens against the provider's stated bucket (see the module docstring)."""

    def __init__(self) -> None:
        self._snapshots: deque[BucketReading] = deque()
        self._sent: list[tuple[float, float, float]] = []  # (admitted at, base, cached)
        self._admitted: deque[tuple[float, float, float]] = deque()  # every admission
        # each call in flight (admitted, neither answered nor rejected) by its last admission,
        # oldest first
        self._in_flight: dict[int, float] = {}
        self.windows: deque[ChargeWindow] = deque(maxlen=KEEP)
        self.dips: deque[ChargeWindow] = deque(maxlen=KEEP)

    def admitted(self, call: int, at: float, base: float, cached: float) -> None:
        """A call the pacer admitted (the provider may still reject it; a retry is admitted
        again, and the provider charges its last admission)."""
        self._in_flight.pop(call, None)  # re-inserted: the dict stays in admission order
        self._in_flight[call] = at
        self._admitted.append((at, base, cached))
        while self._admitted and self._admitted[0][0] < at - DRAIN_S:
            self._admitted.popleft()

    def rejected(self, call: int) -> None:
        """The provider rejected the call: it charged no tokens for it (until it is admitted
        again)."""
        self._in_flight.pop(call, None)

    def drain(self, now: float, limit_per_minute: float, remaining: float) -> ChargeWindow | None:
        """A 429 of the counted class says its bucket is at ``remaining``: the span from the
        oldest snapshot within ``DRAIN_S``, with everything admitted since (admitted, not
        accepted: it over-states what was sent, so it can only make "cache reads count" harder
        to conclude)."""
        start = next((s for s in self._snapshots if s.at >= now - DRAIN_S), None)
        if start is None or start.limit_per_s != limit_per_minute / 60.0:
            return None
        inside = [a for a in self._admitted if a[0] >= start.at]
        return ChargeWindow.between(
            start, now, remaining, sum(b for _, b, _ in inside), sum(c for _, _, c in inside)
        )

    def sent(self, call: int, now: float, base: float, cached: float) -> None:
        """A call the provider accepted at ``now``: ``base`` counts either way, ``cached`` are
        cache reads; attributed to its last admission."""
        self._sent.append((self._in_flight.pop(call, now), base, cached))

    def complete_before(self, now: float) -> float:
        """Every call admitted before this has been answered or rejected."""
        return next(iter(self._in_flight.values()), now)

    def observe(self, now: float, limit_per_minute: float | None, remaining: float | None) -> bool:
        """A tick's view of the counted class; True when a new span was closed."""
        if limit_per_minute is None or remaining is None or limit_per_minute <= 0:
            self._snapshots.clear()  # a gap in what the provider states: spans restart
            return False
        self._snapshots.append(BucketReading(now, limit_per_minute / 60.0, remaining))
        if len(self._snapshots) <= SPAN_TICKS:
            return False
        start, end = self._snapshots[0], self._snapshots[SPAN_TICKS]
        if end.at > self.complete_before(now):
            return False
        for _ in range(SPAN_TICKS):
            self._snapshots.popleft()
        # responses arrive out of admission order: filter, keep what is not yet spanned
        self._sent = [s for s in self._sent if s[0] >= start.at]
        inside = [s for s in self._sent if s[0] < end.at]
        base = sum(b for _, b, _ in inside)
        cached = sum(c for _, _, c in inside)
        if start.limit_per_s != end.limit_per_s:
            return False
        dip = dip_window(end, inside)
        if dip is not None:
            self.dips.append(dip)
        self.windows.append(ChargeWindow.between(start, end.at, end.remaining, base, cached))
        return True

    def restart(self) -> None:
        """Evidence gathered under the old belief is spent."""
        self.windows.clear()
        self.dips.clear()
