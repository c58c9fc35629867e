"""The planner tick reads a token 429's empty bucket against the cache-counting belief, on a real
PostgreSQL ledger: the gateway keeps the 429's stated remaining and when its attempt was sent
through later successes, and the tick compares what was sent since its last reading with what
must have been charged to empty the bucket (``planner.cache_counting.throttle_window``).
The ledger fixtures and helpers are shared through ``plan_tick_support``."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.orm import sessionmaker

from ledger import pacer_state
from ledger.clock import as_utc
from ledger.models import (
    ANSWERED_SENT_AT_KEY,
    COMPLETE_BEFORE_KEY,
    THROTTLE_LIMITS_KEY,
    THROTTLE_READING_KEY,
    AliasObservation,
    LlmCall,
)
from ledger.throttle_reading import ThrottleReading
from tasks import plan
from tests import plan_tick_support
from tests.plan_tick_support import T0, add_run

pytestmark = pytest.mark.postgres

plan_db = plan_tick_support.plan_db
plan_ledger = plan_tick_support.plan_ledger

ALIAS = "sim-anthropic"  # believes cache reads do not count
LIMIT = 1_620_000.0  # input tokens per minute: 27k/s


def _observe(eng: Engine, values: dict[str, Any]) -> None:
    with eng.begin() as conn:
        conn.execute(delete(AliasObservation).where(AliasObservation.alias == ALIAS))
        conn.execute(insert(AliasObservation).values(alias=ALIAS, **values))


def _full_bucket(eng: Engine, at: datetime) -> None:
    """A success's headers at ``at``: the bucket full, its attempt sent a second before."""
    limits = {
        "limits": {"input_tokens": LIMIT},
        "remaining": {"input_tokens": LIMIT},
        ANSWERED_SENT_AT_KEY: (at - timedelta(seconds=1)).timestamp(),
        COMPLETE_BEFORE_KEY: at.timestamp(),
    }
    _observe(eng, {"observed_at": at, "status": 200, "headers": {}, "limits": limits})


def _throttled(
    eng: Engine, sent: datetime, complete_before: datetime, gateway_counts: bool = False
) -> None:
    """A 429 of the input-token limit whose attempt was sent at ``sent``: the bucket empty
    (``gateway_counts``: the gateway judged it to say cache reads count)."""
    at = sent + timedelta(seconds=0.5)
    reading = ThrottleReading.of_429(
        "input_tokens", {"input_tokens": LIMIT}, {"input_tokens": 0.0}, sent, gateway_counts
    )
    assert reading is not None
    limits = {
        "limits": {"input_tokens": LIMIT},
        "remaining": {"input_tokens": 0.0},
        THROTTLE_LIMITS_KEY: {"input_tokens": LIMIT},
        THROTTLE_READING_KEY: reading.to_json(),
        COMPLETE_BEFORE_KEY: complete_before.timestamp(),
    }
    _observe(
        eng,
        {
            "observed_at": at,
            "status": 429,
            "headers": {},
            "limits": limits,
            "last_limit_type": "input_tokens",
            "last_limited_at": at,
        },
    )


def _send(
    eng: Engine,
    at: datetime,
    n: int,
    uncached: int,
    cached: int,
    retry: bool = False,
    sent_at: datetime | None = None,
) -> None:
    with eng.begin() as conn:
        conn.execute(
            insert(LlmCall),
            [
                {
                    "alias": ALIAS,
                    "requested_at": at,
                    "sent_at": sent_at,
                    "input_tokens": uncached + cached,
                    "cached_input_tokens": cached,
                    "output_tokens": 100,
                    "status": 200,
                    "latency_s": 1.0,
                    "retry": retry,
                }
                for _ in range(n)
            ],
        )


def _belief(eng: Engine) -> tuple[bool, dict[str, Any] | None]:
    with eng.connect() as conn:
        row = pacer_state.load_state(conn, ALIAS)
    assert row is not None
    return row.state.cached_input_counts, row.counting


