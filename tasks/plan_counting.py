"""The planner tick's side of the cache-counting inference (``planner.cache_counting``).

Per alias and tick, the provider's latest statement of its counted-token bucket
(``ledger.charges.counted_bucket``: limit and remaining, when the gateway saw it) becomes an
anchor when it is newer than the last one. Two anchors at least ``SPAN_S`` apart close a span
once every call requested before the later one has been answered and recorded: the gateway
says so with its observation (the oldest call it has in flight, read with the bucket by
``ledger.charges.counted_bucket``), or, where it does not, ``LAG_S`` plus the longest pacer wait and latency of the alias's
recent calls (``planner.cache_counting.span_close_lag_s``). A span closed sooner under-states
what was sent and reads as "cache reads count". ``ledger.charges.sent_between`` sums what was
sent in a closed span. The last ``KEEP`` spans are the
evidence, with the dip of each span's end reading (``planner.cache_counting.dip_window``, from
the calls sent over the ``DIP_LOOKBACK_S`` before it: ``ledger.charges.calls_sent_between``); when they contradict the alias's belief, ``advance`` says so and the tick flips the
state's ``cached_input_counts`` (``planner.recount.recounted``): the tick's accounting, the
sizing and the token budget follow, and the gateway's pacer follows through the alias's Prefect
variable (``gateway.pacer_prefect.push_budgets``).

Without headers nothing states the bucket; there ``judge_by_drain`` keeps, per tick whose
blame reads drained rates (a 429 that names no limit), how fast each bucket was drained with the
tokens counted both ways, and flips the belief where those samples contradict it
(``planner.drain_belief``), the token budget going to the limit they measured.

A 429 of the counted class that the gateway judged at once to say cache reads count (from what
it sent: ``gateway.send_log``; its pacer counts them since) flips the belief at the next tick.
One it did not is judged here too, once every call sent before it has been recorded:
against the reading a tick took at most ``THROTTLE_SPAN_S`` before it
(``planner.cache_counting.throttle_window``), where the belief is that cache reads do not count
(that is the storm it ends). The served retries requested within ``RETRY_LOOKBACK_S`` before it
count as sent in the span (a retry's last attempt went out at a time the ledger does not keep).
Each 429 is judged once (``CountingEvidence.throttle_judged_at``).

The evidence is kept with the stored state (``pacer_states.state["counting"]``) as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from evalfleet.errors import ConfigError
from ledger.charges import (
    calls_sent_between,
    counted_bucket,
    longest_recent_wait,
    sent_between,
    stated_complete_before,
    throttled_bucket,
)
from planner.budget_state import BudgetClass, TokenClass
from planner.cache_counting import (
    LATENCY_LOOKBACK_S,
    MAX_CLOSE_LAG_S,
    RETRY_LOOKBACK_S,
    THROTTLE_SPAN_S,
    BucketReading,
    ChargeWindow,
    dip_window,
    infer_cached_input_counts,
    span_close_lag_s,
    throttle_window,
)
from planner.drain_belief import DrainEvidence, DrainSample, judged

SPAN_S = 30.0  # a span covers at least this long
LAG_S = 30.0  # and closes this long after its end, plus the longest recent wait and latency
KEEP = 8  # spans kept as evidence
# a dip reads the calls sent this long before its reading (requested up to twice as long before:
# a call that waited longer in the pacer is left out, which only under-states what was sent)
DIP_LOOKBACK_S = 15.0
_ANCHORS = 16  # anchors kept while a span is open

_WINDOW_FIELDS = (
    "span_s",
    "limit_per_s",
    "capacity",
    "remaining_start",
    "remaining_end",
    "base",
    "cached",
)


@dataclass(frozen=True)
class CountingEvidence:
    """Bucket readings not yet spanned, the last spans closed, the dips of their end readings,
    and the drained rates of the latest ticks that read them (absent in evidence saved before:
    none)."""

    anchors: tuple[BucketReading, ...] = ()
    windows: tuple[ChargeWindow, ...] = ()
    drained: tuple[DrainSample, ...] = ()
    dips: tuple[ChargeWindow, ...] = ()
    drained_confirmed: bool = False  # the drained samples once confirmed the belief
    throttle_judged_at: float | None = None  # the last 429 judged (epoch seconds of its reading)

    def to_json(self) -> dict[str, Any]:
        return {
            "anchors": [
                [a.at, a.limit_per_s, a.remaining]
                + ([] if a.charged_through is None else [a.charged_through])
                for a in self.anchors
            ],
            "windows": [[getattr(w, f) for f in _WINDOW_FIELDS] for w in self.windows],
            "drained": [[d.believed, d.other, d.requests, d.output] for d in self.drained],
            "dips": [[getattr(w, f) for f in _WINDOW_FIELDS] for w in self.dips],
            "drained_confirmed": self.drained_confirmed,
            "throttle_judged_at": self.throttle_judged_at,
        }

    @classmethod
    def from_json(cls, raw: Any, *, source: str) -> CountingEvidence:
        """The stored evidence (absent in states saved before it existed: none)."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ConfigError(source, ["counting: must be an object"])
        problems: list[str] = []
        anchors: list[BucketReading] = []
        windows: list[ChargeWindow] = []
        dips: list[ChargeWindow] = []
        drained: list[DrainSample] = []
        for i, item in enumerate(raw.get("anchors") or []):
            if _numbers(item, 3) or _numbers(item, 4):
                anchors.append(BucketReading(*(float(x) for x in item)))
            else:
                problems.append(f"counting.anchors[{i}]: must be 3 or 4 numbers")
        for key, into in (("windows", windows), ("dips", dips)):
            for i, item in enumerate(raw.get(key) or []):
                if _numbers(item, len(_WINDOW_FIELDS)):
                    into.append(ChargeWindow(*(float(x) for x in item)))
                else:
                    problems.append(f"counting.{key}[{i}]: must be {len(_WINDOW_FIELDS)} numbers")
        for i, item in enumerate(raw.get("drained") or []):
            if isinstance(item, list) and len(item) == 4 and _numbers(item[:3], 3):
                output = item[3]
                if output is None or _numbers([output], 1):
                    drained.append(
                        DrainSample(
                            float(item[0]),
                            float(item[1]),
                            float(item[2]),
                            None if output is None else float(output),
                        )
                    )
                    continue
            problems.append(f"counting.drained[{i}]: must be 3 numbers and a number or null")
        confirmed = raw.get("drained_confirmed", False)
        if not isinstance(confirmed, bool):
            problems.append("counting.drained_confirmed: must be true or false")
        judged_at = raw.get("throttle_judged_at")
        if judged_at is not None and not _numbers([judged_at], 1):
            problems.append("counting.throttle_judged_at: must be a number or null")
        if problems:
            raise ConfigError(source, problems)
        return cls(
            tuple(anchors),
            tuple(windows),
            tuple(drained),
            tuple(dips),
            confirmed,
            None if judged_at is None else float(judged_at),
        )


