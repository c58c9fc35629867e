"""`evalfleet bench replicas`: gateway processes alone and sharing through the real Valkey; it
leaves no replica behind in Valkey and no database behind in PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg
import pytest
import redis

from evalfleet.settings import PROJECT_ROOT, child_environment
from gateway.bench import BENCH_ALIAS
from gateway.replicas import replicas_key
from planner.replica_shares import RESERVE
from tests.conftest import PG_ADMIN_URL


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "evalfleet.cli", "bench", "replicas", *args],
        cwd=PROJECT_ROOT,
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _databases() -> set[str]:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute("SELECT datname FROM pg_database").fetchall()
    return {r[0] for r in rows if str(r[0]).startswith("evalfleet_bench_replicas")}


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_bench_replicas_measures_both_modes(redis_url: str) -> None:
    before = _databases()
    done = bench(
        "--json", "--pg-admin-url", PG_ADMIN_URL, "--valkey-url", redis_url,
        "--budget", "30", "--workers", "9", "--workers", "3", "--warmup", "2", "--duration", "4",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    solo, shared = figures["modes"]["solo"], figures["modes"]["valkey"]
    assert solo["ratio_to_budget"] >= 1.6, solo
    assert 0.8 <= shared["ratio_to_budget"] <= 1.2, shared
    busy = shared["replicas"][0]
    expected = (1 - RESERVE) * busy["demand_share"] + RESERVE / 2
    assert abs(busy["throughput_share"] - expected) <= 0.12, shared
    # the replicas left Valkey as they stopped; the throwaway ledger was dropped
    client = redis.Redis.from_url(redis_url)
    assert client.zcard(replicas_key(BENCH_ALIAS)) == 0
    client.close()
    assert _databases() == before


def test_bench_replicas_refuses_bad_options() -> None:
    done = bench("--budget", "0", timeout=60)
    assert done.returncode == 2
    assert "--budget" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_bench_replicas_counts_the_429s_of_a_provider_below_the_budget(redis_url: str) -> None:
    done = bench(
        "--json", "--pg-admin-url", PG_ADMIN_URL, "--valkey-url", redis_url,
        "--budget", "30", "--workers", "6", "--workers", "2", "--warmup", "0.5",
        "--duration", "9", "--provider-rpm", "60",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    assert set(figures["modes"]) == {"solo", "valkey", "valkey-own-429s"}
    for mode, row in figures["modes"].items():
        # a fresh provider per mode allows 60 calls a minute from a full bucket of 60: the
        # budget of 30 calls/s empties it at once, the gateways hold (no header says for how
        # long) and try again, and the 429s are counted
        assert row["http_429"] >= 1, (mode, row)
        assert row["http_429"] == sum(r["http_429"] for r in row["replicas"])
        assert row["calls_per_s"] * figures["duration_s"] <= 60 + 10, (mode, row)
