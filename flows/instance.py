"""Flow ``run-instance``: one attempt of one instance, given only a job reference.

Sequence: heartbeat the lease in the background → ``running`` → harness stage through the
gateway → ``evaluating`` → evaluation stage (in this flow run) → land the terminal row and delete
the job in one transaction. With ``EVALFLEET_EVAL_LAUNCHER=work-pool`` the flow run ends at
``evaluating`` instead: it hands the lease to a ``run-eval`` flow run on the eval pool
(``flows.evaluate``), which lands the row. An agent failure (``HarnessFailed``) lands as
``error``; anything else — a 429 or outage after the gateway's retries, a crash of our own
code — sends the job back to the queue, never scored. A lease lost meanwhile (reaped) makes
the landing a no-op refusal.
"""

from __future__ import annotations

from prefect import flow, task
from prefect.runtime import flow_run

from evalfleet.errors import HarnessFailed, InfrastructureFailure, StaleLease
from harnesses.base import Evaluation, HarnessResult
from tasks import instance as steps
from tasks import progress
from tasks.instance import JobRef

harness_stage = task(name="harness-stage")(steps.run_harness)
evaluation_stage = task(name="evaluation-stage")(steps.evaluate)
hand_to_eval = task(name="hand-to-eval")(steps.hand_to_eval)


@flow(name="run-instance", log_prints=False, persist_result=False)
def run_instance(job: JobRef) -> str:
    """Run one claimed job to its terminal row; returns the instance's final state."""
    lease = job.lease()
    with steps.Heartbeat(lease) as beat:
        try:
            cfg = steps.load_run_config(lease.run_id)
            steps.start_harness(lease, flow_run.get_id())
            result: HarnessResult | None = None
            verdict: Evaluation | None = None
            failure: HarnessFailed | None = None
            try:
                result = harness_stage(lease, cfg)
                if steps.evaluates_on_pool(cfg):
                    beat.stop()  # from here the run-eval flow run holds the lease
                    hand_to_eval(lease, result)
                    return "evaluating"
                verdict = evaluation_stage(lease, cfg, result.patch)
            except HarnessFailed as exc:
                failure = exc
            cost = steps.spent_micro_usd(lease.run_id, lease.instance_id)
            outcome = steps.outcome_of(result, verdict, failure, cost)
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
