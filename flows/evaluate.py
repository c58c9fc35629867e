"""Flow ``run-eval``: the evaluation stage of one instance on the eval pool.

Given a job reference whose instance is ``evaluating`` (its patch kept on the row by the
harness stage), grade the patch and land the terminal row. The in-process path
(``flows.instance``) runs the same task inside the instance flow run.
"""

from __future__ import annotations

from prefect import flow
from sqlalchemy import select

from evalfleet.errors import HarnessFailed, StaleLease
from ledger.models import InstanceResult
from tasks import instance as steps
from tasks import progress
from tasks.instance import JobRef
from tasks.ledger_io import engine


@flow(name="run-eval", persist_result=False)
def run_eval(job: JobRef) -> str:
    """Grade the instance's kept patch and land it; returns the final state."""
    lease = job.lease()
    cfg = steps.load_run_config(lease.run_id)
    with engine().connect() as conn:
        patch = conn.execute(
            select(InstanceResult.patch).where(
                InstanceResult.run_id == lease.run_id,
                InstanceResult.instance_id == lease.instance_id,
            )
        ).scalar_one()
    failure: HarnessFailed | None = None
    verdict = None
    with steps.Heartbeat(lease):
        try:
            if cfg.evaluator is not None:
                from harnesses import make_evaluator

                evaluator = make_evaluator(cfg.evaluator.name, cfg.evaluator.options)
                verdict = evaluator.evaluate(lease.run_id, lease.instance_id, patch)
        except HarnessFailed as exc:
            failure = exc
    cost = steps.spent_micro_usd(lease.run_id, lease.instance_id)
    outcome = steps.outcome_of(None, verdict, failure, cost)
    try:
        steps.land(lease, outcome)
    except StaleLease:
        return "lease-lost"
    progress.publish_quietly(lease.run_id)
    return str(outcome.state)
