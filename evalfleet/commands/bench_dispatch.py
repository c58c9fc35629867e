"""`evalfleet bench dispatch`: how fast the dispatcher turns queued jobs into flow runs, and how
long a planner tick takes with 1,000 live tasks.

Admission rate: a run of ``--jobs`` queued jobs on a temporary PostgreSQL ledger; the real
dispatcher pass (``flows.dispatch.dispatch_pass``: admission, per-run claims) with the work-pool
launcher, which creates one flow run of a run-instance deployment (on a process pool made for
the bench) per job — the call ``run_deployment(timeout=0)`` makes, batched on one client
(``WorkPoolLauncher.launch_many``). For comparison it also times 20 jobs launched one at a time
through ``run_deployment(timeout=0)`` itself. No worker is needed: a job counts once its flow
run exists (and the bench checks the server holds exactly that many). On a shared machine the
wall-clock rate follows the load, so it also reports the CPU each admitted job costs this
process and the Prefect server it started (its process group, from ``/proc``), and the rate
those costs allow with a free core each. The floor is
20/s, Fargate's sustained task-launch rate: launching faster than ECS can start tasks is moot.

Planner tick: the same ledger is topped up to 1,000 live tasks on one alias (about 80% running
with ages spread over 15 minutes, the rest booting) and ``tasks.plan.plan_tick`` — the ledger
part of a planner tick: read the fleet, advance budgets, decide, record — is timed.

It starts what it needs and stops it: a Prefect server on a temporary PostgreSQL database (or
the server ``--prefect-api-url`` names, where it removes the pool, deployment and flow runs it
made) and the temporary ledger database.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from sqlalchemy import text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from evalfleet.errors import ConfigError, EvalfleetError

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
FLOOR_PER_S = 20.0
PLANNER_LIVE = 1_000
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SINGLE_JOBS = 20  # launched one at a time through run_deployment, for comparison
ALIAS = "sim-openai"


@dataclass(frozen=True)
class DispatchBench:
    """The figures of one bench run."""

    jobs: int
    admitted_per_s: float
    admit_seconds: float
    flow_runs_created: int
    run_deployment_per_s: float
    run_deployment_jobs: int
    floor_per_s: float
    meets_floor: bool
    # CPU per admitted job (load-independent): this process (claims + client) and the Prefect
    # server's process group (None for a given server); the rate reachable with a core for each
    # of those processes (bounded by the busiest one)
    bench_cpu_ms_per_job: float
    server_cpu_ms_per_job: float | None
    cpu_bound_per_s: float | None
    planner_live_tasks: int
    planner_tick_ms_median: float
    planner_tick_ms_max: float
    planner_ticks: int
    prefect_server: str
    load_average_1m: float  # the machine's load while measuring: shared cores slow every figure


class BenchError(EvalfleetError):
    """The bench could not set up or measure (a service missing, a count that does not add up)."""


# --- services --------------------------------------------------------------------------------


def _pg_admin(url: URL) -> Any:
    import psycopg

    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    return psycopg.connect(dsn, autocommit=True, connect_timeout=10)


@contextmanager
def temporary_database(server: str, prefix: str) -> Iterator[URL]:
    """A new empty PostgreSQL database on ``server``, dropped on exit."""
    import psycopg

    base = make_url(server)
    if base.get_backend_name() != "postgresql":
        raise ConfigError("--pg-url", ["must be a postgresql:// or postgresql+psycopg:// URL"])
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    try:
        with _pg_admin(base) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        shown = base.render_as_string(hide_password=True)
        raise BenchError(f"cannot create a database on {shown}: {exc}".strip()) from None
    try:
        yield base.set(database=name)
    finally:
        with _pg_admin(base) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def group_cpu_s(pgid: int) -> dict[int, float]:
    """CPU seconds (user + system) used so far by each live process of process group ``pgid``."""
    used: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended meanwhile
        if int(fields[2]) == pgid:
            used[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return used


def _use(prefect_url: str, ledger_url: str, jobs: int) -> None:
    """Point this process (Prefect client, ledger engine) at the bench's services."""
    import prefect.context

    from evalfleet.settings import export_environment, export_settings
    from tasks import ledger_io

    export_environment({"PREFECT_API_URL": prefect_url})
    cap = str(max(jobs, PLANNER_LIVE))  # no planner runs: the bootstrap ceiling admits them all
    export_settings(database_url=ledger_url, static_cap=cap, bootstrap_ceiling=cap)
    prefect.context.refresh_global_settings_context()
    ledger_io.engine.cache_clear()
    ledger_io.sessions.cache_clear()


