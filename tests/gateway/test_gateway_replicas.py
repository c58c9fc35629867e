"""Two gateway replicas serving one alias, over real HTTP, sharing its budgets through Valkey.

Alone, each replica paces at the alias's full budget, so two send twice it: the naive
behaviour, measured here as the baseline. Sharing, the two together send the budget, split as
their harnesses' demand is (3:1 here), and a replica whose harnesses ask for everything gets
nearly all of it rather than half."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest
from sqlalchemy import Engine

from planner.replica_shares import RESERVE
from tests.gateway.gw_helpers import start_replicas

BUDGET = 5.0  # the alias's calls/s
BODY = {"model": "sim-openai", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
WARMUP_S = 1.5  # buckets drained and shares settled before counting
WINDOW_S = 4.0


@pytest.fixture
def replicas(gw_engine: Engine, redis_url: str) -> Iterator[object]:
    """``start(sharing)``: a provider sim and two gateways on loopback; returns their URLs and
    a gateway key valid on both."""
    with ExitStack() as stack:

        def start(sharing: bool) -> tuple[list[str], str]:
            # a bucket one second deep, stated or not: what is counted is the rate
            started = start_replicas(
                stack,
                gw_engine,
                names=("a", "b"),
                valkey_url=redis_url if sharing else None,
                sim_rpm=60_000.0,
                calls_per_s=BUDGET,
                stated_burst_s=1.0,
            )
            return started.urls, started.secret

        yield start


async def _load(urls: list[str], secret: str, workers: dict[str, int]) -> dict[str, int]:
    """Keep ``workers[url]`` calls in flight at each gateway; count the 200s answered within
    the window after the warm-up, per gateway."""
    start = time.monotonic()
    counted = {url: 0 for url in urls}
    headers = {"authorization": f"Bearer {secret}"}

    async def worker(client: httpx.AsyncClient, url: str) -> None:
        while time.monotonic() - start < WARMUP_S + WINDOW_S:
            r = await client.post(url + "/v1/chat/completions", json=BODY, headers=headers)
            assert r.status_code == 200, r.text
            if WARMUP_S <= time.monotonic() - start < WARMUP_S + WINDOW_S:
                counted[url] += 1

    async with httpx.AsyncClient(timeout=30) as client:
        await asyncio.gather(
            *(worker(client, url) for url in urls for _ in range(workers.get(url, 0)))
        )
    return counted


def test_alone_two_replicas_send_twice_the_budget_sharing_they_split_it_by_demand(
    replicas: object,
) -> None:
    start = replicas  # the fixture's factory
    # naive: each replica paces at the whole budget
    urls, secret = start(sharing=False)  # type: ignore[operator]
    alone = asyncio.run(_load(urls, secret, {urls[0]: 8, urls[1]: 8}))
    assert sum(alone.values()) >= 1.6 * BUDGET * WINDOW_S, alone
    # shared: together they send the budget, split by demand: three harnesses call the first
    # replica for every one that calls the second, each back to back (a closed loop, so the
    # calls that arrive follow the split and cannot set it: the calls present do)
    urls, secret = start(sharing=True)  # type: ignore[operator]
    shared = asyncio.run(_load(urls, secret, {urls[0]: 12, urls[1]: 4}))
    total = sum(shared.values())
    assert 0.75 * BUDGET * WINDOW_S <= total <= 1.25 * BUDGET * WINDOW_S, shared
    expected = (1 - RESERVE) * 0.75 + RESERVE / 2
    assert expected - 0.12 <= shared[urls[0]] / total <= expected + 0.12, shared


def test_a_replica_with_all_the_demand_gets_nearly_all_the_budget(replicas: object) -> None:
    urls, secret = replicas(sharing=True)  # type: ignore[operator]
    counted = asyncio.run(_load(urls, secret, {urls[0]: 8}))
    # each replica says on /health what share it paces at
    busy, idle = (httpx.get(url + "/health", timeout=5).json() for url in urls)
    assert (busy["replica"], idle["replica"]) == ("a", "b")
    assert busy["shares"]["sim-openai"] > 0.9 and idle["shares"]["sim-openai"] < 0.1
    # its share is 1 - RESERVE/2 of the budget, not half of it
    expected = (1 - RESERVE / 2) * BUDGET * WINDOW_S
    assert 0.75 * expected <= counted[urls[0]] <= 1.25 * expected, counted
    assert counted[urls[1]] == 0
