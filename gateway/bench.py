"""``evalfleet bench gateway``: the gateway's added latency and sustained calls/s, per pacer.

It starts everything it needs on loopback and stops it: a ledger database and (unless a
Prefect API URL is given) a Prefect server, both on fresh PostgreSQL databases dropped at the
end; the simulated provider (no latency, limits far above the load) and the gateway, each in
its own process (spawned, configured by explicit settings, not by the environment). For each
pacer (``inprocess``, ``prefect``) it mints a run's keys the way launch does (provider key via
the admin API into a Prefect Secret block, gateway key hashed in the ledger), then measures:

* added latency: ``n`` sequential calls through the gateway and ``n`` straight to the provider
  (same requests, the run's provider key), interleaved in blocks of 10 so both see the same
  machine load; ``overhead_ms_pXX`` = gateway pXX - direct pXX;
* sustained calls/s: ``concurrency`` clients calling through the gateway for ``duration_s``,
  and the gateway process's CPU milliseconds per call (``/proc``), a figure that does not
  depend on what else the machine is running.

The pacer budgets are set high so that the pacer admits everything: this measures its cost,
not its limits (the pacing tests measure those).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from evalfleet.errors import EvalfleetError
from gateway.serving import free_port

BENCH_ALIAS = "bench-openai"


@dataclass(frozen=True)
class BenchOptions:
    pg_admin_url: str
    prefect_api_url: str | None
    calls: int = 300
    concurrency: int = 32
    duration_s: float = 5.0


def aliases_doc(sim_url: str) -> dict[str, Any]:
    return {
        "aliases": [
            {
                "name": BENCH_ALIAS,
                "flavour": "openai",
                "base_url": sim_url,
                "model": "sim-gpt",
                "prices": {
                    "input_per_mtok": 2_500_000,
                    "cached_input_per_mtok": 1_250_000,
                    "output_per_mtok": 10_000_000,
                },
                "cached_input_counts": True,
                "pacer": {
                    "calls_per_s": 5000.0,
                    "tokens_per_s": 1e8,
                    "inflight_tokens": 1e9,
                    "burst_s": 1.0,
                    "cooldown_s": 30.0,
                },
            }
        ]
    }


def serve_sim(port: int, admin_key: str, rpm: float | None = None) -> None:
    """The provider sim with limits far above any bench's load, or the OpenAI flavour's
    requests limited to ``rpm`` a minute and no rate-limit headers (the provider whose 429s
    the gateway must learn its limit from)."""
    from gateway.provider_sim.profile import DEFAULT_PROFILE, profile_from
    from gateway.provider_sim.server import ProviderSim
    from gateway.serving import serve

    big = {"rpm": rpm or 1e9, "tpm": 1e12, "input_tpm": None, "output_tpm": None}
    data = {
        **DEFAULT_PROFILE,
        "openai": {**DEFAULT_PROFILE["openai"], **big},
        "cache_prefixes": 1000,
        "rate_limit_headers": rpm is None,
    }
    serve(ProviderSim(profile_from(data), SecretStr(admin_key)).app, "127.0.0.1", port)


def _serve_gateway(port: int, overrides: dict[str, Any], prefect_api_url: str) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from evalfleet.settings import load_settings
    from gateway.factory import build_gateway
    from gateway.serving import serve

    with temporary_settings(updates={PREFECT_API_URL: prefect_api_url}):
        serve(build_gateway(load_settings(**overrides)).app, "127.0.0.1", port)


def wait_healthy(url: str, what: str, proc: Any, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        alive = proc.poll() is None if isinstance(proc, subprocess.Popen) else proc.is_alive()
        if not alive or time.monotonic() > deadline:
            raise EvalfleetError(f"bench: {what} did not become healthy at {url}")
        time.sleep(0.2)


@contextlib.contextmanager
def pg_database(admin_url: str, prefix: str) -> Iterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = make_url(admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        raise EvalfleetError(f"bench: cannot create a PostgreSQL database: {exc}") from None
    try:
        yield name
    finally:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def _prefect_server(admin_url: str) -> Iterator[str]:
    """A Prefect server on a fresh PostgreSQL database, with only its own environment."""
    from evalfleet.embedded import prefect_server

    with (
        pg_database(admin_url, "evalfleet_bench_prefect") as db,
        prefect_server(
            make_url(admin_url).set(database=db),
            inherit_environment=False,
            start_timeout_s=90.0,
            poll_s=0.2,
        ) as server,
    ):
        yield server.api_url


def bench_ledger(stack: contextlib.ExitStack, pg_admin_url: str, prefix: str) -> tuple[str, Any]:
    """A migrated throwaway ledger on PostgreSQL for the stack's life: (URL, session factory)."""
    from ledger.db import make_engine, session_factory
    from ledger.migrate import upgrade

    db = stack.enter_context(pg_database(pg_admin_url, prefix))
    url = (
        make_url(pg_admin_url)
        .set(drivername="postgresql+psycopg", database=db)
        .render_as_string(hide_password=False)
    )
    upgrade(url)
    engine = make_engine(url)
    stack.callback(engine.dispose)
    return url, session_factory(engine)


