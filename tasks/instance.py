"""Instance tasks: one job attempt's side effects, each against its lease.

``JobRef`` is all a run-instance flow run is given (its only parameter): which job and which
lease. It holds no secret; the lease token only lets the holder of the *current* attempt move
the instance, and a stale token is refused by the ledger (``StaleLease``).

``Heartbeat`` extends the lease in a background thread while the stages run; if the lease is
lost (reaped and re-claimed) it notes it, and the landing will be refused.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from evalfleet.errors import EvalfleetError, HarnessFailed, StaleLease
from evalfleet.runconfig import RunConfig
from evalfleet.settings import get_settings
from evalfleet.states import InstanceState
from harnesses import make_evaluator, make_harness
from harnesses.base import Evaluation, HarnessContext, HarnessResult
from ledger import queue
from ledger.models import LlmCall, Run
from ledger.queue import Lease, Outcome
from ledger.reaper import requeue as queue_requeue
from tasks.keys import load_gateway_key
from tasks.ledger_io import engine

log = logging.getLogger(__name__)


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

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def load_run_config(run_id: str) -> RunConfig:
    """The validated config stored on the run."""
    with engine().connect() as conn:
        data = conn.execute(select(Run.config).where(Run.id == run_id)).scalar_one()
    return RunConfig.from_mapping(data, None, source=f"runs[{run_id}].config")


def start_harness(lease: Lease, flow_run_id: str | None) -> None:
    """``booting → running``: the harness stage begins."""
    queue.mark_running(engine(), lease, flow_run_id=flow_run_id)


def run_harness(lease: Lease, cfg: RunConfig, *, http_client: Any = None) -> HarnessResult:
    """Run the harness stage through the gateway (raises HarnessFailed / InfrastructureFailure)."""
    harness = make_harness(cfg.harness.name, cfg.harness.options)
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
    )
    return harness.run(ctx)


def evaluate(lease: Lease, cfg: RunConfig, patch: str | None) -> Evaluation | None:
    """``running → evaluating`` (patch kept on the row) and grade it; None without an evaluator."""
    queue.mark_evaluating(engine(), lease, patch=patch)
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
