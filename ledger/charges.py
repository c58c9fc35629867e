"""What the ledger says about the provider's counted-token bucket and what was sent into it:
the two readings the cache-counting inference (``planner.cache_counting``) compares.

* ``counted_bucket``: the latest stated limit and remaining of the alias's counted token class
  (``alias_observations``, as the gateway's recorder last flushed it), with when it was seen,
  and the gateway's word, with that observation, that every call of the alias requested before
  a time has been answered and recorded: a span of requests ending by then is complete.
* ``sent_between``: the tokens of the calls the provider accepted, requested in a span, split
  into what counts either way (uncached input, plus output for a combined limit) and cache
  reads; or of the served retries alone whose send the ledger does not keep (rows written
  before ``llm_calls.sent_at``).
* ``calls_sent_between``: the same calls one by one, with when each was sent upstream
  (``llm_calls.sent_at``, or on older rows its request plus its pacer wait), for the dip of a
  reading (``planner.cache_counting.dip_window``).
* ``throttled_bucket``: the first token 429 of the latest storm, as a reading of the counted
  token bucket (empty, at the 429).
* ``stated_complete_before``: that word alone (``tasks.plan_settle``).
* ``longest_recent_wait``: the longest time from a call's request to its answer (pacer wait plus
  latency) over a recent look-back: how long a span waits for its calls when the gateway's
  observation does not say (one written by an older gateway).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, Connection, func, or_, select

from ledger.clock import as_utc
from ledger.models import (
    ANSWERED_SENT_AT_KEY,
    COMPLETE_BEFORE_KEY,
    SERVED_STATUSES,
    THROTTLE_READING_KEY,
    AliasObservation,
    LlmCall,
)
from ledger.pacer_window import sent_epoch, stated_limits, stated_remaining
from ledger.throttle_reading import TOKEN_LIMIT_TYPES, ThrottleReading
from planner.budget_state import BudgetClass, TokenClass
from planner.budgets import header_classes
from planner.cache_counting import BucketReading

__all__ = [
    "calls_sent_between",
    "counted_bucket",
    "longest_recent_wait",
    "sent_between",
    "stated_complete_before",
    "throttled_bucket",
]


def counted_bucket(
    conn: Connection, alias: str, token_class: TokenClass
) -> tuple[BucketReading | None, float | None]:
    """From ``alias``'s latest observation, in one read: the stated limit and remaining of its
    counted token class (None: not stated), charged through the send of the attempt that carried
    it where the gateway says when that was, and the epoch seconds before which every call the
    gateway saw requested had been answered and recorded (None: it does not say)."""
    row = conn.execute(
        select(AliasObservation.observed_at, AliasObservation.limits).where(
            AliasObservation.alias == alias
        )
    ).first()
    if row is None or not isinstance(row[1], dict):
        return None, None
    complete = _epoch(row[1].get(COMPLETE_BEFORE_KEY))
    observed_at = as_utc(row[0]).timestamp()
    sent_at = _epoch(row[1].get(ANSWERED_SENT_AT_KEY))
    limits = header_classes(
        stated_limits(row[1].get("limits")), token_class=token_class, has_output_budget=False
    )
    left = header_classes(
        stated_remaining(row[1].get("remaining")), token_class=token_class, has_output_budget=False
    )
    limit, remaining = limits.get(BudgetClass.TOKENS), left.get(BudgetClass.TOKENS)
    if limit is None or remaining is None:
        return None, complete
    through = None if sent_at is None else min(sent_at, observed_at)
    return BucketReading(observed_at, limit / 60.0, remaining, through), complete


def throttled_bucket(
    conn: Connection, alias: str, token_class: TokenClass
) -> tuple[BucketReading, bool] | None:
    """The first token 429 of ``alias``'s latest storm (``ledger.throttle_reading``), as a
    reading of its counted token bucket (stated limit and remaining, at and charged through the
    send of its attempt), and whether the gateway judged it to say cache reads count (None: no
    such 429 kept, or it stated no bucket of that class)."""
    raw = conn.execute(
        select(AliasObservation.limits).where(AliasObservation.alias == alias)
    ).scalar_one_or_none()
    reading = ThrottleReading.from_json(
        raw.get(THROTTLE_READING_KEY) if isinstance(raw, dict) else None
    )
    if reading is None or reading.limit_type not in TOKEN_LIMIT_TYPES:
        return None
    limits = header_classes(
        stated_limits(reading.limits), token_class=token_class, has_output_budget=False
    )
    left = header_classes(
        stated_remaining(reading.remaining), token_class=token_class, has_output_budget=False
    )
    limit, remaining = limits.get(BudgetClass.TOKENS), left.get(BudgetClass.TOKENS)
    if limit is None or remaining is None:
        return None
    sent_at = reading.sent_at.timestamp()
    return BucketReading(sent_at, limit / 60.0, remaining, sent_at), reading.gateway_counts


def stated_complete_before(conn: Connection, alias: str) -> float | None:
    """The gateway's word, with ``alias``'s latest observation, that every call requested
    before this time (epoch seconds) has been answered and recorded (None: it does not say)."""
    raw = conn.execute(
        select(AliasObservation.limits).where(AliasObservation.alias == alias)
    ).scalar_one_or_none()
    return _epoch(raw.get(COMPLETE_BEFORE_KEY)) if isinstance(raw, dict) else None


def _epoch(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def sent_between(
    conn: Connection,
    alias: str,
    start: datetime,
    end: datetime,
    token_class: TokenClass,
    *,
    unplaced_retries: bool = False,
) -> tuple[float, float]:
    """(base, cache reads) of the accepted calls of ``alias`` requested in [start, end);
    ``unplaced_retries``: of the served retries alone whose send the ledger does not keep
    (rows written before ``llm_calls.sent_at``: they went out after waits unknown)."""
    conditions = [
        LlmCall.alias == alias,
        LlmCall.status.in_(SERVED_STATUSES),
        LlmCall.requested_at >= start,
        LlmCall.requested_at < end,
    ]
    if unplaced_retries:
        conditions.extend((LlmCall.retry.is_(True), LlmCall.sent_at.is_(None)))
    row = conn.execute(
        select(
            func.coalesce(func.sum(_counted_base(token_class)), 0),
            func.coalesce(func.sum(LlmCall.cached_input_tokens), 0),
        ).where(*conditions)
    ).one()
    return float(row[0]), float(row[1])


def _counted_base(token_class: TokenClass) -> ColumnElement[int]:
    """A call's tokens that count whatever the belief: uncached input (and output for a
    combined limit)."""
    base = LlmCall.input_tokens - LlmCall.cached_input_tokens
    if token_class == "combined":
        base = base + LlmCall.output_tokens
    return base


def calls_sent_between(
    conn: Connection, alias: str, start: datetime, end: datetime, token_class: TokenClass
) -> list[tuple[float, float, float]]:
    """(sent at, base, cache reads) of the accepted attempts of ``alias`` requested in
    [start, end) whose send the ledger keeps; sent at: epoch seconds
    (``pacer_window.sent_epoch``). A served retry written before ``llm_calls.sent_at`` is left
    out: its row does not say when it went out, after the 429s and waits before it (a span
    weighs such retries apart: ``sent_between``'s ``unplaced_retries``). Leaving it out
    under-states what was sent, which can only keep the belief that cache reads count."""
    rows = conn.execute(
        select(
            LlmCall.requested_at,
            LlmCall.pacer_wait_s,
            LlmCall.sent_at,
            _counted_base(token_class),
            LlmCall.cached_input_tokens,
        ).where(
            LlmCall.alias == alias,
            LlmCall.status.in_(SERVED_STATUSES),
            or_(LlmCall.retry.is_(False), LlmCall.sent_at.is_not(None)),
            LlmCall.requested_at >= start,
            LlmCall.requested_at < end,
        )
    ).all()
    return [(sent_epoch(at, wait, sent), float(b), float(c)) for at, wait, sent, b, c in rows]


def longest_recent_wait(
    conn: Connection, alias: str, since: datetime, until: datetime
) -> float | None:
    """The longest pacer wait plus latency of ``alias``'s calls requested in [since, until]
    (None: none recorded). A call is recorded at its answer, so a span of requests is complete
    only this long after its end."""
    value = conn.execute(
        select(func.max(LlmCall.pacer_wait_s + LlmCall.latency_s)).where(
            LlmCall.alias == alias,
            LlmCall.requested_at >= since,
            LlmCall.requested_at <= until,
        )
    ).scalar_one()
    return None if value is None else float(value)
