"""``evalfleet bench replicas``: how closely gateway replicas that share an alias hold its budget.

It starts, on loopback, a throwaway PostgreSQL ledger, the simulated provider (limits far above
the load) and, for each mode, one gateway process per entry of ``workers`` (the in-process
pacer, spawned with explicit settings), all serving one alias whose calls/s budget is
``budget_calls_per_s`` (its buckets one second deep, stated or not, so what is measured is the
rate). Each replica gets ``workers[i]`` clients that call it back to back: the demand split.
After ``warmup_s`` it counts the calls answered over ``duration_s``, per replica.

* ``solo``: every replica paces alone (``EVALFLEET_GATEWAY_BUDGET_SHARING=solo``), the naive
  deployment: together they send about ``len(workers)`` times the budget;
* ``valkey``: they split the budget by demand through Valkey: together they send about the
  budget, each a share near ``0.9 x its demand share + 0.1 / replicas``
  (``planner.replica_shares``).

With ``provider_rpm`` the provider allows fewer calls than the budget (an operator's seed set
too high): a client answered 429 waits its retry-after (at most 5 s) and calls again, and the
bench counts the 429s per replica. A third mode then runs, ``valkey-own-429s``: sharing, but
with ``EVALFLEET_GATEWAY_SHARE_429S`` off, each replica learning only from its own 429s, which
says what carrying a 429 to the other replicas saves.

The provider key is minted by the provider sim's admin API and handed to each gateway process
in memory (a spawned process's arguments travel through a pipe, not its command line).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from evalfleet.errors import EvalfleetError
from gateway.bench import (
    BENCH_ALIAS,
    aliases_doc,
    bench_ledger,
    bench_run_keys,
    start_sim,
    stop_process,
    wait_healthy,
)
from gateway.serving import free_port

__all__ = ["ReplicaBenchOptions", "run_replica_bench"]


@dataclass(frozen=True)
class ReplicaBenchOptions:
    pg_admin_url: str
    valkey_url: str
    budget_calls_per_s: float = 100.0
    workers: tuple[int, ...] = (24, 8)
    warmup_s: float = 3.0
    duration_s: float = 10.0
    provider_rpm: float | None = None


def _serve_replica(
    port: int, overrides: dict[str, Any], run_id: str, provider_key: SecretStr
) -> None:
    from evalfleet.settings import load_settings
    from gateway.factory import build_gateway
    from gateway.keys import MemoryKeyStore
    from gateway.serving import serve

    store = MemoryKeyStore()
    store.put(run_id, provider_key)
    serve(build_gateway(load_settings(**overrides), store=store).app, "127.0.0.1", port)


#: the longest a bench client waits on a 429's retry-after before calling again
MAX_RETRY_WAIT_S = 5.0


async def _load(
    urls: Sequence[str], workers: Sequence[int], secret: str, warmup_s: float, duration_s: float
) -> tuple[list[int], list[int]]:
    """Per gateway, the calls answered 200 and the 429s within the window after the warm-up."""
    counted = [0] * len(urls)
    throttled = [0] * len(urls)
    headers = {"authorization": f"Bearer {secret}"}
    start = time.monotonic()

    def in_window() -> bool:
        return warmup_s <= time.monotonic() - start < warmup_s + duration_s

    async def worker(client: httpx.AsyncClient, index: int, w: int) -> None:
        i = 0
        while time.monotonic() - start < warmup_s + duration_s:
            body = {
                "model": BENCH_ALIAS,
                "messages": [{"role": "user", "content": f"replica {index} {w} {i % 5}"}],
                "max_tokens": 8,
            }
            r = await client.post(urls[index] + "/v1/chat/completions", json=body, headers=headers)
            i += 1
            if r.status_code == 429:
                throttled[index] += in_window()
                await asyncio.sleep(_retry_after(r))
                continue
            if r.status_code != 200:
                raise EvalfleetError(f"bench: a call failed with HTTP {r.status_code}")
            counted[index] += in_window()

    total = sum(workers)
    limits = httpx.Limits(max_connections=total, max_keepalive_connections=total)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(
            *(worker(client, index, w) for index, n in enumerate(workers) for w in range(n))
        )
    return counted, throttled


def _retry_after(response: httpx.Response) -> float:
    try:
        wait = float(response.headers.get("retry-after", "1"))
    except ValueError:
        wait = 1.0
    return min(max(wait, 0.0), MAX_RETRY_WAIT_S)


def _clear_alias(valkey_url: str) -> None:
    """Forget replicas an earlier bench left in Valkey (they would hold shares until reaped)."""
    import redis

    from gateway.replicas import demand_key, replicas_key, throttles_key

    client = redis.Redis.from_url(valkey_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        client.delete(
            replicas_key(BENCH_ALIAS), demand_key(BENCH_ALIAS), throttles_key(BENCH_ALIAS)
        )
    except (redis.RedisError, OSError) as exc:
        raise EvalfleetError(f"bench: Valkey does not answer: {type(exc).__name__}") from None
    finally:
        client.close()


def run_replica_bench(options: ReplicaBenchOptions) -> dict[str, Any]:
    """Run every mode; returns ``{"budget_calls_per_s": .., "modes": {"solo": .., "valkey": ..}}``
    (and ``"valkey-own-429s"`` with ``provider_rpm``)."""
    from gateway.keys import MemoryKeyStore, ProviderAdminKeyMinter

    if not options.workers or min(options.workers) < 0 or sum(options.workers) == 0:
        raise EvalfleetError("bench: workers: give each replica's clients, at least one in all")
    ctx = multiprocessing.get_context("spawn")
    admin_key = "bench-admin-" + uuid.uuid4().hex
    results: dict[str, Any] = {
        "budget_calls_per_s": options.budget_calls_per_s,
        "workers": list(options.workers),
        "duration_s": options.duration_s,
        "provider_rpm": options.provider_rpm,
        "modes": {},
    }
    modes = ["solo", "valkey"]
    if options.provider_rpm is not None:
        modes.append("valkey-own-429s")
    with contextlib.ExitStack() as stack:
        ledger_url, sessions = bench_ledger(stack, options.pg_admin_url, "evalfleet_bench_replicas")
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="evalfleet-bench-")))
        for mode in modes:
            # a fresh provider per mode: one an earlier mode drained would start this one in debt
            with contextlib.ExitStack() as per_mode:
                sim_url = start_sim(per_mode, ctx, admin_key, options.provider_rpm)
                doc = aliases_doc(sim_url)
                pacer = doc["aliases"][0]["pacer"]
                pacer.update(
                    calls_per_s=options.budget_calls_per_s, burst_s=1.0, stated_burst_s=1.0
                )
                aliases_file = workdir / f"aliases-{mode}.json"
                aliases_file.write_text(json.dumps(doc))
                store = MemoryKeyStore()
                minter = ProviderAdminKeyMinter(sim_url, SecretStr(admin_key))
                run_id, keys = bench_run_keys(sessions, f"bench-replicas-{mode}", minter, store)
                provider_key = asyncio.run(store.aget(run_id))
                assert provider_key is not None
                if mode != "solo":
                    _clear_alias(options.valkey_url)
                stack_of = _Stack(ledger_url, aliases_file, sim_url, run_id, provider_key)
                results["modes"][mode] = _measure(
                    ctx, options, mode, stack_of, keys.gateway_key.get_secret_value()
                )
    return results


@dataclass(frozen=True)
class _Stack:
    """What every gateway replica of the bench is started with."""

    ledger_url: str
    aliases_file: Path
    sim_url: str
    run_id: str
    provider_key: SecretStr


def _measure(
    ctx: Any, options: ReplicaBenchOptions, mode: str, stack: _Stack, secret: str
) -> dict[str, Any]:
    procs: list[Any] = []
    try:
        urls = []
        for index in range(len(options.workers)):
            port = free_port()
            overrides: dict[str, Any] = {
                "database_url": stack.ledger_url,
                "aliases_file": stack.aliases_file,
                "provider_sim_url": stack.sim_url,
                "gateway_pacer": "inprocess",
                "gateway_max_retry_wait_s": 0.0,
                "gateway_budget_sharing": "solo" if mode == "solo" else "valkey",
                "gateway_share_429s": mode != "valkey-own-429s",
            }
            if mode != "solo":
                overrides["valkey_url"] = options.valkey_url
                overrides["gateway_replica_id"] = f"bench-{index}-{uuid.uuid4().hex[:6]}"
            proc = ctx.Process(
                target=_serve_replica,
                args=(port, overrides, stack.run_id, stack.provider_key),
                daemon=True,
            )
            proc.start()
            procs.append(proc)
            urls.append(f"http://127.0.0.1:{port}")
        for index, (url, proc) in enumerate(zip(urls, procs, strict=True)):
            wait_healthy(url + "/health", f"gateway replica {index} ({mode})", proc)
        counted, throttled = asyncio.run(
            _load(urls, options.workers, secret, options.warmup_s, options.duration_s)
        )
    finally:
        for proc in procs:
            stop_process(proc)
    total = sum(counted)
    demand = sum(options.workers)
    rate = total / options.duration_s
    return {
        "calls_per_s": round(rate, 1),
        "ratio_to_budget": round(rate / options.budget_calls_per_s, 3),
        "http_429": sum(throttled),
        "replicas": [
            {
                "workers": w,
                "demand_share": round(w / demand, 3),
                "calls_per_s": round(c / options.duration_s, 1),
                "throughput_share": round(c / total, 3) if total else 0.0,
                "http_429": t,
            }
            for w, c, t in zip(options.workers, counted, throttled, strict=True)
        ],
    }
