"""What the gateway recorded for an alias since the planner's last tick, read from the ledger.

* ``read_window``: the ``llm_calls`` of one alias after the watermark id — 429s by limit type
  (a call's first, not its retries': ``llm_calls.retry``, unless the provider answered
  nothing else in the window: ``planner.retry_evidence``), overloads, spend errors (and the
  runs they hit), the counted usage of each budget class, the largest served call of each
  token class, the pacer wait — as
  ``WindowCalls``; ``latest_call_id`` starts the watermark;
* ``accepted_rates``: what the provider accepted, answered over a time span (a repeated cut's
  measure);
* ``drained_rates``: how fast the provider's bucket of each class was drained up to a time by
  the calls sent upstream before it (``planner.drain``: the blame of a 429 that names no
  limit), and the token rate counted the other way (``planner.drain_belief``: the test of the
  cache-counting belief without headers);
* ``fresh_header_limits``: the provider's latest stated limits when they were observed after the
  previous tick (an old observation must not keep a stale seed looking fresh);
  ``stated_limits`` / ``stated_remaining`` read such stored limits back.

The window is an id watermark, not a time range: the gateway's recorder writes calls in
batches, so a call requested before a tick can land after it, and a time range would miss it.
(An id taken by a batch that commits after a later id was read is missed; batches commit
within milliseconds, so that is rare and costs one observation, never a wrong cut.)

Kept apart from the controller's own rows (``ledger.pacer_state``): these are reads of what the
gateway wrote (``llm_calls``, ``alias_observations``), and the charges and pacer controls read
the stated limits without the controller's state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, select

from ledger.clock import as_utc
from ledger.models import SERVED_STATUSES, THROTTLE_LIMITS_KEY, AliasObservation, LlmCall
from planner.budgets import BudgetClass, Budgets, TokenClass
from planner.classify import LimitType
from planner.drain import LOOKBACK_S, drained_rate
from planner.retry_evidence import unanswered_retry_throttles

__all__ = [
    "DrainedRates",
    "WindowCalls",
    "accepted_rates",
    "drained_rates",
    "fresh_header_limits",
    "latest_call_id",
    "read_window",
    "sent_epoch",
    "stated_limits",
    "stated_remaining",
]

#: how long before a span a call may have been requested and still be sent (or answered)
#: within it: the longest pacer wait (plus the gateway's retries, and latency) read for. A call
#: missed for it sits at the far end of the drain's lookback, where it weighs least; a
#: cooldown's accepted rate misses a call that took this long only if it was answered in it
SEND_SLACK_S = 300.0

_RATE_TYPES = {
    LimitType.REQUESTS.value,
    LimitType.TOKENS.value,
    LimitType.INPUT_TOKENS.value,
    LimitType.OUTPUT_TOKENS.value,
    LimitType.DAILY.value,  # the controller backs off on it, cutting nothing
    LimitType.UNKNOWN.value,
}
_OVERLOAD_STATUS = (503, 529)


@dataclass(frozen=True)
class WindowCalls:
    """What the gateway recorded for one alias after the watermark (``llm_calls`` rows)."""

    calls: int
    throttles: tuple[LimitType, ...]
    overloads: int
    spend_errors: int
    spend_runs: tuple[str, ...]
    usage: Mapping[BudgetClass, float]  # summed over the window (in-flight: token-seconds)
    last_call_id: int
    pacer_wait_s: float = 0.0  # summed over the window's calls
    answered: int = 0  # calls the provider answered with a success (ends the launch ramp)
    # per token class, the tokens of the largest call the provider served (rule 8 of
    # planner.budgets: one call accepted whole proves its bucket held it)
    largest: Mapping[BudgetClass, float] = field(default_factory=dict)

    def largest_accepted(self) -> dict[BudgetClass, float] | None:
        """``WindowObservation.largest_accepted``: None when the provider served nothing."""
        return dict(self.largest) if self.answered else None

    def stretch_progress(self, mean_gap_s: float) -> float | None:
        """1 / (1 + pacer wait per call / a task's mean gap between calls); None: no calls."""
        if self.calls == 0 or mean_gap_s <= 0 or not math.isfinite(mean_gap_s):
            return None
        return 1.0 / (1.0 + (self.pacer_wait_s / self.calls) / mean_gap_s)

    def utilisation(self, budgets: Budgets, window_s: float) -> dict[BudgetClass, float]:
        """Share of each budget the window used (rates over ``window_s``)."""
        out: dict[BudgetClass, float] = {}
        for cls in budgets.classes():
            budget = budgets.get(cls)
            if budget is not None and budget > 0 and window_s > 0:
                out[cls] = self.usage.get(cls, 0.0) / window_s / budget
        return out


def latest_call_id(conn: Connection) -> int:
    """The newest ``llm_calls`` id (0 when there is none)."""
    return int(conn.execute(select(func.max(LlmCall.id))).scalar_one() or 0)


def _counted_tokens(token_class: TokenClass, cached_input_counts: bool) -> Any:
    """The SQL expression of a call's tokens in the alias's counted token class."""
    counted: Any = LlmCall.input_tokens - LlmCall.cached_input_tokens
    if cached_input_counts:
        counted = counted + LlmCall.cached_input_tokens
    if token_class == "combined":
        counted = counted + LlmCall.output_tokens
    return counted


def sent_epoch(
    requested_at: datetime, pacer_wait_s: float | None, sent_at: datetime | None
) -> float:
    """When a recorded attempt went upstream (epoch seconds), the moment the provider charged
    it: its ``sent_at``; on a row written before the gateway recorded that, its request plus
    its pacer wait (a retry's then placed at its first attempt's send)."""
    if sent_at is not None:
        return as_utc(sent_at).timestamp()
    return as_utc(requested_at).timestamp() + float(pacer_wait_s or 0.0)


def accepted_rates(
    conn: Connection,
    alias: str,
    since: datetime,
    until: datetime,
    *,
    token_class: TokenClass,
    cached_input_counts: bool,
) -> dict[BudgetClass, float]:
    """What the provider accepted for ``alias`` between ``since`` and ``until`` (the calls it
    served, ``SERVED_STATUSES``, answered then: request plus pacer wait plus latency), per
    budget class, per second: the measurement a repeated 429 cut reads
    (``WindowObservation.delivered``). Answered, as the simulator's planner counts them: a
    span ending at the tick holds every call answered in it, where the calls requested in it
    are in the ledger only once answered, and a span as short as a cooldown would miss the
    slow ones (with 10 s calls, a third of a 30 s span's)."""
    span = (until - since).total_seconds()
    if span <= 0:
        return {}
    rows = conn.execute(
        select(
            LlmCall.requested_at,
            LlmCall.pacer_wait_s,
            LlmCall.sent_at,
            LlmCall.latency_s,
            _counted_tokens(token_class, cached_input_counts),
            LlmCall.output_tokens,
        ).where(
            LlmCall.alias == alias,
            LlmCall.status.in_(SERVED_STATUSES),
            LlmCall.requested_at >= since - timedelta(seconds=SEND_SLACK_S),
            LlmCall.requested_at <= until,
        )
    ).all()
    start, end = as_utc(since).timestamp(), as_utc(until).timestamp()
    calls = counted = output = 0.0
    for requested_at, wait, sent_at, latency, tokens, out in rows:
        answered = sent_epoch(requested_at, wait, sent_at) + float(latency or 0.0)
        if start <= answered <= end:
            calls += 1
            counted += float(tokens or 0)
            output += float(out or 0)
    return {
        BudgetClass.REQUESTS: calls / span,
        BudgetClass.TOKENS: counted / span,
        BudgetClass.OUTPUT_TOKENS: output / span,
    }


@dataclass(frozen=True)
class DrainedRates:
    """How fast each class's bucket was drained (per second), tokens counted as the alias
    believes; and the token rate counted the other way (cache reads counted or not)."""

    rates: dict[BudgetClass, float]
    other_tokens: float


def drained_rates(
    conn: Connection,
    alias: str,
    until: datetime,
    *,
    token_class: TokenClass,
    cached_input_counts: bool,
) -> DrainedRates:
    """Per budget class, how fast the provider's per-minute bucket was drained up to ``until``
    (``planner.drain.drained_rate``) by the calls it served (``SERVED_STATUSES``) of those
    sent over the ``planner.drain.LOOKBACK_S`` before it, tokens counted both ways in one
    read. Rejected calls are left out: what a rejection costs the request bucket is the
    provider's business, and counted as a whole request each, a storm's rejections read as a
    drain faster than the limit for the whole lookback.

    A call drains the bucket when it is sent upstream, its ``sent_at`` (``sent_epoch``; as in
    the simulator, whose planner reads the calls at their admission). Counted at its request,
    a call would be counted a pacer wait early and the rate read low by about that wait over
    the span read (``bucket_s`` plus the time since the bucket was full): a 10 s wait at a 429
    after a minute at the limit puts it 8% under the limit. A served retry is counted at its
    own send, after its predecessors' ``retry-after``."""
    since = until - timedelta(seconds=LOOKBACK_S)
    rows = conn.execute(
        select(
            LlmCall.requested_at,
            LlmCall.pacer_wait_s,
            LlmCall.sent_at,
            _counted_tokens(token_class, cached_input_counts),
            _counted_tokens(token_class, not cached_input_counts),
            LlmCall.output_tokens,
        ).where(
            LlmCall.alias == alias,
            LlmCall.requested_at >= since - timedelta(seconds=SEND_SLACK_S),
            LlmCall.requested_at <= until,
            LlmCall.status.in_(SERVED_STATUSES),
        )
    ).all()
    start, end = as_utc(since).timestamp(), as_utc(until).timestamp()
    events: dict[BudgetClass, list[tuple[float, float]]] = {
        BudgetClass.REQUESTS: [],
        BudgetClass.TOKENS: [],
        BudgetClass.OUTPUT_TOKENS: [],
    }
    other: list[tuple[float, float]] = []
    for requested_at, wait, sent_at, counted, counted_other, output in rows:
        at = sent_epoch(requested_at, wait, sent_at)
        if not start <= at <= end:
            continue
        events[BudgetClass.REQUESTS].append((at, 1.0))
        events[BudgetClass.TOKENS].append((at, float(counted or 0)))
        events[BudgetClass.OUTPUT_TOKENS].append((at, float(output or 0)))
        other.append((at, float(counted_other or 0)))
    return DrainedRates(
        rates={cls: drained_rate(evs, end) for cls, evs in events.items()},
        other_tokens=drained_rate(other, end),
    )


def read_window(
    conn: Connection,
    alias: str,
    after_id: int,
    *,
    token_class: TokenClass,
    cached_input_counts: bool,
) -> WindowCalls:
    """Aggregate the alias's ``llm_calls`` with id > ``after_id``."""
    ok = LlmCall.status.in_(SERVED_STATUSES)
    counted = _counted_tokens(token_class, cached_input_counts)
    zero = 0

    def ok_sum(expr: Any) -> Any:
        return func.coalesce(func.sum(func.coalesce(expr, zero)).filter(ok), zero)

    base = (LlmCall.alias == alias, LlmCall.id > after_id)
    agg = conn.execute(
        select(
            func.count(),
            func.coalesce(func.max(LlmCall.id), after_id),
            ok_sum(counted),
            ok_sum(LlmCall.output_tokens),
            ok_sum((LlmCall.input_tokens + LlmCall.output_tokens) * LlmCall.latency_s),
            func.coalesce(func.sum(LlmCall.pacer_wait_s), 0.0),
            func.count().filter(ok),
            func.coalesce(func.max(func.coalesce(counted, zero)).filter(ok), zero),
            func.coalesce(func.max(func.coalesce(LlmCall.output_tokens, zero)).filter(ok), zero),
        ).where(*base)
    ).one()
    errors = conn.execute(
        select(LlmCall.status, LlmCall.limit_type, LlmCall.run_id, LlmCall.retry, func.count())
        .where(*base, LlmCall.status.not_in(SERVED_STATUSES))
        .group_by(LlmCall.status, LlmCall.limit_type, LlmCall.run_id, LlmCall.retry)
    ).all()
    throttles: list[LimitType] = []
    retried: set[LimitType] = set()
    overloads = spend = 0
    spend_runs: set[str] = set()
    for status, limit_type, run_id, retry, n in errors:
        if limit_type == LimitType.SPEND.value:
            spend += int(n)
            if run_id:
                spend_runs.add(run_id)
        elif limit_type == LimitType.OVERLOAD.value or status in _OVERLOAD_STATUS:
            overloads += int(n)
        elif status != 429:
            continue
        elif retry:
            # a call's first 429 is the evidence; its retries' repeat it (but see below)
            retried.add(LimitType(limit_type) if limit_type in _RATE_TYPES else LimitType.UNKNOWN)
        elif limit_type in _RATE_TYPES:
            throttles.extend([LimitType(limit_type)] * int(n))
        else:
            throttles.extend([LimitType.UNKNOWN] * int(n))
    # nothing answered and only retries rejected: the pacer lets through more than the
    # provider accepts (planner.retry_evidence)
    throttles.extend(
        unanswered_retry_throttles(retried, first_429s=len(throttles), answered=int(agg[6]))
    )
    return WindowCalls(
        calls=int(agg[0]),
        throttles=tuple(throttles),
        overloads=overloads,
        spend_errors=spend,
        spend_runs=tuple(sorted(spend_runs)),
        usage={
            BudgetClass.REQUESTS: float(agg[0]),
            BudgetClass.TOKENS: float(agg[2]),
            BudgetClass.OUTPUT_TOKENS: float(agg[3]),
            BudgetClass.INFLIGHT: float(agg[4]),
        },
        last_call_id=int(agg[1]),
        pacer_wait_s=float(agg[5]),
        answered=int(agg[6]),
        largest={
            BudgetClass.TOKENS: float(agg[7]),
            BudgetClass.OUTPUT_TOKENS: float(agg[8]),
        },
    )


def fresh_header_limits(
    conn: Connection, alias: str, since: datetime | None
) -> dict[LimitType, float] | None:
    """The provider's stated limits (per minute) for ``alias`` when observed after ``since``:
    the latest response's headers, plus what a 429 since then stated that they do not (a limit
    only a 429's message names, as OpenAI's output-token limit, is in no success's headers)."""
    row = conn.execute(
        select(
            AliasObservation.observed_at,
            AliasObservation.limits,
            AliasObservation.last_limited_at,
        ).where(AliasObservation.alias == alias)
    ).first()
    if row is None or (since is not None and as_utc(row[0]) <= since):
        return None
    stored = row[1] if isinstance(row[1], dict) else {}
    limits = stated_limits(stored.get("limits"))
    limited_at = row[2]
    if limited_at is not None and (since is None or as_utc(limited_at) > since):
        for limit_type, value in stated_limits(stored.get(THROTTLE_LIMITS_KEY)).items():
            limits.setdefault(limit_type, value)
    return limits or None


def stated_limits(raw: Any) -> dict[LimitType, float]:
    """Positive numeric limits by known limit type (anything else in the JSON is ignored)."""
    return {k: v for k, v in _stated(raw).items() if v > 0}


def stated_remaining(raw: Any) -> dict[LimitType, float]:
    """Non-negative remaining values by known limit type (0 is a value: an empty bucket)."""
    return {k: v for k, v in _stated(raw).items() if v >= 0}


def _stated(raw: Any) -> dict[LimitType, float]:
    if not isinstance(raw, dict):
        return {}
    known = {t.value for t in LimitType}
    return {
        LimitType(k): float(v)
        for k, v in raw.items()
        if k in known and isinstance(v, int | float) and not isinstance(v, bool)
    }
