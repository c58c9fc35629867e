"""Flow ``run-eval``: the evaluation stage of one instance on the eval pool.

Started by the instance's run-instance flow run when ``EVALFLEET_EVAL_LAUNCHER=work-pool``
(``tasks.instance.hand_to_eval``), with the same job reference: the instance is ``evaluating``
and the harness stage kept its patch and usage on the row. This flow run names itself as the
attempt's flow run, heartbeats the lease, grades the patch and lands the terminal row. As in
run-instance, an agent failure (``HarnessFailed``) lands as ``error``; any other failure sends
the job back to the queue (the whole attempt runs again), and a lease lost meanwhile makes the
landing a refusal. The in-process path (``flows.instance``) grades inside the instance flow run.
"""

from __future__ import annotations

from prefect import flow, task
from prefect.runtime import flow_run

from evalfleet.errors import HarnessFailed, InfrastructureFailure, StaleLease
from harnesses.base import Evaluation
from tasks import instance as steps
from tasks import progress
from tasks.instance import JobRef

grade_stage = task(name="evaluation-stage")(steps.grade)


@flow(name="run-eval", persist_result=False)
def run_eval(job: JobRef) -> str:
    """Grade the instance's kept patch and land it; returns the final state."""
    lease = job.lease()
    with steps.Heartbeat(lease) as beat:
        try:
            steps.record_eval_flow_run(lease, flow_run.get_id())
            kept = steps.kept_result(lease)
            cfg = steps.load_run_config(lease.run_id)
            failure: HarnessFailed | None = None
            verdict: Evaluation | None = None
            try:
                verdict = grade_stage(lease, cfg, kept.patch)
            except HarnessFailed as exc:
                failure = exc
            cost = steps.spent_micro_usd(lease.run_id, lease.instance_id)
            outcome = steps.outcome_of(kept, verdict, failure, cost)
        except StaleLease:
            return "lease-lost"
        except (InfrastructureFailure, Exception) as exc:
            if beat.lost.is_set():
                return "lease-lost"
            state = steps.requeue(lease, exc)
            if isinstance(exc, InfrastructureFailure):
                return str(state)
            raise
    try:
        steps.land(lease, outcome)
    except StaleLease:
        return "lease-lost"
    progress.publish_quietly(lease.run_id)
    return str(outcome.state)
