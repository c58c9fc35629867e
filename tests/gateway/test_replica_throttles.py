"""A 429 one gateway replica draws cuts and holds every replica serving the alias
(``gateway.replicas``' throttle news, ``gateway.replica_sync``, ``ProviderFeedback.peer_rejected``):
the registry's protocol in memory and on the real Valkey, two pacers wired as the gateway wires
them, and two gateways over HTTP in front of a provider that rejects one replica's calls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime

import httpx
import pytest
import redis
from sqlalchemy import Engine

from gateway.aliases import load_aliases
from gateway.calls import Call
from gateway.feedback import ProviderFeedback
from gateway.pacer_local import InProcessPacer
from gateway.replica_sync import ReplicaSync
from gateway.replicas import (
    MemoryRegistry,
    PeerThrottle,
    ReplicaRegistry,
    ValkeyRegistry,
    throttles_key,
)
from gateway.send_log import SendLog
from gateway.spend import Reservation
from planner.classify import Classification, LimitType
from planner.provisional_cut import CUT
from tests.gateway.gw_helpers import Replicas, start_replicas

ALIASES = load_aliases(None, provider_sim_url="http://127.0.0.1:9")
ALIAS = "sim-openai"


def _reading(limit_type: LimitType, remaining: float = 0.0) -> PeerThrottle:
    """A 429 of ``limit_type`` that states what is left of its bucket (of an unknown limit:
    nothing), and no limit (a stated one would cap the budget before any cut)."""
    left: dict[LimitType, float] = (
        {} if limit_type is LimitType.UNKNOWN else {limit_type: remaining}
    )
    return PeerThrottle(status=429, limit_type=limit_type, remaining=left, retry_after_s=1.0)


REQUESTS = _reading(LimitType.REQUESTS)
TOKENS = _reading(LimitType.TOKENS, remaining=10.0)
UNKNOWN = _reading(LimitType.UNKNOWN)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _swap(
    registry: ReplicaRegistry, posted: list[PeerThrottle]
) -> tuple[list[PeerThrottle], list[float]]:
    """The readings the other replicas posted since the last swap, and their ages."""
    news = (await registry.swap_throttles({ALIAS: posted}))[ALIAS]
    return [n.reading for n in news], [n.age_s for n in news]


async def _protocol(
    a: ReplicaRegistry,
    b: ReplicaRegistry,
    wait: Callable[[float], Awaitable[None]],
    news_s: float,
) -> None:
    # a replica's first swap starts from now: what was posted before it is not news to it
    assert await _swap(a, [UNKNOWN]) == ([], [])
    assert await _swap(b, []) == ([], [])
    # a's next 429 reaches b at b's next swap, once, with its age
    assert await _swap(a, [REQUESTS]) == ([], [])
    await wait(news_s / 3)
    readings, ages = await _swap(b, [TOKENS])
    assert readings == [REQUESTS]
    assert news_s / 3 <= ages[0] + 0.01 <= news_s
    assert await _swap(b, []) == ([], [])
    # a hears b's, never its own
    assert (await _swap(a, []))[0] == [TOKENS]
    # a reading older than the news age is no news (the planner's tick has acted on it)
    assert await _swap(a, [UNKNOWN]) == ([], [])
    await wait(news_s * 1.5)
    assert await _swap(b, []) == ([], [])


def test_the_memory_registry_hands_each_replica_the_others_429s_once() -> None:
    clock = _Clock()
    table = MemoryRegistry(clock, news_s=5.0)

    async def wait(seconds: float) -> None:
        clock.now += seconds

    asyncio.run(_protocol(table.replica("a"), table.replica("b"), wait, news_s=5.0))


def test_valkey_hands_each_replica_the_others_429s_once(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete(throttles_key(ALIAS))

    async def scenario() -> None:
        a = ValkeyRegistry(redis_url, "a", ttl_s=0.5, news_s=0.6)
        b = ValkeyRegistry(redis_url, "b", ttl_s=0.5, news_s=0.6)
        try:
            await _protocol(a, b, asyncio.sleep, news_s=0.6)
            # an entry no replica of this version wrote is skipped, not fatal
            client.xadd(throttles_key(ALIAS), {"r": "c", "v": '{"status": "soon"}'})
            client.xadd(throttles_key(ALIAS), {"v": "no replica"})
            client.xadd(throttles_key(ALIAS), {"r": "c", "v": "{}", "x": "1"})
            await a.swap_throttles({ALIAS: [REQUESTS]})
            assert (await _swap(b, []))[0] == [REQUESTS]
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())
    # the stream expires when no replica swaps any more (ten TTLs), and stays short
    assert 0 < client.pttl(throttles_key(ALIAS)) <= 5000
    assert client.xlen(throttles_key(ALIAS)) <= 300
    client.close()


def test_a_reading_round_trips_and_a_bad_one_is_refused() -> None:
    view = Classification(
        status=429,
        limit_type=LimitType.TOKENS,
        limits={LimitType.TOKENS: 1e6},
        remaining={LimitType.TOKENS: 0.0},
        retry_after_s=2.0,
        message="Rate limit reached for tokens",
    )
    reading = PeerThrottle.of(view)
    back = PeerThrottle.parse(reading.model_dump_json())
    assert back == reading
    assert back is not None and back.classification().limit_type is LimitType.TOKENS
    assert back.classification().remaining == {LimitType.TOKENS: 0.0}
    assert PeerThrottle.parse('{"status": 429, "limit_type": "tokens", "extra": 1}') is None
    assert PeerThrottle.parse('{"status": 429, "limit_type": "per_fortnight"}') is None
    assert PeerThrottle.parse("not json") is None


# ------------------------------------------------------------------ two pacers, wired


def _call(*, retry: bool = False) -> Call:
    return Call(
        alias=ALIASES.get(ALIAS),
        flavour="openai",
        reservation=Reservation(key_id="k", run_id="r", amount=0),
        instance="i-1",
        harness="h",
        task_age_s=10.0,
        requested_at=datetime(2026, 12, 1, 12, 0, tzinfo=UTC),
        input_estimate=1000,
        max_tokens=100,
        retry=retry,
    )


def _replica(
    name: str, table: MemoryRegistry, clock: _Clock
) -> tuple[InProcessPacer, ProviderFeedback, ReplicaSync]:
    """A pacer, its feedback and its exchange loop, wired as ``gateway.app.Gateway`` wires them."""
    pacer = InProcessPacer(ALIASES, clock=clock)
    feedback = ProviderFeedback(pacer, SendLog(), clock)
    sync = ReplicaSync(pacer, table.replica(name), [ALIAS], on_peer_429=feedback.peer_rejected)
    feedback.on_first_429 = sync.report_429
    return pacer, feedback, sync


def test_a_429_at_one_replica_cuts_and_holds_the_others_budget_it_names() -> None:
    clock = _Clock()
    table = MemoryRegistry(clock)
    a, a_feedback, a_sync = _replica("a", table, clock)
    b, _, b_sync = _replica("b", table, clock)
    request_429 = REQUESTS.classification()

    async def scenario() -> None:
        await a_sync.exchange()
        await b_sync.exchange()
        await a_sync.exchange()
        before = b.budgets(ALIAS)
        assert b.share(ALIAS) == pytest.approx(0.5)
        # a retry's 429 and an overload are not news: the first 429 of a call is
        a_feedback.rejected(_call(retry=True), request_429)
        a_feedback.rejected(_call(), Classification(status=529, limit_type=LimitType.OVERLOAD))
        await a_sync.exchange()
        await b_sync.exchange()
        assert b.budgets(ALIAS) == before
        a_feedback.rejected(_call(), request_429)
        a_feedback.rejected(_call(), request_429)  # the same storm: one cut
        assert a.budgets(ALIAS).calls_per_s == pytest.approx(before.calls_per_s * CUT)
        await a_sync.exchange()
        await b_sync.exchange()
        after = b.budgets(ALIAS)
        # b cut the request budget as a did, and only it; and mirrors the bucket a found empty
        assert after.calls_per_s == pytest.approx(before.calls_per_s * CUT)
        assert after.tokens_per_s == before.tokens_per_s
        assert b.levels(ALIAS)["calls"] <= 0.0 < b.levels(ALIAS)["tokens"]
        # news once: b's next exchange cuts nothing more
        clock.now += 1.0
        await b_sync.exchange()
        assert b.budgets(ALIAS).calls_per_s == pytest.approx(after.calls_per_s)

    asyncio.run(scenario())


def test_a_429_that_states_nothing_holds_every_bucket_of_the_other_replica() -> None:
    clock = _Clock()
    table = MemoryRegistry(clock)
    _, a_feedback, a_sync = _replica("a", table, clock)
    b, _, b_sync = _replica("b", table, clock)

    async def scenario() -> None:
        await a_sync.exchange()
        await b_sync.exchange()
        before = b.budgets(ALIAS)
        a_feedback.rejected(_call(), UNKNOWN.classification())
        await a_sync.exchange()
        await b_sync.exchange()
        # an unknown limit: every class cut, every bucket held (negative: refill owed)
        after = b.budgets(ALIAS)
        assert after.calls_per_s == pytest.approx(before.calls_per_s * CUT)
        assert after.tokens_per_s == pytest.approx(before.tokens_per_s * CUT)
        assert all(level < 0.0 for level in b.levels(ALIAS).values())

    asyncio.run(scenario())


def test_a_429_heard_late_is_held_only_for_what_is_left_of_its_hold() -> None:
    """Each replica's hold ends when the drawing replica's does: a replica that heard late and
    held the whole time would still hold when the other, free again, draws the next 429."""
    hold_s = ALIASES.get(ALIAS).pacer.hold_after_429_s
    clock = _Clock()
    table = MemoryRegistry(clock, news_s=10 * hold_s)
    _, a_feedback, a_sync = _replica("a", table, clock)
    b, _, b_sync = _replica("b", table, clock)

    async def scenario() -> None:
        await a_sync.exchange()
        await b_sync.exchange()
        a_feedback.rejected(_call(), UNKNOWN.classification())
        await a_sync.exchange()
        clock.now += 0.75 * hold_s  # b hears of it three quarters of the hold later
        await b_sync.exchange()
        owed = {name: -level / 0.25 for name, level in b.levels(ALIAS).items()}
        # a quarter of the hold's refill is owed: every bucket's level is -rate x hold / 4
        budgets = b.budgets(ALIAS)
        assert owed["calls"] == pytest.approx(budgets.calls_per_s * hold_s, rel=0.05)
        # heard after the hold is over: cut (the bucket was found empty), not held
        a_feedback.rejected(_call(), UNKNOWN.classification())
        await a_sync.exchange()
        clock.now += 2 * hold_s
        await b_sync.exchange()
        assert all(level >= 0.0 for level in b.levels(ALIAS).values())

    asyncio.run(scenario())


# ------------------------------------------------------------------ two gateways over HTTP

BODY = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@pytest.fixture
def two_gateways(gw_engine: Engine, redis_url: str) -> Iterator[Replicas]:
    """A provider sim that allows 60 calls a minute and two gateways sharing an alias budgeted
    at 20 calls/s (the operator's seed is far too high), through Valkey."""
    redis.Redis.from_url(redis_url).delete(throttles_key(ALIAS))
    with ExitStack() as stack:
        yield start_replicas(
            stack,
            gw_engine,
            names=("a", "b"),
            valkey_url=redis_url,
            sim_rpm=60.0,
            calls_per_s=20.0,
        )


def test_a_replica_that_drew_no_429_is_cut_within_a_second_of_anothers(
    two_gateways: Replicas,
) -> None:
    urls, secret, idle = two_gateways.urls, two_gateways.secret, two_gateways.pacers[1]

    def unshared() -> float:
        """The idle replica's request budget before its share (which follows demand)."""
        return idle.budgets(ALIAS).calls_per_s / idle.share(ALIAS)

    time.sleep(0.6)  # both have exchanged
    before = unshared()
    headers = {"authorization": f"Bearer {secret}"}
    statuses = []
    with httpx.Client(timeout=10) as client:
        # the provider's bucket holds one minute of 60 calls: a's calls empty it
        for _ in range(120):
            r = client.post(urls[0] + "/v1/chat/completions", json=BODY, headers=headers)
            statuses.append(r.status_code)
            if r.status_code == 429:
                break
    assert statuses[-1] == 429, statuses[-5:]
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and unshared() >= before * 0.9:
        time.sleep(0.05)
    # the idle replica sent nothing and drew no 429, yet paces as the other: under the limit
    # the 429 stated (60 a minute), cut
    assert before == 20.0
    assert unshared() == pytest.approx(60.0 / 60.0 * CUT)