@contextmanager
def bench_deployment(tag: str) -> Iterator[tuple[str, Any]]:
    """A process pool and a run-instance deployment on it; yields ("flow/deployment", its id).

    On exit the deployment's flow runs, the deployment and the pool are deleted.
    """
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from flows.instance import run_instance

    pool = f"evalfleet-bench-{tag}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        flow_id = client.create_flow_from_name(run_instance.name)
        deployment_id = client.create_deployment(
            flow_id=flow_id,
            name=f"bench-{tag}",
            entrypoint="flows/instance.py:run_instance",
            work_pool_name=pool,
            parameter_openapi_schema=run_instance.parameters.model_dump(),
            enforce_parameter_schema=True,
        )
    try:
        yield f"{run_instance.name}/bench-{tag}", deployment_id
    finally:
        with get_client(sync_client=True) as client:
            only = DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
            while runs := client.read_flow_runs(deployment_filter=only, limit=200):
                for flow_run in runs:
                    client.delete_flow_run(flow_run.id)
            client.delete_deployment(deployment_id)
            client.delete_work_pool(pool)


def count_flow_runs(deployment_id: Any) -> int:
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        return int(
            client.count_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
            )
        )


# --- measurements ----------------------------------------------------------------------------


def _new_run(n: int, prefix: str) -> str:
    from ledger.runs import NewRun, create_run
    from tasks.ledger_io import engine

    run_id = str(uuid.uuid4())
    create_run(
        engine(),
        NewRun(
            run_id=run_id,
            name=f"bench-{prefix}",
            harness="simulated",
            alias=ALIAS,
            instance_ids=[f"{prefix}-{i:05d}" for i in range(n)],
            spend_cap_micro_usd=1_000_000,
        ),
    )
    return run_id


def measure_admission(jobs: int, deployment: str, timeout_s: float) -> tuple[float, int]:
    """Seconds for the dispatcher to turn ``jobs`` queued jobs into flow runs; jobs started."""
    from flows.dispatch import dispatch_pass
    from tasks.launchers import WorkPoolLauncher

    _new_run(jobs, "dispatch")
    launcher = WorkPoolLauncher(deployment, jobs)
    started = 0
    begin = time.perf_counter()
    while started < jobs:
        started += dispatch_pass(launcher)
        if time.perf_counter() - begin > timeout_s:
            break
    return time.perf_counter() - begin, started


def measure_run_deployment(jobs: int, deployment: str) -> float:
    """Jobs/s of the one-at-a-time path (``WorkPoolLauncher.launch``: ``run_deployment``)."""
    from ledger import queue
    from tasks.instance import JobRef
    from tasks.launchers import WorkPoolLauncher
    from tasks.ledger_io import engine

    run_id = _new_run(jobs, "single")
    leases = queue.claim(engine(), "harness", jobs, run_id=run_id)
    launcher = WorkPoolLauncher(deployment, jobs)
    begin = time.perf_counter()
    for lease in leases:
        launcher.launch(JobRef.of(lease))
    return len(leases) / (time.perf_counter() - begin)


