"""``evalfleet bench queue``: claims/s and landings/s of the ledger queue, SQLite and PostgreSQL.

For each database it makes a throw-away ledger (a temporary SQLite file; a temporary database
on the PostgreSQL server of ``--pg-url``), migrates it, enqueues ``--jobs`` jobs, then runs
``--workers`` concurrent workers (threads by default: a claim costs ~0.3 ms of Python and
the rest is waiting on the database, which releases the GIL; ``--mode processes`` is there to
compare) that claim one job per call until the queue is empty, wait for each other, and land
every lease they hold (outcome ``error`` from ``booting``: the same single
statement as any landing). It checks that every job was claimed exactly once and landed, and
reports the rates against the floors (200/s SQLite, 1,000/s PostgreSQL). The temporary
databases and files are removed afterwards, also on failure.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from evalfleet.errors import ConfigError, EvalfleetError
from evalfleet.settings import get_settings

FLOORS = {"sqlite": 200.0, "postgresql": 1000.0}
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@dataclass(frozen=True)
class QueueBench:
    """The figures of one database."""

    database: str
    workers: int
    mode: str
    jobs: int
    claims_per_s: float
    landings_per_s: float
    floor_per_s: float
    meets_floor: bool


def _worker(url: str, barrier: Any, results: Any, index: int) -> None:
    """Claim one job at a time until empty, wait for all, land what was claimed; report times."""
    from evalfleet.states import InstanceState
    from ledger import queue
    from ledger.db import make_engine

    engine = make_engine(url, pool_size=1, max_overflow=0)
    outcome = queue.Outcome(InstanceState.ERROR, error_class="bench")
    try:
        held: list[queue.Lease] = []
        barrier.wait(timeout=120)
        claim_start = time.time()
        while True:
            got = queue.claim(engine, "harness", 1, visibility_timeout_s=3600)
            if not got:
                break
            held.extend(got)
        claim_end = time.time()
        barrier.wait(timeout=120)
        land_start = time.time()
        for lease in held:
            queue.land(engine, lease, outcome)
        land_end = time.time()
        results.put(
            (
                index,
                [lease.job_id for lease in held],
                claim_start,
                claim_end,
                land_start,
                land_end,
                None,
            )
        )
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        results.put((index, [], 0.0, 0.0, 0.0, 0.0, f"{type(exc).__name__}: {exc}"))
    finally:
        engine.dispose()


def _run_workers(url: str, workers: int, mode: str) -> list[tuple[Any, ...]]:
    if mode == "processes":
        context = multiprocessing.get_context("fork")
        barrier: Any = context.Barrier(workers)
        results: Any = context.Queue()
        procs = [
            context.Process(target=_worker, args=(url, barrier, results, i)) for i in range(workers)
        ]
        for proc in procs:
            proc.start()
        try:
            collected = [results.get(timeout=600) for _ in procs]
        finally:
            for proc in procs:
                proc.join(timeout=30)
                if proc.is_alive():
                    proc.kill()
        return collected
    import queue as stdlib_queue

    tbarrier = threading.Barrier(workers)
    tresults: stdlib_queue.Queue[tuple[Any, ...]] = stdlib_queue.Queue()
    threads = [
        threading.Thread(target=_worker, args=(url, tbarrier, tresults, i)) for i in range(workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    return [tresults.get_nowait() for _ in threads]


def _bench(url: str, database: str, jobs: int, workers: int, mode: str) -> QueueBench:
    from ledger.db import make_engine
    from ledger.migrate import upgrade
    from ledger.runs import NewRun, create_run, instance_state_counts

    upgrade(url)
    engine = make_engine(url)
    run_id = str(uuid.uuid4())
    try:
        create_run(
            engine,
            NewRun(
                run_id=run_id,
                name="bench-queue",
                harness="simulated",
                alias="bench",
                instance_ids=[f"bench-{i:06d}" for i in range(jobs)],
                spend_cap_micro_usd=1,
                max_attempts=1,
            ),
        )
        collected = _run_workers(url, workers, mode)
        errors = [r[6] for r in collected if r[6] is not None]
        if errors:
            raise EvalfleetError(f"bench worker failed on {database}: {errors[0]}")
        claimed = [job for r in collected for job in r[1]]
        if len(claimed) != jobs or len(set(claimed)) != jobs:
            raise EvalfleetError(
                f"{database}: {len(claimed)} claims of {jobs} jobs ({len(set(claimed))} distinct)"
            )
        counts = instance_state_counts(engine, run_id)
        if counts != {"error": jobs}:
            raise EvalfleetError(f"{database}: not every job landed: {counts}")
    finally:
        engine.dispose()
    claim_s = max(r[3] for r in collected) - min(r[2] for r in collected)
    land_s = max(r[5] for r in collected) - min(r[4] for r in collected)
    claims, landings = jobs / claim_s, jobs / land_s
    floor = FLOORS[database]
    return QueueBench(
        database,
        workers,
        mode,
        jobs,
        round(claims, 1),
        round(landings, 1),
        floor,
        claims >= floor and landings >= floor,
    )


def _bench_sqlite(jobs: int, workers: int, mode: str) -> QueueBench:
    folder = Path(tempfile.mkdtemp(prefix="evalfleet-bench-queue-"))
    try:
        return _bench(f"sqlite:///{folder / 'ledger.sqlite3'}", "sqlite", jobs, workers, mode)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _pg_admin(url: URL) -> Any:
    import psycopg

    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    return psycopg.connect(dsn, autocommit=True, connect_timeout=10)


def _bench_postgresql(server: str, jobs: int, workers: int, mode: str) -> QueueBench:
    import psycopg

    base = make_url(server)
    if base.get_backend_name() != "postgresql":
        raise ConfigError("--pg-url", ["must be a postgresql:// or postgresql+psycopg:// URL"])
    name = f"evalfleet_bench_queue_{uuid.uuid4().hex[:8]}"
    try:
        with _pg_admin(base) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        shown = base.render_as_string(hide_password=True)
        raise EvalfleetError(f"cannot create a database on {shown}: {exc}".strip()) from None
    try:
        url = base.set(drivername="postgresql+psycopg", database=name)
        return _bench(url.render_as_string(hide_password=False), "postgresql", jobs, workers, mode)
    finally:
        with _pg_admin(base) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@click.command(name="queue")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with both databases.")
@click.option("--jobs", type=click.IntRange(100, 1_000_000), default=4000, show_default=True)
@click.option("--workers", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option(
    "--mode", type=click.Choice(["processes", "threads"]), default="threads", show_default=True
)
@click.option(
    "--pg-url",
    default=None,
    help=f"PostgreSQL server to make a temporary database on (default: the ledger URL if PostgreSQL, else {DEFAULT_PG}).",
)
@click.option(
    "--only",
    type=click.Choice(["sqlite", "postgresql"]),
    default=None,
    help="Bench one database only.",
)
def bench_queue(
    as_json: bool, jobs: int, workers: int, mode: str, pg_url: str | None, only: str | None
) -> None:
    """Claims/s and landings/s of the ledger queue with concurrent workers, one job per claim."""
    if pg_url is None:
        ledger = get_settings().ledger_url
        pg_url = ledger if ledger.startswith("postgresql") else DEFAULT_PG
    results: list[QueueBench] = []
    try:
        if only in (None, "sqlite"):
            results.append(_bench_sqlite(jobs, workers, mode))
        if only in (None, "postgresql"):
            results.append(_bench_postgresql(pg_url, jobs, workers, mode))
    except SQLAlchemyError as exc:
        raise EvalfleetError(f"bench queue: database error: {type(exc).__name__}") from None
    if as_json:
        click.echo(json.dumps({r.database: asdict(r) for r in results}))
        return
    for r in results:
        verdict = "meets" if r.meets_floor else "BELOW"
        click.echo(
            f"{r.database:<10} {r.workers} {r.mode}, {r.jobs} jobs: "
            f"{r.claims_per_s:,.0f} claims/s, {r.landings_per_s:,.0f} landings/s "
            f"({verdict} the {r.floor_per_s:,.0f}/s floor)"
        )


def register(root: click.Group) -> None:
    group = root.commands["bench"]
    assert isinstance(group, click.Group)
    group.add_command(bench_queue)
