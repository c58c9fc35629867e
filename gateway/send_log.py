"""What the gateway sent upstream per alias over the last minutes, to judge a token 429 at once.

A 429 of the counted token class that states its bucket empty says what the provider charged
since a reading shortly before it (``planner.cache_counting.throttle_window``): a provider that
counts the cache reads the pacer does not charge empties its bucket with the uncached part a
fraction of it, and each second the pacer goes on not charging them is a second of 429 storm.
The planner tick can judge it only once every call sent before it is in the ledger, a minute
later with slow calls; the gateway knows at the 429 what it sent. So it keeps, per alias, each
attempt it sent (when, and once answered, the usage the provider reported; a rejected one is
charged nothing) and the counted bucket each success's headers stated, and at each token 429
(at most one per ``JUDGE_EVERY_S``) it judges the span from the earliest reading within
``THROTTLE_SPAN_S`` before it: it knows when every attempt went out, retries too, so a 429 deep
in a storm says as much as its first (which may find too little sent since a reading to say
anything). An attempt still in flight counts all its input as
uncached: its usage is not known yet, and the pacer's split (the previous prompt as cache
reads) is a guess that a cache miss proves wrong; over-stating what was sent only makes
"cache reads count" harder to conclude. Times are the gateway's clock (epoch seconds).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from planner.budgets import BudgetClass, TokenClass, header_classes
from planner.cache_counting import (
    THROTTLE_SPAN_S,
    BucketReading,
    ChargeWindow,
    throttle_window,
)
from planner.classify import LimitType

__all__ = ["JUDGE_EVERY_S", "KEEP_S", "SendLog"]

KEEP_S = 120.0  # attempts and readings kept this long (a span reaches THROTTLE_SPAN_S back)
JUDGE_EVERY_S = 1.0  # token 429s judged at most this often per alias (a storm brings hundreds)
_IN_FLIGHT = -1.0


@dataclass
class _Attempt:
    sent_at: float
    input_tokens: float
    uncached: float = _IN_FLIGHT  # the provider's word once answered
    cached: float = 0.0
    rejected: bool = False


@dataclass
class _AliasLog:
    attempts: dict[int, _Attempt] = field(default_factory=dict)  # in send order
    readings: deque[BucketReading] = field(default_factory=deque)
    judged_at: float = float("-inf")


class SendLog:
    """Attempts sent and bucket readings per alias (see the module docstring)."""

    def __init__(self) -> None:
        self._aliases: dict[str, _AliasLog] = {}
        self._ids = itertools.count()
        self._owner: dict[int, str] = {}

    def sent(self, alias: str, at: float, input_tokens: float) -> int:
        """An attempt went upstream at ``at``; returns its handle."""
        log = self._aliases.setdefault(alias, _AliasLog())
        attempt = next(self._ids)
        log.attempts[attempt] = _Attempt(at, float(input_tokens))
        self._owner[attempt] = alias
        self._trim(log, at)
        return attempt

    def answered(self, attempt: int, uncached: float, cached: float) -> None:
        """The provider accepted it and reported this usage (input tokens)."""
        found = self._find(attempt)
        if found is not None:
            found.uncached, found.cached = float(uncached), float(cached)

    def rejected(self, attempt: int) -> None:
        """The provider rejected it (a 429): it charged nothing."""
        found = self._find(attempt)
        if found is not None:
            found.rejected = True

    def read(
        self,
        alias: str,
        at: float,
        sent_at: float,
        limits: Mapping[LimitType, float],
        remaining: Mapping[LimitType, float],
        token_class: TokenClass,
    ) -> None:
        """A success's headers, answered at ``at`` to an attempt sent at ``sent_at``, stated the
        alias's buckets (as of some moment between: the span starts at ``at``, the least
        refill, and takes the calls sent from ``sent_at`` on, some perhaps charged already)."""
        reading = _counted(at, limits, remaining, token_class, sent_at)
        if reading is None:
            return
        log = self._aliases.setdefault(alias, _AliasLog())
        log.readings.append(reading)
        self._trim(log, at)

    def window_at(
        self,
        alias: str,
        at: float,
        limits: Mapping[LimitType, float],
        remaining: Mapping[LimitType, float],
        token_class: TokenClass,
    ) -> ChargeWindow | None:
        """A token 429 of an attempt sent at ``at`` stated the buckets: the span from the
        earliest reading within ``THROTTLE_SPAN_S`` before it, with what was sent in it (None:
        within ``JUDGE_EVERY_S`` of the last one judged, no such reading, or no bucket of the
        counted class stated)."""
        log = self._aliases.setdefault(alias, _AliasLog())
        throttled = _counted(at, limits, remaining, token_class)
        if throttled is None or at - log.judged_at < JUDGE_EVERY_S:
            return None
        log.judged_at = at
        start = next(
            (
                r
                for r in log.readings
                if at - THROTTLE_SPAN_S <= r.at < at and r.limit_per_s == throttled.limit_per_s
            ),
            None,
        )
        if start is None:
            return None
        sent = [
            (a.sent_at, a.input_tokens, 0.0)
            if a.uncached == _IN_FLIGHT
            else (a.sent_at, a.uncached, a.cached)
            for a in log.attempts.values()
            if not a.rejected
        ]
        return throttle_window(start, throttled, sent)

    def _find(self, attempt: int) -> _Attempt | None:
        alias = self._owner.get(attempt)
        return None if alias is None else self._aliases[alias].attempts.get(attempt)

    def _trim(self, log: _AliasLog, now: float) -> None:
        while log.attempts:
            oldest = next(iter(log.attempts))
            if log.attempts[oldest].sent_at >= now - KEEP_S:
                break
            del log.attempts[oldest]
            self._owner.pop(oldest, None)
        while log.readings and log.readings[0].at < now - KEEP_S:
            log.readings.popleft()


def _counted(
    at: float,
    limits: Mapping[LimitType, float],
    remaining: Mapping[LimitType, float],
    token_class: TokenClass,
    charged_through: float | None = None,
) -> BucketReading | None:
    """The counted token bucket as stated at ``at`` (None: not stated)."""
    limit = header_classes(limits, token_class=token_class, has_output_budget=False).get(
        BudgetClass.TOKENS
    )
    left = header_classes(remaining, token_class=token_class, has_output_budget=False).get(
        BudgetClass.TOKENS
    )
    if limit is None or left is None or limit <= 0:
        return None
    return BucketReading(at, limit / 60.0, left, charged_through)
