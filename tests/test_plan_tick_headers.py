"""The planner tick and the provider's stated limits on a real PostgreSQL ledger: a limit only a
429 states reaches the planner though a success's headers came after it, and the stated token
bucket corrects a wrong belief about whether cache reads count. Split from ``test_plan_tick.py``;
the ledger fixtures and helpers are shared through ``plan_tick_support``."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.orm import sessionmaker

from ledger import pacer_state, pacer_window
from ledger.models import ANSWERED_SENT_AT_KEY, COMPLETE_BEFORE_KEY, AliasObservation, LlmCall
from planner.classify import LimitType
from tasks import plan
from tests import plan_tick_support
from tests.plan_tick_support import ALIAS, T0, add_run, stored

pytestmark = pytest.mark.postgres

# the PostgreSQL ledger fixtures, shared through plan_tick_support
plan_db = plan_tick_support.plan_db
plan_ledger = plan_tick_support.plan_ledger


# ---------------------------------------------------------------------------------------------
# a limit only a 429 states reaches the planner, though a success's headers came after it


def test_a_limit_only_a_429_states_survives_later_successes(plan_ledger: Engine) -> None:
    from gateway.recorder import CallRecorder, Observation

    recorder = CallRecorder(sessionmaker(plan_ledger))
    limited_at = T0 - timedelta(seconds=8)
    headers = {"x-ratelimit-limit-requests": "4000"}
    throttle = Observation(
        alias=ALIAS,
        observed_at=limited_at,
        status=429,
        headers=headers,
        # an OpenAI 429 whose message states an output-token limit its headers do not
        limits={"limits": {"requests": 4000.0, "output_tokens": 90000.0}, "remaining": {}},
        last_limit_type="output_tokens",
        last_limited_at=limited_at,
        throttle_limits={"requests": 4000.0, "output_tokens": 90000.0},
    )

    def success(at: datetime) -> Observation:
        return Observation(alias=ALIAS, observed_at=at, status=200, headers=headers, limits={})

    async def record() -> None:
        recorder.observe(throttle)
        await recorder.flush()
        recorder.observe(success(T0 - timedelta(seconds=5)))  # written over the 429's row
        await recorder.flush()

    asyncio.run(record())
    with plan_ledger.connect() as conn:
        row = conn.execute(select(AliasObservation).where(AliasObservation.alias == ALIAS)).one()
        since_before = pacer_window.fresh_header_limits(conn, ALIAS, T0 - timedelta(seconds=15))
        since_after = pacer_window.fresh_header_limits(conn, ALIAS, T0 - timedelta(seconds=6))
    assert row.status == 200 and row.last_limit_type == "output_tokens"
    assert since_before == {LimitType.REQUESTS: 4000.0, LimitType.OUTPUT_TOKENS: 90000.0}
    # a tick after the 429 was stepped sees only what the latest headers state
    assert since_after == {LimitType.REQUESTS: 4000.0}

    # a restarted gateway's first success keeps the ledger's 429 too
    restarted = CallRecorder(sessionmaker(plan_ledger))
    restarted.observe(success(T0 - timedelta(seconds=4)))
    asyncio.run(restarted.flush())
    with plan_ledger.connect() as conn:
        row = conn.execute(select(AliasObservation).where(AliasObservation.alias == ALIAS)).one()
        after_restart = pacer_window.fresh_header_limits(conn, ALIAS, T0 - timedelta(seconds=15))
    assert row.last_limit_type == "output_tokens" and after_restart == since_before

    # the same within one flush interval: the success replaces the 429 before any write
    recorder.observe(replace(throttle, observed_at=T0, last_limited_at=T0))
    recorder.observe(success(T0 + timedelta(seconds=1)))
    asyncio.run(recorder.flush())
    with plan_ledger.connect() as conn:
        limits = pacer_window.fresh_header_limits(conn, ALIAS, T0 - timedelta(seconds=1))
    assert limits is not None and limits[LimitType.OUTPUT_TOKENS] == 90000.0


# ---------------------------------------------------------------------------------------------
# the provider's stated bucket against the cache-counting belief


def _observe_bucket(
    eng: Engine, at: datetime, remaining: float, answered_sent_at: datetime | None = None
) -> None:
    """The gateway's latest headers: a combined 1.62M tokens/min limit with ``remaining``, on
    the answer to an attempt sent at ``answered_sent_at`` (None: the gateway does not say)."""
    limits: dict[str, Any] = {
        "limits": {"tokens": 1_620_000.0},
        "remaining": {"tokens": remaining},
    }
    if answered_sent_at is not None:
        limits[ANSWERED_SENT_AT_KEY] = answered_sent_at.timestamp()
    values = {"observed_at": at, "status": 200, "headers": {}, "limits": limits}
    with eng.begin() as conn:
        conn.execute(delete(AliasObservation).where(AliasObservation.alias == ALIAS))
        conn.execute(insert(AliasObservation).values(alias=ALIAS, **values))


def _send(eng: Engine, at: datetime, n: int) -> None:
    """``n`` calls of 50k input tokens, 45k of them cache reads."""
    with eng.begin() as conn:
        conn.execute(
            insert(LlmCall),
            [
                {
                    "alias": ALIAS,
                    "requested_at": at,
                    "input_tokens": 50_000,
                    "cached_input_tokens": 45_000,
                    "output_tokens": 100,
                    "status": 200,
                    "latency_s": 1.0,
                }
                for _ in range(n)
            ],
        )


@pytest.mark.parametrize("provider_counts", [False, True])
def test_the_stated_bucket_corrects_a_wrong_cache_counting_belief(
    plan_ledger: Engine, provider_counts: bool
) -> None:
    """The alias config says cache reads count (sim-openai); the limit is 27k tokens/s (405k
    per 15 s, a 1.62M bucket). A provider that ignores cache reads accepts 20 calls per 15 s
    (1M tokens, 0.9M of them cache reads) and its bucket stays full: the planner stops
    charging them. One that counts them is drained by a first burst and then accepts what
    refills it: the belief stands."""
    add_run(plan_ledger, running=5, queued=30)
    remaining = 1_620_000.0
    for k in range(10):
        at = T0 + timedelta(seconds=15 * k)
        n = 20 if not provider_counts else (30 if k == 0 else 8)
        _send(plan_ledger, at - timedelta(seconds=10), n)
        if provider_counts:
            remaining = min(1_620_000.0, remaining + 405_000.0) - n * 50_100
        _observe_bucket(plan_ledger, at - timedelta(seconds=1), remaining)
        plan.plan_tick(at, False)
    row = stored(plan_ledger)
    assert row.state.cached_input_counts is provider_counts
    assert row.counting is not None and row.counting["anchors"]
    if not provider_counts:
        assert row.state.budgets.tokens_per_s == pytest.approx(27_000.0)  # the stated limit


def test_the_recorded_observation_says_when_its_attempt_was_sent(plan_ledger: Engine) -> None:
    from gateway.recorder import CallRecorder, Observation
    from ledger.charges import counted_bucket

    recorder = CallRecorder(sessionmaker(plan_ledger))
    sent = T0 - timedelta(seconds=7)
    recorder.observe(
        Observation(
            alias=ALIAS,
            observed_at=T0,
            status=200,
            headers={},
            limits={"limits": {"tokens": 1_620_000.0}, "remaining": {"tokens": 1_000_000.0}},
            answered_sent_at=sent,
        )
    )
    asyncio.run(recorder.flush())
    with plan_ledger.connect() as conn:
        reading, _ = counted_bucket(conn, ALIAS, "combined")
    assert reading is not None
    assert reading.at == T0.timestamp() and reading.remaining == 1_000_000.0
    assert reading.charged_through == sent.timestamp()


@pytest.mark.parametrize("sent_before_the_answered_attempt", [True, False])
def test_a_nearly_full_bucket_just_after_big_calls_says_cache_reads_do_not_count(
    plan_ledger: Engine, sent_before_the_answered_attempt: bool
) -> None:
    """wide-1928 of sim.generate_wide, on the ledger: sim-openai believes cache reads count,
    they do not, and the pacer sends at the stated limit (27k tokens/s) in counted units, 8
    calls of 50.1k per 15 s, 45k of each cache reads. The provider charges 5.1k a call and its
    bucket stays 99% full: every span lost refill, and what they sent is within their bound.
    Two calls sent 1.5 s before a reading still say it: a bucket holds at most 1.62M, so the
    provider charged at most 1.5 s of refill (40.5k) and the 1% missing (16.2k) since, not
    the 100k counted. Where the answered attempt went out before those calls were sent, the
    reading may predate their charge, and says nothing."""
    add_run(plan_ledger, running=5, queued=30)
    for k in range(10):
        at = T0 + timedelta(seconds=15 * k)
        _send(plan_ledger, at - timedelta(seconds=10), 6)
        _send(plan_ledger, at - timedelta(seconds=2.5), 2)
        answered = at - timedelta(seconds=2.0 if sent_before_the_answered_attempt else 3.0)
        _observe_bucket(plan_ledger, at - timedelta(seconds=1), 0.99 * 1_620_000.0, answered)
        plan.plan_tick(at, False)
    row = stored(plan_ledger)
    assert row.counting is not None
    assert row.state.cached_input_counts is not sent_before_the_answered_attempt
    if sent_before_the_answered_attempt:
        assert row.state.budgets.tokens_per_s == pytest.approx(27_000.0)  # the stated limit
    else:
        assert row.counting["windows"], "the spans were closed and said nothing"


@pytest.mark.parametrize("gateway_says", [True, False])
def test_calls_still_in_flight_when_a_span_ends_do_not_read_as_cache_reads_counting(
    plan_ledger: Engine, gateway_says: bool
) -> None:
    """sim-anthropic believes cache reads do not count, and they do not: the provider charges
    the 5k uncached tokens of each call, 81 calls per 15 s (405k, the stated 27k/s limit), and
    its bucket holds at 800k. Each call takes 55 s from request to answer, and the gateway
    records it only then. A span closed 30 s after its end (the fixed lag alone) would hold
    only the calls answered by then: the provider would seem to have charged more than the
    uncached tokens sent, and half the cache reads (5k per call) too, "cache reads count", and
    the pacer would charge them against a limit that ignores them (sim.generate_wide's wide-62
    ran at half speed so). The span waits until the gateway's observation says every call
    requested in it was answered, or, from a gateway that does not say, for the longest wait
    and latency recorded."""
    alias = "sim-anthropic"
    add_run(plan_ledger, running=5, queued=30, alias=alias)
    latency = timedelta(seconds=55)
    requested: list[datetime] = []
    for k in range(14):
        at = T0 + timedelta(seconds=15 * k)
        requested.append(at - timedelta(seconds=10))
        answered = [r for r in requested if r + latency <= at]
        with plan_ledger.begin() as conn:
            conn.execute(delete(LlmCall).where(LlmCall.alias == alias))
            rows = [
                {
                    "alias": alias,
                    "requested_at": r,
                    "input_tokens": 10_000,
                    "cached_input_tokens": 5_000,
                    "output_tokens": 100,
                    "status": 200,
                    "latency_s": latency.total_seconds(),
                }
                for r in answered
                for _ in range(81)
            ]
            if rows:
                conn.execute(insert(LlmCall), rows)
            limits: dict[str, Any] = {
                "limits": {"input_tokens": 1_620_000.0},
                "remaining": {"input_tokens": 800_000.0},
            }
            in_flight = [r for r in requested if r not in answered]
            if gateway_says:
                oldest = min(in_flight, default=at - timedelta(seconds=1))
                limits[COMPLETE_BEFORE_KEY] = oldest.timestamp()
            conn.execute(delete(AliasObservation).where(AliasObservation.alias == alias))
            conn.execute(
                insert(AliasObservation).values(
                    alias=alias,
                    observed_at=at - timedelta(seconds=1),
                    status=200,
                    headers={},
                    limits=limits,
                )
            )
        plan.plan_tick(at, False)
    with plan_ledger.connect() as conn:
        row = pacer_state.load_state(conn, alias)
    assert row is not None and row.counting is not None
    assert row.counting["windows"], "spans were closed once their calls were recorded"
    assert row.state.cached_input_counts is False
    assert row.state.budgets.tokens_per_s == pytest.approx(27_000.0)  # the stated limit