def _numbers(item: Any, n: int) -> bool:
    return (
        isinstance(item, list)
        and len(item) == n
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in item)
    )


def advance(
    conn: Connection,
    alias: str,
    evidence: CountingEvidence,
    *,
    token_class: TokenClass,
    believed: bool,
    now: datetime,
) -> tuple[CountingEvidence, bool]:
    """One tick: take a new reading, close what spans are due, test the belief. Returns the
    new evidence and the belief it supports (on a change, the old evidence is spent)."""
    anchors = list(evidence.anchors)
    windows = list(evidence.windows)
    dips = list(evidence.dips)
    reading, complete = counted_bucket(conn, alias, token_class)
    if reading is not None and (not anchors or reading.at > anchors[-1].at):
        anchors.append(reading)
    horizon: float | None = None  # read once, and only when a span or a 429 could close
    judged_at = evidence.throttle_judged_at
    kept = None if believed else throttled_bucket(conn, alias, token_class)
    throttled, gateway_counts = kept if kept is not None else (None, False)
    if throttled is not None and (judged_at is None or throttled.at > judged_at):
        if gateway_counts:
            # the gateway judged it at the 429 from what it sent, and its pacer counts them since
            return CountingEvidence(tuple(anchors[-1:]), throttle_judged_at=throttled.at), True
        horizon = _complete_horizon(conn, alias, complete, now)
        if _sent_at(throttled) <= horizon:
            judged_at = throttled.at
            window = _throttle_window(conn, alias, anchors, throttled, token_class)
            if window is not None and infer_cached_input_counts([window], believed):
                return CountingEvidence(tuple(anchors[-1:]), throttle_judged_at=judged_at), True
    while len(anchors) >= 2:
        start = anchors[0]
        end = next((a for a in anchors[1:] if a.at - start.at >= SPAN_S), None)
        if end is None:
            break
        if horizon is None:
            horizon = _complete_horizon(conn, alias, complete, now)
        if end.at > horizon:
            break
        anchors = anchors[anchors.index(end) :]
        if end.limit_per_s != start.limit_per_s:
            continue  # the stated limit changed inside the span: it says nothing
        base, cached = sent_between(conn, alias, _utc(start.at), _utc(end.at), token_class)
        windows.append(ChargeWindow.between(start, end.at, end.remaining, base, cached))
        recent = calls_sent_between(
            conn, alias, _utc(end.at - 2 * DIP_LOOKBACK_S), _utc(end.at), token_class
        )
        dip = dip_window(end, [c for c in recent if c[0] >= end.at - DIP_LOOKBACK_S])
        if dip is not None:
            dips.append(dip)
    anchors = anchors[-_ANCHORS:]
    windows = windows[-KEEP:]
    dips = dips[-KEEP:]
    counts = infer_cached_input_counts(windows, believed, dips=dips)
    if counts == believed:
        evidence = CountingEvidence(
            tuple(anchors),
            tuple(windows),
            evidence.drained,
            tuple(dips),
            evidence.drained_confirmed,
            judged_at,
        )
        return evidence, counts
    return CountingEvidence(tuple(anchors[-1:]), throttle_judged_at=judged_at), counts


