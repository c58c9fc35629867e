"""What the ledger says about the provider's counted-token bucket and what was sent into it:
the two readings the cache-counting inference (``planner.cache_counting``) compares.

* ``counted_bucket``: the latest stated limit and remaining of the alias's counted token class
  (``alias_observations``, as the gateway's recorder last flushed it), with when it was seen,
  and the gateway's word, with that observation, that every call of the alias requested before
  a time has been answered and recorded: a span of requests ending by then is complete.
* ``sent_between``: the tokens of the calls the provider accepted, requested in a span, split
  into what counts either way (uncached input, plus output for a combined limit) and cache
  reads.
* ``longest_recent_wait``: the longest time from a call's request to its answer (pacer wait plus
  latency) over a recent look-back: how long a span waits for its calls when the gateway's
  observation does not say (one written by an older gateway).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, func, select

from ledger.clock import as_utc
from ledger.models import COMPLETE_BEFORE_KEY, SERVED_STATUSES, AliasObservation, LlmCall
from ledger.pacer_window import stated_limits, stated_remaining
from planner.budget_state import BudgetClass, TokenClass
from planner.budgets import header_classes
from planner.cache_counting import BucketReading

__all__ = ["counted_bucket", "longest_recent_wait", "sent_between"]


def counted_bucket(
    conn: Connection, alias: str, token_class: TokenClass
) -> tuple[BucketReading | None, float | None]:
    """From ``alias``'s latest observation, in one read: the stated limit and remaining of its
    counted token class (None: not stated), and the epoch seconds before which every call the
    gateway saw requested had been answered and recorded (None: it does not say)."""
    row = conn.execute(
        select(AliasObservation.observed_at, AliasObservation.limits).where(
            AliasObservation.alias == alias
        )
    ).first()
    if row is None or not isinstance(row[1], dict):
        return None, None
    stated = row[1].get(COMPLETE_BEFORE_KEY)
    complete = (
        float(stated) if isinstance(stated, int | float) and not isinstance(stated, bool) else None
    )
    limits = header_classes(
        stated_limits(row[1].get("limits")), token_class=token_class, has_output_budget=False
    )
    left = header_classes(
        stated_remaining(row[1].get("remaining")), token_class=token_class, has_output_budget=False
    )
    limit, remaining = limits.get(BudgetClass.TOKENS), left.get(BudgetClass.TOKENS)
    if limit is None or remaining is None:
        return None, complete
    return BucketReading(as_utc(row[0]).timestamp(), limit / 60.0, remaining), complete


def sent_between(
    conn: Connection, alias: str, start: datetime, end: datetime, token_class: TokenClass
) -> tuple[float, float]:
    """(base, cache reads) of the accepted calls of ``alias`` requested in [start, end)."""
    base = LlmCall.input_tokens - LlmCall.cached_input_tokens
    if token_class == "combined":
        base = base + LlmCall.output_tokens
    row = conn.execute(
        select(
            func.coalesce(func.sum(base), 0),
            func.coalesce(func.sum(LlmCall.cached_input_tokens), 0),
        ).where(
            LlmCall.alias == alias,
            LlmCall.status.in_(SERVED_STATUSES),
            LlmCall.requested_at >= start,
            LlmCall.requested_at < end,
        )
    ).one()
    return float(row[0]), float(row[1])


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