def seed_live(total: int) -> None:
    """Top the ledger up to ``total`` live tasks: claim them, ~80% running with spread ages."""
    from ledger import queue
    from tasks.ledger_io import engine

    with engine().connect() as conn:
        live = int(
            conn.execute(
                text(
                    "SELECT count(*) FROM instance_results "
                    "WHERE state IN ('booting', 'running', 'evaluating')"
                )
            ).scalar_one()
        )
    missing = total - live
    if missing > 0:
        run_id = _new_run(missing, "planner")
        claimed = queue.claim(engine(), "harness", missing, run_id=run_id)
        if len(claimed) != missing:
            raise BenchError(f"seeding the planner's fleet claimed {len(claimed)} of {missing}")
    with engine().begin() as conn:
        conn.execute(
            text(
                "UPDATE instance_results SET state = 'running', "
                "started_at = now() - make_interval(secs => (id % 900)) "
                "WHERE state = 'booting' AND id % 5 <> 0"
            )
        )


def measure_planner_tick(ticks: int) -> list[float]:
    """Seconds of each of ``ticks`` planner ticks (the ledger part, ``plan_tick``)."""
    from tasks import plan

    seconds = []
    for _ in range(ticks):
        begin = time.perf_counter()
        decisions = plan.plan_tick(datetime.now(UTC), False)
        seconds.append(time.perf_counter() - begin)
        if ALIAS not in decisions:
            raise BenchError(f"the planner tick decided no ceiling for {ALIAS}")
        if decisions[ALIAS].live + decisions[ALIAS].booting < PLANNER_LIVE:
            seen = decisions[ALIAS].live + decisions[ALIAS].booting
            raise BenchError(f"the planner saw {seen} live tasks, not {PLANNER_LIVE}")
    return seconds


def run_bench(
    jobs: int, pg_url: str, prefect_api_url: str | None, ticks: int, timeout_s: float
) -> DispatchBench:
    """Start (or use) the services, measure both figures, stop what was started."""
    from ledger.migrate import upgrade

    with temporary_database(pg_url, "evalfleet_bench_dispatch") as ledger:
        ledger_url = ledger.set(drivername="postgresql+psycopg").render_as_string(
            hide_password=False
        )
        upgrade(ledger_url)
        with _prefect(pg_url, prefect_api_url) as (api_url, origin, pgid):
            _use(api_url, ledger_url, jobs)
            with bench_deployment(uuid.uuid4().hex[:8]) as (deployment, deployment_id):
                cpu_before, server_before = time.process_time(), group_cpu_s(pgid or -1)
                seconds, started = measure_admission(jobs, deployment, timeout_s)
                bench_cpu = (time.process_time() - cpu_before) / jobs
                server_after = group_cpu_s(pgid or -1)
                # per server process (API, services): each can have a core of its own
                per_process = [
                    (used - server_before.get(pid, 0.0)) / jobs
                    for pid, used in server_after.items()
                ]
                single = measure_run_deployment(SINGLE_JOBS, deployment)
                created = count_flow_runs(deployment_id)
                if started != jobs or created != jobs + SINGLE_JOBS:
                    raise BenchError(
                        f"{jobs} + {SINGLE_JOBS} jobs queued, {started} + {SINGLE_JOBS} "
                        f"admitted, {created} flow runs created (within {timeout_s:g} s)"
                    )
                seed_live(PLANNER_LIVE)
                tick_s = measure_planner_tick(ticks)
            from tasks import ledger_io

            ledger_io.engine().dispose()
    rate = jobs / seconds
    server_cpu = sum(per_process) if pgid else None
    busiest = max([bench_cpu, *per_process]) if pgid else None
    return DispatchBench(
        jobs=jobs,
        # rounded down: a figure shown at the floor meets it (19.96/s is not "20.0, below")
        admitted_per_s=math.floor(rate * 10) / 10,
        admit_seconds=round(seconds, 3),
        flow_runs_created=created,
        run_deployment_per_s=round(single, 1),
        run_deployment_jobs=SINGLE_JOBS,
        floor_per_s=FLOOR_PER_S,
        meets_floor=rate >= FLOOR_PER_S,
        bench_cpu_ms_per_job=round(bench_cpu * 1000, 2),
        server_cpu_ms_per_job=round(server_cpu * 1000, 2) if server_cpu is not None else None,
        cpu_bound_per_s=round(1 / busiest, 1) if busiest else None,
        planner_live_tasks=PLANNER_LIVE,
        planner_tick_ms_median=round(statistics.median(tick_s) * 1000, 1),
        planner_tick_ms_max=round(max(tick_s) * 1000, 1),
        planner_ticks=ticks,
        prefect_server=origin,
        load_average_1m=round(os.getloadavg()[0], 2),
    )