@pytest.mark.parametrize("provider_counts", [True, False])
def test_a_token_429_says_at_once_whether_the_provider_counted_the_cache_reads(
    plan_ledger: Engine, provider_counts: bool
) -> None:
    """A full bucket (1.62M) read at a tick, then 12 s of calls, then a 429 that finds it empty:
    the provider charged at least 1.62M + 12 s x 27k = 1.944M. 39 calls of 5k uncached and 45k
    cached tokens explain it only with the cache reads counted; 390 calls of 5k uncached (and
    a few cached) explain it without them. The tick after the 429 flips the first belief and
    keeps the second, with no span closed."""
    add_run(plan_ledger, running=5, queued=30, alias=ALIAS)
    _full_bucket(plan_ledger, T0 - timedelta(seconds=1))
    plan.plan_tick(T0, False)
    assert _belief(plan_ledger)[0] is False
    n, cached = (39, 45_000) if provider_counts else (390, 500)
    _send(plan_ledger, T0 + timedelta(seconds=1), n, 5_000, cached)
    _throttled(plan_ledger, T0 + timedelta(seconds=12), complete_before=T0 + timedelta(seconds=13))
    plan.plan_tick(T0 + timedelta(seconds=15), False)
    counts, counting = _belief(plan_ledger)
    assert counts is provider_counts
    assert counting is not None and counting["throttle_judged_at"] is not None
    assert not counting["windows"], "no span had closed: the 429 alone said it"


def test_a_429_is_judged_only_once_every_call_sent_before_it_is_recorded(
    plan_ledger: Engine,
) -> None:
    """Calls still in flight at the 429 are not in the ledger yet: what was sent would be
    under-stated, and reads as "cache reads count". The tick waits for the gateway's word."""
    add_run(plan_ledger, running=5, queued=30, alias=ALIAS)
    _full_bucket(plan_ledger, T0 - timedelta(seconds=1))
    plan.plan_tick(T0, False)
    _send(plan_ledger, T0 + timedelta(seconds=1), 39, 5_000, 45_000)
    sent = T0 + timedelta(seconds=12)
    _throttled(plan_ledger, sent, complete_before=T0 + timedelta(seconds=5))
    plan.plan_tick(T0 + timedelta(seconds=15), False)
    counts, counting = _belief(plan_ledger)
    assert counts is False and counting is not None and counting["throttle_judged_at"] is None
    _throttled(plan_ledger, sent, complete_before=T0 + timedelta(seconds=20))
    plan.plan_tick(T0 + timedelta(seconds=30), False)
    assert _belief(plan_ledger)[0] is True


def test_the_gateways_verdict_on_a_429_is_adopted_at_the_next_tick(plan_ledger: Engine) -> None:
    """The gateway judged the 429 from what it sent (``gateway.send_log``) and its pacer counts
    cache reads since: the tick adopts that at once, calls in flight or not, once."""
    add_run(plan_ledger, running=5, queued=30, alias=ALIAS)
    _full_bucket(plan_ledger, T0 - timedelta(seconds=1))
    plan.plan_tick(T0, False)
    _throttled(
        plan_ledger,
        T0 + timedelta(seconds=12),
        complete_before=T0 + timedelta(seconds=2),
        gateway_counts=True,
    )
    plan.plan_tick(T0 + timedelta(seconds=15), False)
    counts, counting = _belief(plan_ledger)
    assert counts is True and counting is not None
    assert counting["throttle_judged_at"] == (T0 + timedelta(seconds=12)).timestamp()


