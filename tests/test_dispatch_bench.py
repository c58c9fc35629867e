"""`evalfleet bench dispatch`: it measures on real services and cleans up after itself; bad
options are refused with a message naming the option."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from evalfleet.settings import PROJECT_ROOT, child_environment


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "evalfleet.cli", "bench", "dispatch", *args],
        cwd=PROJECT_ROOT,
        env=child_environment(PREFECT_SERVER_ANALYTICS_ENABLED="false"),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.postgres
@pytest.mark.prefect
@pytest.mark.slow
def test_bench_dispatch_measures_on_a_given_server_and_removes_what_it_made(
    prefect_api_url: str, pg_database: str
) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    done = bench(
        "--json", "--jobs", "20", "--ticks", "2", "--prefect-api-url", prefect_api_url,
        "--pg-url", pg_database,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["jobs"] == 20
    # every queued job became exactly one flow run (20 batched + 20 one at a time)
    assert figures["flow_runs_created"] == 40
    assert figures["admitted_per_s"] > 0 and figures["run_deployment_per_s"] > 0
    assert figures["meets_floor"] == (figures["admitted_per_s"] >= 20.0)
    assert figures["planner_live_tasks"] == 1000
    assert 0 < figures["planner_tick_ms_median"] <= figures["planner_tick_ms_max"]
    assert figures["prefect_server"] == "given"
    # CPU per job is measured here; a given server's CPU is not visible to the bench
    assert figures["bench_cpu_ms_per_job"] > 0
    assert figures["server_cpu_ms_per_job"] is None and figures["cpu_bound_per_s"] is None
    with get_client(sync_client=True) as client:
        pools = [p.name for p in client.read_work_pools()]
        left = client.read_deployments(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(like_="bench-"))
        )
    assert not [p for p in pools if p.startswith("evalfleet-bench-")]
    assert left == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--prefect-api-url", "ftp://x"), "--prefect-api-url"),
        (("--jobs", "5"), "--jobs"),
        (("--pg-url", "sqlite:///x.db", "--prefect-api-url", "http://127.0.0.1:9/api"), "--pg-url"),
    ],
)
def test_bad_options_are_refused_naming_the_option(args: tuple[str, ...], message: str) -> None:
    done = bench(*args, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
