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

A 429 of the counted class that states its bucket is judged as the planner tick judges the
gateway's (``tasks.plan_counting``): the first of a storm (a later one replaces it only after a
quiet ``STORM_GAP_S``: ``ledger.throttle_reading``), once, when every call admitted before it has
been answered, against the tick's reading at most ``THROTTLE_SPAN_S`` before it
(``planner.cache_counting.throttle_window``). The calls accepted at their first attempt count
where they were admitted; those accepted after a rejection (retries: the gateway's ledger does not
keep when their last attempt went out) count as sent in the span wherever they were first
admitted within ``RETRY_LOOKBACK_S`` before the 429.

The gateway judges token 429s at once (``gateway.send_log``): ``throttled`` returns the span
from the earliest reading within ``THROTTLE_SPAN_S`` before a 429 (at most one per
``JUDGE_EVERY_S``; readings are the ticks' and, at most one per ``JUDGE_EVERY_S``, the
successes' headers, ``read``), with the calls admitted in it that the provider accepted:
answered ones at their tokens, ones still in flight at all their input as uncached (the gateway
does not know their usage yet).
"""

from __future__ import annotations

import math
from collections import deque

from gateway.send_log import JUDGE_EVERY_S, KEEP_S
from planner.cache_counting import (
    RETRY_LOOKBACK_S,
    STORM_GAP_S,
    THROTTLE_SPAN_S,
    BucketReading,
    ChargeWindow,
    dip_window,
    throttle_window,
)

SPAN_TICKS = 1  # a span is 1 planner tick (15 s)
KEEP = 8  # spans kept as evidence


class ChargeTracker:
    """Spans of sent tokens against the provider's stated bucket (see the module docstring)."""

    def __init__(self) -> None:
        self._snapshots: deque[BucketReading] = deque()
        self._sent: list[tuple[float, float, float]] = []  # (admitted at, base, cached)
        # the first admission of each call not yet answered, and the calls rejected since
        self._first_admitted: dict[int, float] = {}
        self._retried: set[int] = set()
        # the calls accepted, answered (the gateway's send log and the ledger): (admitted at,
        # first admitted at, whether a rejection came before, base, cached)
        self._answered: deque[tuple[float, float, bool, float, float]] = deque()
        # the first 429 of the latest storm, when the storm's last came, the last one judged
        self._throttled: BucketReading | None = None
        self._storm_last = -math.inf
        self._judged_at = -math.inf
        # each call in flight (admitted, neither answered nor rejected) by its last admission,
        # oldest first
        self._in_flight: dict[int, float] = {}
        self._in_flight_input: dict[int, float] = {}  # their whole input (base + cached)
        self._readings: deque[BucketReading] = deque()  # the successes' headers
        self._gateway_judged = -math.inf
        self.windows: deque[ChargeWindow] = deque(maxlen=KEEP)
        self.dips: deque[ChargeWindow] = deque(maxlen=KEEP)

    def admitted(self, call: int, at: float, base: float, cached: float) -> None:
        """A call the pacer admitted (the provider may still reject it; a retry is admitted
        again, and the provider charges its last admission)."""
        self._in_flight.pop(call, None)  # re-inserted: the dict stays in admission order
        self._in_flight[call] = at
        self._in_flight_input[call] = base + cached
        self._first_admitted.setdefault(call, at)

    def rejected(self, call: int) -> None:
        """The provider rejected the call: it charged no tokens for it (until it is admitted
        again)."""
        self._in_flight.pop(call, None)
        self._in_flight_input.pop(call, None)
        self._retried.add(call)

    def read(self, at: float, limit_per_minute: float, remaining: float) -> None:
        """A success's headers stated the counted bucket (the gateway's reading)."""
        if self._readings and at - self._readings[-1].at < JUDGE_EVERY_S:
            return
        self._readings.append(BucketReading(at, limit_per_minute / 60.0, remaining))
        while self._readings and self._readings[0].at < at - KEEP_S:
            self._readings.popleft()

    def throttled(
        self, at: float, limit_per_minute: float, remaining: float
    ) -> ChargeWindow | None:
        """A 429 of the counted class stated its bucket: kept for the tick when it starts a
        storm (``judge_throttle``); returns the span the gateway judges at once (module
        docstring; None: within ``JUDGE_EVERY_S`` of the last, or no reading before it)."""
        throttled = BucketReading(at, limit_per_minute / 60.0, remaining)
        if self._throttled is None or at - self._storm_last >= STORM_GAP_S:
            self._throttled = throttled
        self._storm_last = max(self._storm_last, at)
        if at - self._gateway_judged < JUDGE_EVERY_S:
            return None
        self._gateway_judged = at
        start = self._start_of(throttled, [*self._readings, *self._snapshots])
        if start is None:
            return None
        in_flight = [
            (sent, self._in_flight_input[call], 0.0)
            for call, sent in self._in_flight.items()
            if call in self._in_flight_input
        ]
        answered = [(at, b, c) for at, _, _, b, c in self._answered]
        return throttle_window(start, throttled, [*answered, *in_flight])

    @staticmethod
    def _start_of(throttled: BucketReading, readings: list[BucketReading]) -> BucketReading | None:
        """The earliest reading within ``THROTTLE_SPAN_S`` before a 429's, of its limit."""
        inside = [
            r
            for r in readings
            if throttled.at - THROTTLE_SPAN_S <= r.at < throttled.at
            and r.limit_per_s == throttled.limit_per_s
        ]
        return min(inside, key=lambda r: r.at, default=None)

    def judge_throttle(self, now: float) -> ChargeWindow | None:
        """The tick's judgement: the kept 429's span (``planner.cache_counting.throttle_window``), once, when every
        call admitted before it has been answered; None before that, once judged, and when no
        tick's reading is within ``THROTTLE_SPAN_S`` before it."""
        throttled = self._throttled
        if throttled is None or throttled.at <= self._judged_at:
            return None
        if throttled.at > self.complete_before(now):
            return None
        self._judged_at = throttled.at
        start = self._start_of(throttled, list(self._snapshots))
        if start is None:
            return None
        since = start.at - RETRY_LOOKBACK_S
        first_tries = [(at, b, c) for at, _, retried, b, c in self._answered if not retried]
        retries = [
            (b, c)
            for _, first, retried, b, c in self._answered
            if retried and since <= first < throttled.at
        ]
        unplaced = (sum(b for b, _ in retries), sum(c for _, c in retries))
        return throttle_window(start, throttled, first_tries, unplaced)

    def sent(self, call: int, now: float, base: float, cached: float) -> None:
        """A call the provider accepted at ``now``: ``base`` counts either way, ``cached`` are
        cache reads; attributed to its last admission."""
        at = self._in_flight.pop(call, now)
        self._in_flight_input.pop(call, None)
        self._sent.append((at, base, cached))
        first = self._first_admitted.pop(call, at)
        retried = call in self._retried
        self._retried.discard(call)
        self._answered.append((at, first, retried, base, cached))
        # answered out of admission order: trimmed with a lookback of slack
        while self._answered and self._answered[0][0] < now - 2 * RETRY_LOOKBACK_S:
            self._answered.popleft()

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
        if self._throttled is not None:
            self._judged_at = max(self._judged_at, self._throttled.at)