@pytest.mark.parametrize("retries", [1, 40])
def test_served_retries_near_a_429_count_as_sent_in_its_span(
    plan_ledger: Engine, retries: int
) -> None:
    """A retry's last attempt went out after waits the ledger does not keep: it may have been
    charged in the span or not, so it counts as sent there. At a storm's first 429 the retries
    are few (its own call's), and the 429 still says cache reads count; deep in a storm they
    are many, and it says nothing. Either way the 429 is judged once."""
    add_run(plan_ledger, running=5, queued=30, alias=ALIAS)
    _full_bucket(plan_ledger, T0 - timedelta(seconds=1))
    plan.plan_tick(T0, False)
    _send(plan_ledger, T0 + timedelta(seconds=1), 39, 5_000, 45_000)
    _send(plan_ledger, T0 - timedelta(seconds=100), retries, 5_000, 45_000, retry=True)
    _throttled(plan_ledger, T0 + timedelta(seconds=12), complete_before=T0 + timedelta(seconds=13))
    plan.plan_tick(T0 + timedelta(seconds=15), False)
    counts, counting = _belief(plan_ledger)
    assert counts is (retries == 1) and counting is not None
    assert counting["throttle_judged_at"] is not None
    plan.plan_tick(T0 + timedelta(seconds=30), False)
    assert _belief(plan_ledger)[0] is (retries == 1)


@pytest.mark.parametrize("sent_in_span", [True, False])
def test_served_retries_whose_send_is_recorded_count_where_they_were_sent(
    plan_ledger: Engine, sent_in_span: bool
) -> None:
    """Deep in a storm, 40 served retries: where the ledger keeps their send
    (``llm_calls.sent_at``), they count in the 429's span only if they were sent in it. Sent
    in it, they explain the empty bucket, and the 429 says nothing; sent before the bucket
    was read full, they are in its reading, and the 429 says cache reads count, as it does
    with no retries at all (where their send is unknown, the test above)."""
    add_run(plan_ledger, running=5, queued=30, alias=ALIAS)
    _full_bucket(plan_ledger, T0 - timedelta(seconds=1))
    plan.plan_tick(T0, False)
    _send(plan_ledger, T0 + timedelta(seconds=1), 39, 5_000, 45_000)
    sent = T0 + timedelta(seconds=5) if sent_in_span else T0 - timedelta(seconds=30)
    _send(plan_ledger, T0 - timedelta(seconds=100), 40, 5_000, 45_000, retry=True, sent_at=sent)
    _throttled(plan_ledger, T0 + timedelta(seconds=12), complete_before=T0 + timedelta(seconds=13))
    plan.plan_tick(T0 + timedelta(seconds=15), False)
    counts, counting = _belief(plan_ledger)
    assert counts is (not sent_in_span) and counting is not None
    assert counting["throttle_judged_at"] is not None


