"""Gateway replicas that serve one alias split its budgets (``gateway.replicas``,
``gateway.replica_sync``): the Valkey registry on the real server (liveness by its clock, a
clean leave, an outage), the pacer's share (rates, depths, in-flight and stated remaining
scaled), its demand, the exchange loop, and the settings that switch it on."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence

import pytest
import redis

from evalfleet.errors import ServiceUnavailable
from evalfleet.settings import SettingsError, load_settings
from gateway.aliases import load_aliases
from gateway.factory import check_registry
from gateway.pacer_local import InProcessPacer
from gateway.replica_sync import ReplicaSync
from gateway.replicas import (
    MemoryRegistry,
    PeerThrottle,
    RegistryUnavailable,
    ThrottleNews,
    ValkeyRegistry,
    demand_key,
    replicas_key,
)
from planner.budgets import Budgets
from planner.classify import LimitType
from planner.pacer import CallEstimate
from planner.replica_shares import DEMAND_TAU_S, RESERVE
from tests.conftest import free_port

ALIASES = load_aliases(None, provider_sim_url="http://127.0.0.1:9")
ALIAS = "sim-openai"


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ the Valkey registry


def test_valkey_replicas_see_each_other_and_one_gone_silent_is_reaped(redis_url: str) -> None:
    async def scenario() -> None:
        a = ValkeyRegistry(redis_url, "a", ttl_s=0.6)
        b = ValkeyRegistry(redis_url, "b", ttl_s=0.6)
        try:
            assert await a.exchange({ALIAS: 3.0}) == {ALIAS: {"a": 3.0}}
            assert await b.exchange({ALIAS: 1.0, "other": 0.0}) == {
                ALIAS: {"a": 3.0, "b": 1.0},
                "other": {"b": 0.0},
            }
            await asyncio.sleep(0.9)  # a reports nothing for longer than the TTL
            assert await b.exchange({ALIAS: 2.0}) == {ALIAS: {"b": 2.0}}
            # a's next report brings it back
            assert await a.exchange({ALIAS: 5.0}) == {ALIAS: {"a": 5.0, "b": 2.0}}
            await b.leave()
            assert await a.exchange({ALIAS: 5.0}) == {ALIAS: {"a": 5.0}}
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())
    client = redis.Redis.from_url(redis_url)
    # the keys expire when no replica reports any more (ten TTLs)
    assert 0 < client.pttl(replicas_key(ALIAS)) <= 6000
    assert 0 < client.pttl(demand_key(ALIAS)) <= 6000
    client.close()


def test_liveness_is_the_valkey_servers_clock_not_the_replicas(redis_url: str) -> None:
    """A replica's own clock never enters the script: the score is the server's TIME, so a
    report is fresh however wrong the reporter's clock is."""
    client = redis.Redis.from_url(redis_url)

    async def scenario() -> None:
        a = ValkeyRegistry(redis_url, "a", ttl_s=5.0)
        try:
            await a.exchange({ALIAS: 1.0})
        finally:
            await a.close()

    asyncio.run(scenario())
    server_s, micros = client.time()
    score = client.zscore(replicas_key(ALIAS), "a")
    client.close()
    assert score is not None
    assert abs(score - (server_s * 1000 + micros // 1000)) < 2000


def test_an_unreachable_valkey_is_a_clear_error() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"

    async def scenario() -> None:
        registry = ValkeyRegistry(url, "a", ttl_s=5.0, timeout_s=0.5)
        with pytest.raises(RegistryUnavailable, match="Valkey"):
            await registry.exchange({ALIAS: 1.0})
        pacer = InProcessPacer(ALIASES)
        sync = ReplicaSync(pacer, ValkeyRegistry(url, "a", ttl_s=5.0, timeout_s=0.5), [ALIAS])
        with pytest.raises(ServiceUnavailable, match="EVALFLEET_VALKEY_URL") as info:
            await sync.start()
        assert "budgets" in str(info.value)
        await registry.close()

    asyncio.run(scenario())
    settings = load_settings(valkey_url=url, gateway_budget_sharing="valkey")
    with pytest.raises(ServiceUnavailable, match="EVALFLEET_VALKEY_URL"):
        check_registry(settings)


def test_the_settings_that_switch_sharing_on() -> None:
    with pytest.raises(SettingsError, match="EVALFLEET_VALKEY_URL is not set"):
        load_settings(gateway_budget_sharing="valkey", valkey_url=None)
    with pytest.raises(SettingsError, match="EVALFLEET_GATEWAY_REPLICA_TTL_S"):
        load_settings(gateway_share_interval_s=5.0, gateway_replica_ttl_s=10.0)
    with pytest.raises(SettingsError, match="EVALFLEET_GATEWAY_REPLICA_ID"):
        load_settings(gateway_replica_id="has space")
    assert load_settings().gateway_budget_sharing == "solo"


# ------------------------------------------------------------------ the pacer's share


def test_a_share_scales_every_budget_and_survives_new_budgets_and_cuts() -> None:
    clock = _Clock()
    pacer = InProcessPacer(ALIASES, clock=clock)
    seed = pacer.budgets(ALIAS)
    pacer.set_share(ALIAS, 0.25)
    quarter = pacer.budgets(ALIAS)
    assert quarter.calls_per_s == pytest.approx(seed.calls_per_s / 4)
    assert quarter.tokens_per_s == pytest.approx(seed.tokens_per_s / 4)
    assert quarter.inflight_tokens == pytest.approx(seed.inflight_tokens / 4)
    assert pacer.pushed_budgets(ALIAS) == seed  # the planner's budgets are the alias's
    new = Budgets(
        calls_per_s=8.0, tokens_per_s=4000.0, output_tokens_per_s=None, inflight_tokens=1e6
    )
    pacer.set_budgets(ALIAS, new)
    assert pacer.budgets(ALIAS).calls_per_s == pytest.approx(2.0)
    assert pacer.budgets(ALIAS).tokens_per_s == pytest.approx(1000.0)
    pacer.set_share(ALIAS, 1.0)
    assert pacer.budgets(ALIAS) == new
    with pytest.raises(ValueError, match="share"):
        pacer.set_share(ALIAS, 0.0)


def test_a_replica_takes_its_share_of_what_the_provider_says_is_left() -> None:
    clock = _Clock()
    solo = InProcessPacer(ALIASES, clock=clock)
    half = InProcessPacer(ALIASES, clock=clock)
    half.set_share(ALIAS, 0.5)
    for pacer in (solo, half):
        pacer.observe_remaining(ALIAS, {LimitType.REQUESTS: 4.0, LimitType.TOKENS: 1000.0})
    assert solo.levels(ALIAS)["calls"] == pytest.approx(4.0)
    assert half.levels(ALIAS)["calls"] == pytest.approx(2.0)
    assert half.levels(ALIAS)["tokens"] == pytest.approx(500.0)


def test_demand_is_the_average_number_of_calls_present() -> None:
    """Waiting at the pacer or admitted and not settled, a call is present; demand is their
    time-weighted average (``planner.replica_shares.PresenceAverage``)."""
    clock = _Clock()
    pacer = InProcessPacer(ALIASES, clock=clock)
    pacer.set_budgets(
        ALIAS,
        Budgets(calls_per_s=0.1, tokens_per_s=1e6, output_tokens_per_s=None, inflight_tokens=1e9),
    )
    long = 10 * DEMAND_TAU_S

    async def scenario() -> None:
        await pacer.start()
        try:
            first = await pacer.acquire(ALIAS, CallEstimate(input_uncached=10))  # admitted
            waiting = [
                asyncio.create_task(pacer.acquire(ALIAS, CallEstimate(input_uncached=10)))
                for _ in range(2)
            ]
            await asyncio.sleep(0.05)
            assert pacer.demand(ALIAS) == pytest.approx(0.0)  # no time has passed
            clock.now += long
            assert pacer.demand(ALIAS) == pytest.approx(3.0, abs=1e-3)
            await pacer.settle(first, None)
            for task in waiting:
                task.cancel()  # one was admitted at once: it is settled below
            for outcome in await asyncio.gather(*waiting, return_exceptions=True):
                if not isinstance(outcome, BaseException):
                    await pacer.settle(outcome, None)
            clock.now += DEMAND_TAU_S  # one time constant later: e^-1 of the way back
            assert pacer.demand(ALIAS) == pytest.approx(3.0 * math.exp(-1.0), rel=1e-3)
            clock.now += long
            assert pacer.demand(ALIAS) == pytest.approx(0.0, abs=1e-3)
        finally:
            await pacer.close()

    asyncio.run(scenario())


# ------------------------------------------------------------------ the exchange loop


class _Flaky:
    """A registry that can be switched off (an outage)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.replica_id = inner.replica_id  # type: ignore[attr-defined]
        self.down = False

    async def exchange(self, demands: Mapping[str, float]) -> dict[str, dict[str, float]]:
        if self.down:
            raise RegistryUnavailable("Valkey: ConnectionError: down")
        return await self.inner.exchange(demands)  # type: ignore[attr-defined,no-any-return]

    async def swap_throttles(
        self, posted: Mapping[str, Sequence[PeerThrottle]]
    ) -> dict[str, list[ThrottleNews]]:
        if self.down:
            raise RegistryUnavailable("Valkey: ConnectionError: down")
        return await self.inner.swap_throttles(posted)  # type: ignore[attr-defined,no-any-return]

    async def leave(self) -> None:
        await self.inner.leave()  # type: ignore[attr-defined]

    async def close(self) -> None:
        return None


def test_shares_follow_demand_and_a_leaving_replica_hands_its_share_back() -> None:
    clock = _Clock()
    table = MemoryRegistry(clock, ttl_s=10.0)
    busy, idle = InProcessPacer(ALIASES, clock=clock), InProcessPacer(ALIASES, clock=clock)
    seed = busy.budgets(ALIAS)
    busy_sync = ReplicaSync(busy, _Flaky(table.replica("busy")), [ALIAS])
    idle_sync = ReplicaSync(idle, table.replica("idle"), [ALIAS])

    async def scenario() -> None:
        for _ in range(5):
            # calls present (admitted, not settled) are demand: at the busy replica only
            await busy.acquire(ALIAS, CallEstimate(input_uncached=1))
        clock.now += 10 * DEMAND_TAU_S
        await busy_sync.exchange()
        await idle_sync.exchange()
        await busy_sync.exchange()
        assert busy.share(ALIAS) == pytest.approx(1 - RESERVE + RESERVE / 2)
        assert idle.share(ALIAS) == pytest.approx(RESERVE / 2)
        assert busy.budgets(ALIAS).calls_per_s + idle.budgets(ALIAS).calls_per_s == (
            pytest.approx(seed.calls_per_s)
        )
        # an outage keeps the last share (neither the whole budget nor a stall)
        flaky = busy_sync.registry
        assert isinstance(flaky, _Flaky)
        flaky.down = True
        with pytest.raises(RegistryUnavailable):
            await busy_sync.exchange()
        assert busy.share(ALIAS) == pytest.approx(1 - RESERVE / 2)
        flaky.down = False
        # the busy replica stops cleanly: the idle one takes everything at its next exchange
        await busy_sync.stop()
        await idle_sync.exchange()
        assert idle.share(ALIAS) == 1.0
        assert idle.budgets(ALIAS) == seed

    asyncio.run(scenario())


def test_a_replica_that_dies_is_reaped_after_the_ttl() -> None:
    clock = _Clock()
    table = MemoryRegistry(clock, ttl_s=10.0)
    a, b = InProcessPacer(ALIASES, clock=clock), InProcessPacer(ALIASES, clock=clock)
    a_sync = ReplicaSync(a, table.replica("a"), [ALIAS])
    b_sync = ReplicaSync(b, table.replica("b"), [ALIAS])

    async def scenario() -> None:
        await a_sync.exchange()
        await b_sync.exchange()
        assert b.share(ALIAS) == pytest.approx(0.5)
        clock.now += 5.0
        await b_sync.exchange()  # a is silent but within the TTL: its share stays unused
        assert b.share(ALIAS) == pytest.approx(0.5)
        clock.now += 6.0
        await b_sync.exchange()
        assert b.share(ALIAS) == 1.0

    asyncio.run(scenario())


def test_gateway_serve_refuses_to_start_without_its_valkey(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from evalfleet.cli import main
    from evalfleet.settings import get_settings

    monkeypatch.setenv("EVALFLEET_GATEWAY_BUDGET_SHARING", "valkey")
    monkeypatch.setenv("EVALFLEET_VALKEY_URL", f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    get_settings.cache_clear()
    try:
        code = main(["gateway", "serve", "--port", str(free_port())])
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert code == 2
    assert "EVALFLEET_VALKEY_URL" in err and "cannot reach it" in err
    assert "hunter2" not in err and "Traceback" not in err


def test_the_factory_builds_the_registry_the_settings_name(redis_url: str) -> None:
    from gateway.factory import replica_registry

    assert replica_registry(load_settings()) is None  # solo: no registry, no Valkey needed
    settings = load_settings(valkey_url=redis_url, gateway_budget_sharing="valkey")
    check_registry(settings)  # reachable: no error
    first, second = replica_registry(settings), replica_registry(settings)
    assert isinstance(first, ValkeyRegistry) and isinstance(second, ValkeyRegistry)
    assert first.replica_id != second.replica_id  # unique per start unless named
    named = replica_registry(settings.model_copy(update={"gateway_replica_id": "gw-1"}))
    assert named is not None and named.replica_id == "gw-1"
    for registry in (first, second, named):
        asyncio.run(registry.close())
