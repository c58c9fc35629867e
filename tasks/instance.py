"""Instance tasks: one job attempt's side effects, each against its lease.

``JobRef`` is all a run-instance flow run is given (its only parameter): which job and which
lease. It holds no secret; the lease token only lets the holder of the *current* attempt move
the instance, and a stale token is refused by the ledger (``StaleLease``).

``Heartbeat`` extends the lease in a background thread while the stages run; if the lease is
lost (reaped and re-claimed) it notes it, and the landing will be refused.

With ``EVALFLEET_EVAL_LAUNCHER=work-pool`` the evaluation stage runs in a ``run-eval`` flow run
on the eval pool (``hand_to_eval``): the harness stage keeps its usage and patch on the
instance row, extends the lease by ``eval_wait_s`` (the time an evaluation may wait for an
eval-pool slot), creates the run-eval flow run with the same job reference and records its id
on the row, so the supervisor watches that flow run from then on. The run-eval flow run
heartbeats the same lease and lands the terminal row (``kept_result`` gives it the usage back).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select, update
from sqlalchemy.exc import SQLAlchemyError

from evalfleet.errors import EvalfleetError, HarnessFailed, NotFound, StaleLease
from evalfleet.runconfig import RunConfig
from evalfleet.settings import get_settings
from evalfleet.states import InstanceState
from harnesses import make_evaluator, make_harness
from harnesses.base import Deadline, Evaluation, HarnessContext, HarnessResult
from ledger import queue
from ledger.db import write_transaction
from ledger.models import InstanceResult, LlmCall, Run
from ledger.queue import Lease, Outcome
from ledger.reaper import requeue as queue_requeue
from tasks.keys import load_gateway_key
from tasks.ledger_io import engine

log = logging.getLogger(__name__)


def flow_run_name(instance_id: str, attempt: int) -> str:
    """The name of an attempt's run-instance flow run. The supervisor finds a booting attempt's
    flow run by this name (``tasks.supervise.reap_dead_boots``), so every launcher uses it."""
    return f"{instance_id} #{attempt}"


class JobRef(BaseModel):
    """A reference to one claimed job: the run-instance flow's only parameter."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    job_id: int = Field(ge=1)
    run_id: str = Field(min_length=1, max_length=36)
    instance_id: str = Field(min_length=1, max_length=256)
    stage: str = Field(min_length=1, max_length=16)
    token: str = Field(min_length=8, max_length=64)
    attempt: int = Field(ge=1)
    visible_until: str

    @classmethod
    def of(cls, lease: Lease) -> JobRef:
        return cls(
            job_id=lease.job_id,
            run_id=lease.run_id,
            instance_id=lease.instance_id,
            stage=lease.stage,
            token=lease.token,
            attempt=lease.attempt,
            visible_until=lease.visible_until.isoformat(),
        )

    @property
    def flow_run_name(self) -> str:
        return flow_run_name(self.instance_id, self.attempt)

    def lease(self) -> Lease:
        return Lease(
            job_id=self.job_id,
            run_id=self.run_id,
            instance_id=self.instance_id,
            stage=self.stage,
            token=self.token,
            attempt=self.attempt,
            visible_until=datetime.fromisoformat(self.visible_until),
        )


class Heartbeat:
    """Extends a lease every ``heartbeat_s`` until stopped; records a lost lease."""

    def __init__(self, lease: Lease, interval_s: float | None = None) -> None:
        self.lease = lease
        self.interval_s = interval_s if interval_s is not None else get_settings().heartbeat_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lease-heartbeat", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                queue.heartbeat(engine(), self.lease)
            except StaleLease:
                self.lost.set()
                return
            except SQLAlchemyError as exc:  # transient (locked, connection): retry next beat
                log.warning("heartbeat of %s failed: %s", self.lease.instance_id, exc)
            except Exception:  # logged; a dead heartbeat thread would let the
                # lease expire under a healthy instance, so it keeps beating
                log.exception("heartbeat of %s failed", self.lease.instance_id)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating (idempotent); no beat is sent after this returns."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def load_run_config(run_id: str) -> RunConfig:
    """The validated config stored on the run."""
    with engine().connect() as conn:
        data = conn.execute(select(Run.config).where(Run.id == run_id)).scalar_one()
    return RunConfig.from_mapping(data, None, source=f"runs[{run_id}].config")


