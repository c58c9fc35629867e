"""The queue's hot-path SQL, written by hand per database so each step is as few round trips
as the database allows (``ledger.queue`` chooses the statement by dialect).

PostgreSQL: claim and land are each ONE statement (data-modifying CTEs); claim picks its rows
with ``FOR UPDATE SKIP LOCKED`` so concurrent claimers never wait on or share a row; every
timestamp is the database's ``now()``. SQLite: the caller holds the single writer lock
(``BEGIN IMMEDIATE``); timestamps are bound as SQLAlchemy's SQLite DATETIME text
(``ledger.clock.sqlite_timestamp``) so they compare with rows written through the ORM.
Pause flags and the run's state are read inside the claim statement itself.
"""

from __future__ import annotations

from sqlalchemy import TextClause, text

from evalfleet.states import RUN_CLAIMABLE, InstanceState, instance_sources

_CLAIMABLE = ", ".join(f"'{s.value}'" for s in sorted(RUN_CLAIMABLE))
_QUEUED = InstanceState.QUEUED.value
_BOOTING = InstanceState.BOOTING.value


def _claimable_jobs(now: str, *, one_run: bool = False) -> str:
    """Visible, unleased jobs of ``:pool`` (of run ``:run_id`` only when ``one_run``), the
    earliest enqueued first and, among jobs enqueued together (a run's), in their run's launch
    order (``jobs.launch_rank``). ``enqueued_at`` never moves: a job whose lease expired or was
    given back takes its place again once visible, ahead of the jobs queued behind it, as a
    message requeued in RabbitMQ does. Behind them it would launch last, and an instance that
    was cut short is often a long one: the run would end on it. The partial index
    ``ix_jobs_claim`` holds this whole order over the unleased jobs, so the claim reads at
    most k rows of it past the ones it skips."""
    run_filter = " AND j.run_id = :run_id" if one_run else ""
    return f"""
    SELECT j.id FROM jobs j
    WHERE j.pool = :pool AND j.lease_token IS NULL AND j.visible_at <= {now}{run_filter}
      AND NOT EXISTS (SELECT 1 FROM pause_flags p
                      WHERE p.paused AND p.scope = 'pool' AND p.target = :pool)
      AND EXISTS (SELECT 1 FROM runs r WHERE r.id = j.run_id AND r.state IN ({_CLAIMABLE}))
      AND NOT EXISTS (SELECT 1 FROM pause_flags p
                      WHERE p.paused AND p.scope = 'run' AND p.target = j.run_id)
    ORDER BY j.enqueued_at, j.launch_rank, j.id
    LIMIT :k"""


def _pg_claim(*, one_run: bool) -> TextClause:
    return text(
        f"""
WITH picked AS ({_claimable_jobs("now()", one_run=one_run)}
    FOR UPDATE OF j SKIP LOCKED
), leased AS (
    UPDATE jobs SET lease_token = md5(random()::text || clock_timestamp()::text || jobs.id::text),
                    receive_count = jobs.receive_count + 1,
                    visible_at = now() + make_interval(secs => :vt)
    FROM picked WHERE jobs.id = picked.id
    RETURNING jobs.id, jobs.run_id, jobs.instance_id, jobs.stage, jobs.lease_token,
              jobs.receive_count, jobs.visible_at, jobs.launch_rank, jobs.enqueued_at
), booted AS (
    UPDATE instance_results ir SET state = '{_BOOTING}', lease_token = l.lease_token,
           attempt = l.receive_count, heartbeat_at = now(),
           started_at = COALESCE(ir.started_at, now()), claimed_at = now(), running_at = NULL
    FROM leased l
    WHERE ir.run_id = l.run_id AND ir.instance_id = l.instance_id AND ir.state = '{_QUEUED}'
)
SELECT l.id, l.run_id, l.instance_id, l.stage, l.lease_token, l.receive_count, l.visible_at,
       l.launch_rank, l.enqueued_at
FROM leased l, (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
"""
    )


PG_CLAIM: TextClause = _pg_claim(one_run=False)
#: ``PG_CLAIM`` restricted to the jobs of one run (``:run_id``): the dispatcher claims each
#: run's own fair share.
PG_CLAIM_RUN: TextClause = _pg_claim(one_run=True)


