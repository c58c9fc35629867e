"""The Prefect-backed pacer on a real Prefect server (fixture ``prefect_api_url``)."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

from gateway.aliases import Aliases, load_aliases
from gateway.pacer_prefect import (
    PrefectPacer,
    counting_variable,
    limit_names,
    old_first_variable,
    push_budgets,
)
from gateway.pacing import CallEstimate, CallUsage, PacerUnavailable
from planner.budgets import Budgets
from planner.classify import Classification, LimitType
from planner.pacer import AGEING_TOKENS_PER_S
from planner.provisional_cut import CUT

pytestmark = pytest.mark.prefect


def _aliases(**per_alias: dict[str, Any]) -> Aliases:
    template = load_aliases(None, provider_sim_url="http://127.0.0.1:9").get("sim-anthropic")
    out = []
    for name, pacer in per_alias.items():
        seed = template.pacer.model_copy(update={"output_tokens_per_s": None, **pacer})
        out.append(
            template.model_copy(update={"name": name, "pacer": seed, "cached_input_counts": True})
        )
    return Aliases(out)


def _max_in_windows(
    events: Sequence[tuple[float, int]], width: float, key: Callable[[int], float]
) -> float:
    """Largest sum of ``key`` over admissions in any window [t, t + width)."""
    times = [t for t, _ in events]
    best = 0.0
    j = 0
    total = 0.0
    for i in range(len(events)):
        while j < len(events) and times[j] < times[i] + width:
            total += key(events[j][1])
            j += 1
        best = max(best, total)
        total -= key(events[i][1])
    return best


async def _flood(
    pacer: PrefectPacer,
    alias: str,
    sizes: list[int],
    until: float,
    events: list[tuple[float, int]],
    workers: int,
) -> None:
    async def worker() -> None:
        while time.monotonic() < until:
            est = CallEstimate(input_uncached=random.choice(sizes), max_output=0)
            permit = await pacer.acquire(alias, est)
            events.append((time.monotonic(), est.input_uncached))
            await pacer.settle(permit, CallUsage(input_uncached=est.input_uncached))

    await asyncio.gather(*(worker() for _ in range(workers)))


def test_pacing_holds_calls_and_tokens_budgets(prefect_api: str) -> None:
    # Two aliases paced at the same time: one bound by calls/s (small calls), one by tokens/s.
    r, t, b, duration = 20.0, 4000.0, 1.0, 12.0
    tag = uuid.uuid4().hex[:6]
    calls_alias, tokens_alias = f"calls-{tag}", f"tokens-{tag}"
    aliases = _aliases(
        **{
            calls_alias: {
                "calls_per_s": r,
                "tokens_per_s": t,
                "inflight_tokens": 1e9,
                "burst_s": b,
            },
            tokens_alias: {
                "calls_per_s": r,
                "tokens_per_s": t,
                "inflight_tokens": 1e9,
                "burst_s": b,
            },
        }
    )
    events: dict[str, list[tuple[float, int]]] = {calls_alias: [], tokens_alias: []}

    async def run() -> tuple[float, int]:
        pacer = PrefectPacer(aliases, sync_interval_s=1.0)
        await pacer.start()
        try:
            start = time.monotonic()
            until = start + duration
            await asyncio.gather(
                _flood(pacer, calls_alias, [10, 20, 30], until, events[calls_alias], 20),
                _flood(pacer, tokens_alias, [300, 400, 500], until, events[tokens_alias], 20),
            )
            return start, pacer.syncs
        finally:
            await pacer.close()

    start, syncs = asyncio.run(run())
    assert syncs >= 5  # the budgets were re-read from Prefect during the run
    for alias in (calls_alias, tokens_alias):
        ev = sorted(events[alias])
        for width in (10.0, 11.0):
            assert _max_in_windows(ev, width, lambda _n: 1) <= r * (width + b) + 1e-9
            assert _max_in_windows(ev, width, lambda n: n) <= t * (width + b) + 500  # + one call

    # Steady state (after the initial burst): within ±10% of the binding budget.
    def rate(alias: str, key: Callable[[int], float]) -> float:
        steady = [(ts, n) for ts, n in events[alias] if start + 2.0 <= ts < start + duration]
        return sum(key(n) for _, n in steady) / (duration - 2.0)

    assert rate(calls_alias, lambda _n: 1) == pytest.approx(r, rel=0.10)
    assert rate(tokens_alias, lambda n: n) == pytest.approx(t, rel=0.10)


def test_prefect_limits_are_the_source_of_truth(prefect_api: str) -> None:
    alias = f"truth-{uuid.uuid4().hex[:6]}"
    aliases = _aliases(
        **{
            alias: {
                "calls_per_s": 5.0,
                "tokens_per_s": 1000.0,
                "inflight_tokens": 1e6,
                "burst_s": 2.0,
            }
        }
    )
    names = limit_names(alias)

    async def run() -> None:
        pacer = PrefectPacer(aliases, sync_interval_s=0.3)
        await pacer.start()
        try:
            async with get_client() as client:
                calls = await client.read_global_concurrency_limit_by_name(names["calls_per_s"])
                assert (calls.limit, calls.slot_decay_per_second) == (10, 5.0)
                inflight = await client.read_global_concurrency_limit_by_name(
                    names["inflight_tokens"]
                )
                assert inflight.limit == 1_000_000
                # An operator edits the limit in Prefect: the pacer follows within a sync.
                await client.update_global_concurrency_limit(
                    names["calls_per_s"],
                    GlobalConcurrencyLimitUpdate(limit=80, slot_decay_per_second=40.0),
                )
                deadline = time.monotonic() + 3
                while pacer.budgets(alias).calls_per_s != 40.0:
                    assert time.monotonic() < deadline, "the edit never reached the pacer"
                    await asyncio.sleep(0.05)
                # An output budget the config lacks: none until the planner writes one (a
                # stated output limit it adopted), then the pacer enforces it.
                assert pacer.budgets(alias).output_tokens_per_s is None
                await push_budgets(
                    aliases.get(alias), replace(pacer.budgets(alias), output_tokens_per_s=250.0)
                )
                deadline = time.monotonic() + 3
                while pacer.budgets(alias).output_tokens_per_s != 250.0:
                    assert time.monotonic() < deadline, "the adopted output budget never arrived"
                    await asyncio.sleep(0.05)
                # The planner inferred that the provider ignores cache reads (the config says
                # they count): the pacer stops charging them within a sync.
                core = pacer._pacer(alias).core
                assert core.cached_input_counts is True
                await push_budgets(
                    aliases.get(alias), pacer.budgets(alias), cached_input_counts=False
                )
                deadline = time.monotonic() + 3
                while core.cached_input_counts:
                    assert time.monotonic() < deadline, "the inferred counting never arrived"
                    await asyncio.sleep(0.05)
                # The gateway's own verdict at a token 429 (gateway.send_log): the pacer counts
                # cache reads at once, and syncs do not undo it while the planner's belief (the
                # variable, still False) has not caught up
                pacer.recount(alias, True)
                syncs = pacer.syncs
                deadline = time.monotonic() + 3
                while pacer.syncs < syncs + 2:
                    assert time.monotonic() < deadline, "the pacer stopped syncing"
                    await asyncio.sleep(0.05)
                assert core.cached_input_counts is True
                pacer._pacer(alias).recounted_at = None  # the hold lapsed: the planner's word
                deadline = time.monotonic() + 3
                while core.cached_input_counts:
                    assert time.monotonic() < deadline, "the planner's belief never returned"
                    await asyncio.sleep(0.05)
                # A call's first 429 cuts the request budget at once (planner.provisional_cut);
                # syncs, the planner's limits unchanged, keep the cut; its next push ends it.
                pushed = pacer.pushed_budgets(alias)
                pacer.cut_at_429(alias, Classification(status=429, limit_type=LimitType.REQUESTS))
                cut_to = pushed.calls_per_s * CUT
                assert pacer.budgets(alias).calls_per_s == pytest.approx(cut_to)
                syncs = pacer.syncs
                deadline = time.monotonic() + 3
                while pacer.syncs < syncs + 2:
                    assert time.monotonic() < deadline, "the pacer stopped syncing"
                    await asyncio.sleep(0.05)
                assert pacer.budgets(alias).calls_per_s == pytest.approx(cut_to)
                moved = replace(pushed, calls_per_s=pushed.calls_per_s / 2)
                await push_budgets(aliases.get(alias), moved)
                deadline = time.monotonic() + 3
                while pacer.budgets(alias).calls_per_s != pytest.approx(moved.calls_per_s):
                    assert time.monotonic() < deadline, "the planner's budgets never arrived"
                    await asyncio.sleep(0.05)
                # Another replica serves the alias (gateway.replica_sync): this one paces at its
                # share of the Prefect limits; syncs keep the share, a push arrives scaled by it
                pacer.set_share(alias, 0.5)
                assert pacer.budgets(alias).calls_per_s == pytest.approx(moved.calls_per_s / 2)
                syncs = pacer.syncs
                deadline = time.monotonic() + 3
                while pacer.syncs < syncs + 2:
                    assert time.monotonic() < deadline, "the pacer stopped syncing"
                    await asyncio.sleep(0.05)
                assert pacer.budgets(alias).calls_per_s == pytest.approx(moved.calls_per_s / 2)
                await push_budgets(aliases.get(alias), replace(moved, calls_per_s=8.0))
                deadline = time.monotonic() + 3
                while pacer.budgets(alias).calls_per_s != pytest.approx(4.0):
                    assert time.monotonic() < deadline, "the push never arrived, halved"
                    await asyncio.sleep(0.05)
                assert pacer.pushed_budgets(alias).calls_per_s == 8.0
                pacer.set_share(alias, 1.0)
                assert pacer.budgets(alias).calls_per_s == 8.0
                # The planner's queue order (no instance left, narrow durations): an
                # output-bound queue goes in arrival order within a sync, and back.
                assert core.old_tasks_first is True
                for order in (False, True):
                    await push_budgets(
                        aliases.get(alias), pacer.budgets(alias), old_tasks_first=order
                    )
                    deadline = time.monotonic() + 3
                    while core.old_tasks_first is not order:
                        assert time.monotonic() < deadline, "the queue order never arrived"
                        await asyncio.sleep(0.05)
                # A deleted limit fails the alias (strict): nothing is admitted unpaced.
                await client.delete_global_concurrency_limit_by_name(names["tokens_per_s"])
                deadline = time.monotonic() + 3
                while True:
                    try:
                        p = await pacer.acquire(alias, CallEstimate(input_uncached=1))
                        await pacer.settle(p, None)
                    except PacerUnavailable as exc:
                        assert "missing" in str(exc)
                        break
                    assert time.monotonic() < deadline, "a missing limit still admitted calls"
                    await asyncio.sleep(0.05)
        finally:
            await pacer.close()

    asyncio.run(run())


def test_large_call_is_not_starved_by_small_ones(prefect_api: str) -> None:
    # Bucket capacity 1000 tokens (500/s x 2 s); the big call asks 1500: more than the bucket.
    alias = f"big-{uuid.uuid4().hex[:6]}"
    aliases = _aliases(
        **{
            alias: {
                "calls_per_s": 1000.0,
                "tokens_per_s": 500.0,
                "inflight_tokens": 1e9,
                "burst_s": 2.0,
            }
        }
    )
    order: list[tuple[str, float, float]] = []  # (kind, requested_at, admitted_at)

    async def small(pacer: PrefectPacer, until: float) -> None:
        while time.monotonic() < until:
            asked = time.monotonic()
            p = await pacer.acquire(alias, CallEstimate(input_uncached=50))
            order.append(("small", asked, time.monotonic()))
            await pacer.settle(p, CallUsage(input_uncached=50))

    async def big(pacer: PrefectPacer) -> None:
        await asyncio.sleep(1.0)
        asked = time.monotonic()
        p = await pacer.acquire(alias, CallEstimate(input_uncached=1500))
        order.append(("big", asked, time.monotonic()))
        await pacer.settle(p, CallUsage(input_uncached=1500))

    async def run() -> None:
        pacer = PrefectPacer(aliases, sync_interval_s=1.0)
        await pacer.start()
        try:
            until = time.monotonic() + 12.0
            await asyncio.gather(big(pacer), *(small(pacer, until) for _ in range(10)))
        finally:
            await pacer.close()

    asyncio.run(run())
    [(_, asked, admitted)] = [o for o in order if o[0] == "big"]
    # Under this token limit the smallest prompt goes first, ageing: small calls that ask
    # within (1500 - 50) / AGEING_TOKENS_PER_S = 4.8 s after the big one pass it; then it
    # waits for the <= 10 small calls queued ahead (500 tokens: 1 s) and a full bucket (2 s
    # of refill), before the flood ends (11 s after it asked).
    passed_for = (1500 - 50) / AGEING_TOKENS_PER_S
    assert admitted - asked <= passed_for + 3.0 + 1.5
    # no small call that asked later than that was admitted before it: it is not starved
    late = asked + passed_for + 0.2
    assert not [o for o in order if o[0] == "small" and o[1] > late and o[2] < admitted]
    assert [o for o in order if o[0] == "small" and o[2] > admitted]  # small calls resumed


def test_syncs_read_through_one_client_open_from_start_to_close(prefect_api: str) -> None:
    """Building a Prefect client takes tens of milliseconds of CPU on the event loop the
    gateway relays calls on; a client per read (three per alias per sync) stalled every call in
    flight and set the Prefect pacer's p99 added latency (~55 ms on a slow machine against
    ~5 ms with one client). The pacer opens one at start, syncs through it, closes it: here
    only that client can reach the server, every other would find nothing listening."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    alias = f"one-client-{uuid.uuid4().hex[:6]}"
    aliases = _aliases(
        **{alias: {"calls_per_s": 5.0, "tokens_per_s": 1000.0, "inflight_tokens": 1e6}}
    )
    made: list[Any] = []

    def factory() -> Any:
        with temporary_settings(updates={PREFECT_API_URL: prefect_api}):
            client = get_client()
        made.append(client)
        return client

    async def run() -> PrefectPacer:
        pacer = PrefectPacer(aliases, sync_interval_s=0.05, client_factory=factory)
        with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
            await pacer.start()
        try:
            syncs = pacer.syncs
            moved = replace(pacer.budgets(alias), calls_per_s=7.0)
            await push_budgets(aliases.get(alias), moved)  # the planner's write, elsewhere
            with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
                deadline = time.monotonic() + 10.0
                while (
                    pacer.syncs < syncs + 6 or pacer.budgets(alias).calls_per_s != 7.0
                ) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert made and not made[0]._closed  # open while the pacer runs
        finally:
            await pacer.close()
        return pacer

    pacer = asyncio.run(run())
    assert pacer.syncs >= 6
    assert pacer.budgets(alias).calls_per_s == 7.0  # read through the one client
    assert len(made) == 1
    assert made[0]._closed