def start_harness(lease: Lease, flow_run_id: str | None) -> None:
    """``booting → running``: the harness stage begins."""
    queue.mark_running(engine(), lease, flow_run_id=flow_run_id)


def run_harness(lease: Lease, cfg: RunConfig, *, http_client: Any = None) -> HarnessResult:
    """Run the harness stage through the gateway (raises HarnessFailed / InfrastructureFailure),
    within the run's ``timeouts.instance_s`` from now (``instance_timeout`` past it)."""
    harness = make_harness(cfg.harness.name, cfg.harness.options)
    deadline = Deadline.after(cfg.timeouts.instance_s)
    ctx = HarnessContext(
        run_id=lease.run_id,
        instance_id=lease.instance_id,
        alias=cfg.alias,
        gateway_url=get_settings().gateway_url,
        gateway_key=load_gateway_key(lease.run_id),
        attempt=lease.attempt,
        harness=cfg.harness.name,
        started_at=time.time(),
        http_client=http_client,
        deadline=deadline,
    )
    return harness.run(ctx)


def evaluate(lease: Lease, cfg: RunConfig, patch: str | None) -> Evaluation | None:
    """``running → evaluating`` (patch kept on the row) and grade it; None without an evaluator."""
    queue.mark_evaluating(engine(), lease, patch=patch)
    return grade(lease, cfg, patch)


def grade(lease: Lease, cfg: RunConfig, patch: str | None) -> Evaluation | None:
    """Grade ``patch`` with the run's evaluator (None without one); the row is ``evaluating``."""
    if cfg.evaluator is None:
        return None
    evaluator = make_evaluator(cfg.evaluator.name, cfg.evaluator.options)
    return evaluator.evaluate(lease.run_id, lease.instance_id, patch)


def spent_micro_usd(run_id: str, instance_id: str) -> int:
    """What the gateway recorded this instance's calls cost (all attempts)."""
    with engine().connect() as conn:
        total = conn.execute(
            select(func.coalesce(func.sum(LlmCall.cost_micro_usd), 0)).where(
                LlmCall.run_id == run_id, LlmCall.instance_id == instance_id
            )
        ).scalar_one()
    return int(total)


def outcome_of(
    result: HarnessResult | None,
    verdict: Evaluation | None,
    failure: HarnessFailed | None,
    cost_micro_usd: int,
) -> Outcome:
    """The terminal outcome: ``error`` for an agent failure, else the evaluator's verdict
    (``unresolved`` when there is no evaluator or no patch)."""
    usage = result if result is not None else HarnessResult(patch=None)
    resolved = verdict is not None and verdict.resolved
    if failure is not None:
        state = InstanceState.ERROR
    else:
        state = InstanceState.RESOLVED if resolved else InstanceState.UNRESOLVED
    return Outcome(
        state=state,
        calls=usage.calls,
        input_tokens=usage.input_tokens,
        cached_input_tokens=usage.cached_input_tokens,
        output_tokens=usage.output_tokens,
        cost_micro_usd=cost_micro_usd,
        error_class=failure.error_class[:64] if failure is not None else None,
        error_detail=failure.detail if failure is not None else None,
        patch=usage.patch,
    )


def land(lease: Lease, outcome: Outcome) -> None:
    """Terminal row + job deletion, one transaction (StaleLease if the lease was lost)."""
    queue.land(engine(), lease, outcome)


def requeue(lease: Lease, error: EvalfleetError | Exception) -> InstanceState:
    """Back to the queue (or ``lost`` past max attempts): not the agent's fault."""
    label = getattr(error, "error_class", type(error).__name__)
    return queue_requeue(engine(), lease, f"{label}: {error}"[:1000])