def judge_by_drain(
    evidence: CountingEvidence,
    drained: dict[BudgetClass, float],
    other_tokens: float,
    *,
    believed: bool,
) -> tuple[CountingEvidence, bool, float | None]:
    """A tick whose blame reads drained rates (``drained``, tokens counted as ``believed``;
    ``other_tokens``: counted the other way) adds a sample; where the last samples contradict
    the belief (``planner.drain_belief``), returns the other belief and the limit they
    measured in its units (the samples are spent); else the belief and None."""
    kept, measured = judged(
        DrainEvidence(evidence.drained, evidence.drained_confirmed),
        DrainSample.of(drained, other_tokens),
    )
    counts = believed if measured is None else not believed
    return (
        replace(evidence, drained=kept.samples, drained_confirmed=kept.confirmed),
        counts,
        measured,
    )


def _sent_at(reading: BucketReading) -> float:
    return reading.at if reading.charged_through is None else reading.charged_through


def _throttle_window(
    conn: Connection,
    alias: str,
    anchors: list[BucketReading],
    throttled: BucketReading,
    token_class: TokenClass,
) -> ChargeWindow | None:
    """The span from the earliest reading within ``THROTTLE_SPAN_S`` before the 429 to it, with
    the calls sent in it and the retries that may have been; None without such a reading."""
    end = _sent_at(throttled)
    start = next(
        (
            a
            for a in anchors
            if end - THROTTLE_SPAN_S <= a.at < end and a.limit_per_s == throttled.limit_per_s
        ),
        None,
    )
    if start is None:
        return None
    since, until = _utc(_sent_at(start) - RETRY_LOOKBACK_S), _utc(end)
    sent = calls_sent_between(conn, alias, since, until, token_class)
    retries = sent_between(conn, alias, since, until, token_class, unplaced_retries=True)
    return throttle_window(start, throttled, sent, retries)


def recorded_through(conn: Connection, alias: str, now: datetime) -> float:
    """Epoch seconds by which the alias's calls requested are all recorded (``_complete_horizon``
    on the gateway's word, read alone)."""
    return _complete_horizon(conn, alias, stated_complete_before(conn, alias), now)


def _complete_horizon(conn: Connection, alias: str, stated: float | None, now: datetime) -> float:
    """Epoch seconds by which the alias's calls requested are all recorded: the gateway's word
    (``stated``, from ``ledger.charges.counted_bucket``; a call it never settled holds it back at
    most ``MAX_CLOSE_LAG_S``), else ``LAG_S`` plus the longest recent wait and latency."""
    if stated is not None:
        return max(stated, now.timestamp() - MAX_CLOSE_LAG_S)
    longest = longest_recent_wait(conn, alias, now - timedelta(seconds=LATENCY_LOOKBACK_S), now)
    return now.timestamp() - span_close_lag_s(LAG_S, longest)


def _utc(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, tz=UTC)