def test_the_gateway_keeps_a_storms_first_429_through_the_storm_and_later_successes(
    plan_ledger: Engine,
) -> None:
    """The calls sent before a 429 are all recorded only after the storm's next 429: the
    recorder keeps the storm's first token reading, until a token 429 after a quiet
    ``STORM_GAP_S``; successes, a request 429 and a restarted gateway keep it too."""
    from gateway.recorder import CallRecorder, Observation
    from ledger.charges import throttled_bucket

    def throttle(sent: datetime, limit_type: str = "input_tokens") -> Observation:
        at = sent + timedelta(seconds=1)
        return Observation(
            alias=ALIAS,
            observed_at=at,
            status=429,
            headers={},
            limits={"limits": {limit_type: LIMIT}, "remaining": {limit_type: 0.0}},
            last_limit_type=limit_type,
            last_limited_at=at,
            throttle_limits={limit_type: LIMIT},
            throttle_reading=ThrottleReading.of_429(
                limit_type, {limit_type: LIMIT}, {limit_type: 0.0}, sent
            ),
        )

    def success(at: datetime) -> Observation:
        return Observation(
            alias=ALIAS,
            observed_at=at,
            status=200,
            headers={},
            limits={"limits": {"input_tokens": LIMIT}, "remaining": {"input_tokens": 9e5}},
        )

    def kept(recorder: CallRecorder) -> float | None:
        asyncio.run(recorder.flush())
        with plan_ledger.connect() as conn:
            kept = throttled_bucket(conn, ALIAS, "input")
            assert throttled_bucket(conn, ALIAS, "combined") is None  # not that class's bucket
        reading = None if kept is None else kept[0]
        if reading is not None:
            assert reading.remaining == 0.0 and reading.limit_per_s == LIMIT / 60.0
            assert reading.charged_through == reading.at
        return None if reading is None else reading.at

    first = T0 - timedelta(seconds=100)
    recorder = CallRecorder(sessionmaker(plan_ledger))
    recorder.observe(throttle(first))
    assert kept(recorder) == first.timestamp()
    # the storm goes on: each token 429 within STORM_GAP_S of the last keeps the first
    for k in range(1, 4):
        recorder.observe(throttle(first + timedelta(seconds=40 * k)))
        recorder.observe(success(first + timedelta(seconds=40 * k + 2)))
        assert kept(recorder) == first.timestamp()
    recorder.observe(throttle(first + timedelta(seconds=170), limit_type="requests"))
    assert kept(recorder) == first.timestamp()
    restarted = CallRecorder(sessionmaker(plan_ledger))
    restarted.observe(success(first + timedelta(seconds=175)))
    assert kept(restarted) == first.timestamp()
    # a quiet minute after the storm's last token 429 (at 120 s): a new storm
    later = first + timedelta(seconds=181)
    restarted.observe(throttle(later))
    assert kept(restarted) == later.timestamp()


def test_a_replicas_success_does_not_overwrite_another_replicas_later_429(
    plan_ledger: Engine,
) -> None:
    """Two gateway replicas write the alias's one observation row. Replica B's 429, which
    states a limit no success's headers carry, must survive replica A's later successes,
    however old A's own last 429 is: the latest 429 wins the row."""
    from gateway.recorder import CallRecorder, Observation

    def observation(at: datetime, limited: bool) -> Observation:
        return Observation(
            alias=ALIAS,
            observed_at=at,
            status=429 if limited else 200,
            headers={},
            limits={"limits": {"input_tokens": LIMIT}, "remaining": {"input_tokens": 9e5}},
            last_limit_type="output_tokens" if limited else None,
            last_limited_at=at if limited else None,
            throttle_limits={"output_tokens": 4242.0} if limited else {},
        )

    def row() -> tuple[str | None, datetime | None, object]:
        with plan_ledger.connect() as conn:
            found = conn.execute(
                select(
                    AliasObservation.last_limit_type,
                    AliasObservation.last_limited_at,
                    AliasObservation.limits,
                ).where(AliasObservation.alias == ALIAS)
            ).one()
        limits = found[2] if isinstance(found[2], dict) else {}
        return found[0], found[1], limits.get(THROTTLE_LIMITS_KEY)

    a = CallRecorder(sessionmaker(plan_ledger))
    b = CallRecorder(sessionmaker(plan_ledger))
    early, late = T0 - timedelta(seconds=300), T0 - timedelta(seconds=30)
    a.observe(observation(early, limited=True))  # A's own 429, long ago
    asyncio.run(a.flush())
    b.observe(observation(late, limited=True))  # B's, later
    asyncio.run(b.flush())
    for k in range(3):
        a.observe(observation(T0 + timedelta(seconds=k), limited=False))
        asyncio.run(a.flush())
        limit_type, limited_at, stated = row()
        assert limit_type == "output_tokens"
        assert limited_at is not None and as_utc(limited_at) == late
        assert stated == {"output_tokens": 4242.0}
    # A's own next 429 is the latest: it wins
    a.observe(observation(T0 + timedelta(seconds=10), limited=True))
    asyncio.run(a.flush())
    assert as_utc(row()[1]) == T0 + timedelta(seconds=10)  # type: ignore[arg-type]