# --- the evaluation stage on the eval pool --------------------------------------------------


def evaluates_on_pool(cfg: RunConfig) -> bool:
    """Whether this run's evaluation stage is handed to a run-eval flow run on the eval pool."""
    return cfg.evaluator is not None and get_settings().eval_launcher == "work-pool"


def _mine(lease: Lease, state: InstanceState) -> Any:
    return (
        (InstanceResult.run_id == lease.run_id)
        & (InstanceResult.instance_id == lease.instance_id)
        & (InstanceResult.lease_token == lease.token)
        & (InstanceResult.state == state.value)
    )


def hand_to_eval(lease: Lease, result: HarnessResult) -> str:
    """``running → evaluating`` for a run-eval flow run on the eval pool; returns its id.

    The harness's usage and patch stay on the row, the lease is extended by ``eval_wait_s``
    (stop the harness's heartbeat first: a later beat would shorten it again), and the flow
    run is created with the same job reference (idempotent per lease). StaleLease if the lease
    was lost; NotFound if the eval deployment does not exist (the caller requeues the job).
    """
    settings = get_settings()
    with write_transaction(engine()) as conn:
        kept = conn.execute(
            update(InstanceResult)
            .where(_mine(lease, InstanceState.RUNNING))
            .values(
                calls=result.calls,
                input_tokens=result.input_tokens,
                cached_input_tokens=result.cached_input_tokens,
                output_tokens=result.output_tokens,
            )
        )
        if kept.rowcount != 1:
            raise StaleLease(f"{lease.run_id}/{lease.instance_id}: lease lost before evaluation")
    queue.mark_evaluating(
        engine(), lease, patch=result.patch, visibility_timeout_s=settings.eval_wait_s
    )
    flow_run_id = _create_eval_flow_run(JobRef.of(lease), settings.eval_deployment)
    record_eval_flow_run(lease, flow_run_id)
    return flow_run_id


def _create_eval_flow_run(ref: JobRef, deployment: str) -> str:
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            deployment_id = client.read_deployment_by_name(deployment).id
        except ObjectNotFound:
            raise NotFound(
                f"deployment {deployment} does not exist on the Prefect API "
                "(EVALFLEET_EVAL_DEPLOYMENT; `evalfleet deploy` creates it)"
            ) from None
        flow_run = client.create_flow_run_from_deployment(
            deployment_id,
            parameters={"job": ref.model_dump()},
            name=f"{ref.flow_run_name} eval",
            tags=["evalfleet", "eval", f"run:{ref.run_id}"],
            idempotency_key=f"evalfleet-eval-{ref.job_id}-{ref.token}",
        )
    return str(flow_run.id)


def record_eval_flow_run(lease: Lease, flow_run_id: str | None) -> None:
    """Name ``flow_run_id`` as the evaluating attempt's flow run (no-op once it has landed, or
    without a flow run)."""
    if flow_run_id is None:
        return
    with write_transaction(engine()) as conn:
        conn.execute(
            update(InstanceResult)
            .where(_mine(lease, InstanceState.EVALUATING))
            .values(flow_run_id=flow_run_id)
        )


def kept_result(lease: Lease) -> HarnessResult:
    """The harness stage's patch and usage kept on the evaluating row (StaleLease if the lease
    is no longer this attempt's or the instance is not evaluating)."""
    with engine().connect() as conn:
        row = conn.execute(
            select(
                InstanceResult.patch,
                InstanceResult.calls,
                InstanceResult.input_tokens,
                InstanceResult.cached_input_tokens,
                InstanceResult.output_tokens,
            ).where(_mine(lease, InstanceState.EVALUATING))
        ).first()
    if row is None:
        raise StaleLease(f"{lease.run_id}/{lease.instance_id}: not evaluating under this lease")
    return HarnessResult(
        patch=row.patch,
        calls=int(row.calls or 0),
        input_tokens=int(row.input_tokens or 0),
        cached_input_tokens=int(row.cached_input_tokens or 0),
        output_tokens=int(row.output_tokens or 0),
    )