def test_push_writes_limits_and_variables_through_the_given_client(prefect_api: str) -> None:
    """The planner's tick pushes every alias through one client (``tasks.plan``): the limits
    and both variables go through the client it is given. Here only that client can reach the
    server; a write through a client of its own (``Variable.aset`` builds one outside a flow
    run) would find nothing listening."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    alias = f"push-one-{uuid.uuid4().hex[:6]}"
    aliases = _aliases(
        **{alias: {"calls_per_s": 5.0, "tokens_per_s": 1000.0, "inflight_tokens": 1e6}}
    )
    budgets = Budgets(
        calls_per_s=9.0, tokens_per_s=900.0, output_tokens_per_s=None, inflight_tokens=5e5
    )
    # the first push creates both variables, the second overwrites them (and the limits)
    pushes = ((9.0, False, False), (10.0, True, True))

    async def run() -> tuple[float | None, Any, Any]:
        with temporary_settings(updates={PREFECT_API_URL: prefect_api}):
            client = get_client()
        async with client:
            with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
                for calls_per_s, counts, order in pushes:
                    await push_budgets(
                        aliases.get(alias),
                        replace(budgets, calls_per_s=calls_per_s),
                        cached_input_counts=counts,
                        old_tasks_first=order,
                        client=client,
                    )
            calls = await client.read_global_concurrency_limit_by_name(
                limit_names(alias)["calls_per_s"]
            )
            counting = await client.read_variable_by_name(counting_variable(alias))
            old_first = await client.read_variable_by_name(old_first_variable(alias))
        return calls.slot_decay_per_second, counting, old_first

    decay, counting, old_first = asyncio.run(run())
    assert decay == 10.0
    assert counting is not None and counting.value is True
    assert old_first is not None and old_first.value is True