@contextmanager
def _prefect(pg_url: str, given: str | None) -> Iterator[tuple[str, str, int | None]]:
    if given is not None:
        yield given, "given", None
        return
    from evalfleet.embedded import prefect_server

    with (
        temporary_database(pg_url, "evalfleet_bench_prefect") as database,
        prefect_server(database) as server,
    ):
        yield server.api_url, "started (PostgreSQL)", server.pid


@click.command(name="dispatch")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with every figure.")
@click.option(
    "--jobs",
    type=click.IntRange(20, PLANNER_LIVE),
    default=300,
    show_default=True,
    help="Queued jobs the dispatcher turns into flow runs.",
)
@click.option(
    "--ticks", type=click.IntRange(1, 100), default=5, show_default=True, help="Planner ticks."
)
@click.option(
    "--pg-url",
    default=DEFAULT_PG,
    show_default=True,
    help="PostgreSQL server for the temporary ledger (and Prefect server) databases.",
)
@click.option(
    "--prefect-api-url",
    default=None,
    help="Use this Prefect API instead of starting a server (the bench removes what it made).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(1, 3600),
    default=300.0,
    show_default=True,
    help="Seconds the admission measurement may take before the bench gives up.",
)
def bench_dispatch(
    as_json: bool, jobs: int, ticks: int, pg_url: str, prefect_api_url: str | None, timeout_s: float
) -> None:
    """Jobs admitted/s from the queue to created flow runs, and the planner tick at 1,000 live."""
    if prefect_api_url is not None and not prefect_api_url.startswith(("http://", "https://")):
        raise ConfigError("--prefect-api-url", ["must be an http(s):// URL ending in /api"])
    try:
        result = run_bench(jobs, pg_url, prefect_api_url, ticks, timeout_s)
    except SQLAlchemyError as exc:
        raise BenchError(f"bench dispatch: database error: {type(exc).__name__}") from None
    if as_json:
        click.echo(json.dumps(asdict(result)))
        return
    verdict = "meets" if result.meets_floor else "BELOW"
    click.echo(
        f"dispatch: {result.jobs} jobs -> flow runs in {result.admit_seconds:.2f} s: "
        f"{result.admitted_per_s:,.1f} jobs/s ({verdict} the {result.floor_per_s:g}/s floor); "
        f"one at a time through run_deployment: {result.run_deployment_per_s:,.1f} jobs/s; "
        f"Prefect server: {result.prefect_server}"
    )
    if result.server_cpu_ms_per_job is not None:
        click.echo(
            f"CPU per job: {result.bench_cpu_ms_per_job:.1f} ms here (claims + client), "
            f"{result.server_cpu_ms_per_job:.1f} ms in the Prefect server: "
            f"~{result.cpu_bound_per_s:,.0f} jobs/s with a free core per process"
        )
    click.echo(
        f"planner tick with {result.planner_live_tasks:,} live tasks: median "
        f"{result.planner_tick_ms_median:,.1f} ms, max {result.planner_tick_ms_max:,.1f} ms "
        f"over {result.planner_ticks} ticks"
    )
    click.echo(
        f"load average (1 min) at the end: {result.load_average_1m:.2f} on {os.cpu_count()} CPUs"
    )


def register(root: click.Group) -> None:
    group = root.commands["bench"]
    assert isinstance(group, click.Group)
    group.add_command(bench_dispatch)