def _sqlite_claim_jobs(*, one_run: bool) -> TextClause:
    return text(
        f"""
UPDATE jobs SET lease_token = lower(hex(randomblob(16))),
                receive_count = receive_count + 1,
                visible_at = :deadline
WHERE id IN ({_claimable_jobs(":now", one_run=one_run)})
RETURNING id, run_id, instance_id, stage, lease_token, receive_count, launch_rank, enqueued_at
"""
    )


SQLITE_CLAIM_JOBS: TextClause = _sqlite_claim_jobs(one_run=False)
SQLITE_CLAIM_RUN_JOBS: TextClause = _sqlite_claim_jobs(one_run=True)

SQLITE_CLAIM_INSTANCE: TextClause = text(
    f"""
UPDATE instance_results SET state = '{_BOOTING}', lease_token = :token, attempt = :attempt,
       heartbeat_at = :now, started_at = COALESCE(started_at, :now), claimed_at = :now,
       running_at = NULL
WHERE run_id = :run_id AND instance_id = :instance_id AND state = '{_QUEUED}'
"""
)


def _sources(target: InstanceState) -> str:
    return ", ".join(f"'{s.value}'" for s in sorted(instance_sources(target)))


_LAND_SET = """state = :state, finished_at = {now}, input_tokens = :input_tokens,
       cached_input_tokens = :cached_input_tokens, output_tokens = :output_tokens,
       calls = :calls, cost_micro_usd = :cost_micro_usd, resolved = :resolved,
       error_class = :error_class, error_detail = :error_detail,
       patch = COALESCE(:patch, {alias}patch)"""


def pg_land(target: InstanceState) -> TextClause:
    """One statement: if the lease is current and the instance may end as ``target``, write the
    terminal row and delete the job; otherwise change nothing.

    Locks the job row, then the instance row (the order every other step uses, so a landing
    racing the reaper cannot deadlock: the reaper either changed the token first — then nothing
    matches — or skips the locked job). Returns one row (jobs deleted, instance rows landed):
    (1, 1) or (0, 0), never half, so it is safe in autocommit mode.
    """
    return text(
        f"""
WITH job AS (
    SELECT id, run_id, instance_id FROM jobs
    WHERE id = :job_id AND lease_token = :token
    FOR UPDATE
), target AS (
    SELECT ir.id FROM instance_results ir, job
    WHERE ir.run_id = job.run_id AND ir.instance_id = job.instance_id
      AND ir.lease_token = :token AND ir.state IN ({_sources(target)})
    FOR UPDATE OF ir
), landed AS (
    UPDATE instance_results ir SET {_LAND_SET.format(now="now()", alias="ir.")}
    FROM target WHERE ir.id = target.id
    RETURNING ir.id
), gone AS (
    DELETE FROM jobs WHERE id = :job_id AND lease_token = :token
      AND EXISTS (SELECT 1 FROM landed)
    RETURNING id
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM landed)
"""
    )


SQLITE_LAND_JOB: TextClause = text(
    "DELETE FROM jobs WHERE id = :job_id AND lease_token = :token RETURNING id"
)


def sqlite_land(target: InstanceState) -> TextClause:
    """Write the terminal row (then ``SQLITE_LAND_JOB`` deletes the job, same transaction)."""
    return text(
        f"""
UPDATE instance_results SET {_LAND_SET.format(now=":now", alias="")}
WHERE run_id = :run_id AND instance_id = :instance_id
  AND lease_token = :token AND state IN ({_sources(target)})
RETURNING id
"""
    )


PG_HEARTBEAT: TextClause = text(
    """
WITH extended AS (
    UPDATE jobs SET visible_at = now() + make_interval(secs => :vt)
    WHERE id = :job_id AND lease_token = :token
    RETURNING run_id, instance_id, visible_at
), beat AS (
    UPDATE instance_results ir SET heartbeat_at = now()
    FROM extended e
    WHERE ir.run_id = e.run_id AND ir.instance_id = e.instance_id AND ir.lease_token = :token
)
SELECT visible_at FROM extended
"""
)

SQLITE_HEARTBEAT_JOB: TextClause = text(
    "UPDATE jobs SET visible_at = :deadline WHERE id = :job_id AND lease_token = :token "
    "RETURNING id"
)

SQLITE_HEARTBEAT_INSTANCE: TextClause = text(
    "UPDATE instance_results SET heartbeat_at = :now "
    "WHERE run_id = :run_id AND instance_id = :instance_id AND lease_token = :token"
)