def start_sim(
    stack: contextlib.ExitStack, ctx: Any, admin_key: str, rpm: float | None = None
) -> str:
    """The provider sim (``serve_sim``) in its own process for the stack's life; its URL once
    healthy."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sim = ctx.Process(target=serve_sim, args=(port, admin_key, rpm), daemon=True)
    sim.start()
    stack.callback(stop_process, sim)
    wait_healthy(url + "/health", "the provider sim", sim)
    return url


def bench_run_keys(sessions: Any, name: str, minter: Any, store: Any) -> tuple[str, Any]:
    """A running run of the bench alias with its keys minted as launch mints them: (run id,
    ``RunKeys``); the spend cap is far above anything a bench spends."""
    from gateway.keys import mint_run_keys
    from ledger.models import Run

    run_id = str(uuid.uuid4())
    with sessions.begin() as session:
        session.add(
            Run(
                id=run_id,
                name=name,
                harness="bench",
                alias=BENCH_ALIAS,
                state="running",
                spend_cap_micro_usd=10**12,
                max_attempts=1,
                config={},
            )
        )
    keys = mint_run_keys(
        sessions,
        run_id=run_id,
        spend_cap_micro_usd=10**12,
        minter=minter,
        store=store,
        now=datetime.now(UTC),
        ttl_s=3600,
    )
    return run_id, keys


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _sequential(url: str, headers: dict[str, str], n: int) -> list[float]:
    out = []
    async with httpx.AsyncClient(timeout=30) as client:
        for i in range(n):
            body = {
                "model": BENCH_ALIAS if "efg_" in headers["authorization"] else "sim-gpt",
                "messages": [{"role": "user", "content": f"bench {i % 7}"}],
                "max_tokens": 16,
            }
            started = time.perf_counter()
            r = await client.post(url, headers=headers, json=body)
            out.append(time.perf_counter() - started)
            if r.status_code != 200:
                raise EvalfleetError(f"bench: call failed with HTTP {r.status_code}")
    return out


async def _interleaved(
    direct_url: str, direct_headers: dict[str, str], gw_url: str, gw_headers: dict[str, str], n: int
) -> tuple[list[float], list[float]]:
    """``n`` calls straight to the provider and ``n`` through the gateway, alternating in
    blocks of 10, so that both see the same machine load."""
    direct: list[float] = []
    via: list[float] = []
    for _ in range(max(1, n // 10)):
        direct += await _sequential(direct_url, direct_headers, 10)
        via += await _sequential(gw_url, gw_headers, 10)
    return direct, via


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _sustained(
    url: str, headers: dict[str, str], concurrency: int, duration_s: float
) -> tuple[float, int]:
    done = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        end = time.perf_counter() + duration_s

        async def worker(w: int) -> None:
            nonlocal done
            i = 0
            while time.perf_counter() < end:
                body = {
                    "model": BENCH_ALIAS,
                    "messages": [{"role": "user", "content": f"load {w} {i % 5}"}],
                    "max_tokens": 16,
                }
                r = await client.post(url, headers=headers, json=body)
                if r.status_code != 200:
                    raise EvalfleetError(f"bench: call failed with HTTP {r.status_code}")
                done += 1
                i += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return done / (time.perf_counter() - started), done


def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Run the benchmark; returns ``{"pacers": {...}, "direct_ms_p50": .., ...}``."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from gateway.keys import PrefectSecretKeyStore, ProviderAdminKeyMinter, revoke_run_keys

    ctx = multiprocessing.get_context("spawn")
    admin_key = "bench-admin-" + uuid.uuid4().hex
    results: dict[str, Any] = {"pacers": {}}
    with contextlib.ExitStack() as stack:
        ledger_url, sessions = bench_ledger(stack, options.pg_admin_url, "evalfleet_bench_ledger")
        prefect_url = options.prefect_api_url or stack.enter_context(
            _prefect_server(options.pg_admin_url)
        )
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: prefect_url}))
        sim_url = start_sim(stack, ctx, admin_key)
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="evalfleet-bench-")))
        aliases_file = workdir / "aliases.json"
        aliases_file.write_text(json.dumps(aliases_doc(sim_url)))
        minter = ProviderAdminKeyMinter(sim_url, SecretStr(admin_key))
        store = PrefectSecretKeyStore()
        for pacer in ("inprocess", "prefect"):
            run_id, keys = bench_run_keys(sessions, f"bench-{pacer}", minter, store)
            stack.callback(
                revoke_run_keys, sessions, run_id, minter=minter, store=store, now=datetime.now(UTC)
            )
            provider_key = asyncio.run(store.aget(run_id))
            assert provider_key is not None
            port = free_port()
            overrides = {
                "database_url": ledger_url,
                "aliases_file": aliases_file,
                "provider_sim_url": sim_url,
                "gateway_pacer": pacer,
                "gateway_max_retry_wait_s": 0.0,
                "pacer_sync_interval_s": 2.0,
            }
            gw = ctx.Process(
                target=_serve_gateway, args=(port, overrides, prefect_url), daemon=True
            )
            gw.start()
            try:
                gw_url = f"http://127.0.0.1:{port}"
                wait_healthy(gw_url + "/health", f"the gateway ({pacer} pacer)", gw)
                gw_headers = {"authorization": f"Bearer {keys.gateway_key.get_secret_value()}"}
                direct_headers = {"authorization": f"Bearer {provider_key.get_secret_value()}"}
                path = "/v1/chat/completions"
                asyncio.run(_sequential(gw_url + path, gw_headers, 50))  # warm-up
                asyncio.run(_sequential(sim_url + path, direct_headers, 50))
                direct, via = asyncio.run(
                    _interleaved(
                        sim_url + path, direct_headers, gw_url + path, gw_headers, options.calls
                    )
                )
                cpu_before = _cpu_seconds(gw.pid)
                rate, done = asyncio.run(
                    _sustained(gw_url + path, gw_headers, options.concurrency, options.duration_s)
                )
                cpu_ms_per_call = 1000 * (_cpu_seconds(gw.pid) - cpu_before) / max(1, done)
            finally:
                stop_process(gw)
            results["pacers"][pacer] = {
                "overhead_ms_p50": round(
                    1000 * (_percentile(via, 0.5) - _percentile(direct, 0.5)), 2
                ),
                "overhead_ms_p99": round(
                    1000 * (_percentile(via, 0.99) - _percentile(direct, 0.99)), 2
                ),
                "calls_per_s": round(rate, 1),
                "gateway_cpu_ms_per_call": round(cpu_ms_per_call, 2),
                "gateway_ms_p50": round(1000 * statistics.median(via), 2),
                "direct_ms_p50": round(1000 * statistics.median(direct), 2),
            }
    results["calls"] = options.calls
    results["concurrency"] = options.concurrency
    results["duration_s"] = options.duration_s
    return results


def stop_process(proc: Any) -> None:
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
