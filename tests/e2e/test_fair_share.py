"""Two runs on one alias share a binding ceiling by priority, end to end.

Runs launched through the ``launch-run`` flow, the real dispatcher loop with the in-process
launcher (instance flows on the session's Prefect server, calling the real gateway and the
simulated provider), a PostgreSQL ledger. The planner's ceiling for the alias is fixed at 8 by
writing its ``planner_decisions`` row (the planner's output interface), so the test controls
the binding ceiling while the launcher has more threads than that. A sampler reads the live
(booting + running: ``INSTANCE_CALLING``, what the ceiling bounds; an evaluating instance is done
with the LLM) count of each run from the ledger every 0.2 s: while both
runs have queued work the priority-1 and priority-3 runs hold about 2 and 6 slots; once the
priority-3 run has finished, the other takes the whole ceiling; the ceiling is never exceeded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import func, insert, select

from evalfleet.embedded import EmbeddedStack
from evalfleet.states import INSTANCE_CALLING
from flows.dispatch import dispatcher_loop
from flows.launch import launch_run
from flows.supervisor import supervise_once
from ledger.db import make_engine
from ledger.models import InstanceResult, Job, PlannerDecision, Run
from tasks import ledger_io

pytestmark = [pytest.mark.postgres, pytest.mark.prefect, pytest.mark.slow]

_CALLING = tuple(s.value for s in INSTANCE_CALLING)

CEILING = 8
ALIAS = "sim-openai"


def config(name: str, n: int, priority: float) -> dict[str, Any]:
    return {
        "name": name,
        "harness": {
            "name": "simulated",
            "options": {"calls_median": 3, "calls_sigma": 0.0, "think_s": 0.4, "token_scale": 0.05},
        },
        "alias": ALIAS,
        "instances": [f"{name}-{i}" for i in range(n)],
        "caps": {"spend_usd": 5.0},
        "priority": priority,
    }


class Sampler(threading.Thread):
    """Live and queued counts per run, read from the ledger every ``every_s`` seconds."""

    def __init__(self, url: str, every_s: float = 0.2) -> None:
        super().__init__(name="fair-share-sampler", daemon=True)
        self.engine = make_engine(url)
        self.every_s = every_s
        self.samples: list[tuple[float, dict[str, int], dict[str, int]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            with self.engine.connect() as conn:
                live = dict(
                    conn.execute(
                        select(InstanceResult.run_id, func.count())
                        .where(InstanceResult.state.in_(_CALLING))
                        .group_by(InstanceResult.run_id)
                    )
                    .tuples()
                    .all()
                )
                queued = dict(
                    conn.execute(
                        select(Job.run_id, func.count())
                        .where(Job.lease_token.is_(None))
                        .group_by(Job.run_id)
                    )
                    .tuples()
                    .all()
                )
            self.samples.append((time.monotonic(), live, queued))


def test_priorities_1_and_3_share_the_ceiling_1_to_3_then_the_survivor_takes_it_all(
    e2e_env: Callable[..., EmbeddedStack], e2e_ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVALFLEET_IN_PROCESS_THREADS", "16")  # more threads than the ceiling
    # the one decision written below stays in force for the whole test (no planner runs)
    monkeypatch.setenv("EVALFLEET_PLANNER_DECISION_MAX_AGE_S", "3600")
    from evalfleet.settings import get_settings

    get_settings.cache_clear()
    e2e_env()
    low = launch_run(config=config("low", 24, 1.0), idempotency_key="fair-low")
    high = launch_run(config=config("high", 12, 3.0), idempotency_key="fair-high")
    engine = ledger_io.engine()
    with engine.begin() as conn:
        conn.execute(
            insert(PlannerDecision).values(
                alias=ALIAS,
                tick_at=datetime.now(UTC),
                live=0,
                booting=0,
                queued=36,
                ceiling=CEILING,
                launches_allowed=CEILING,
                binding="qps_budget",
                projections={},
                budgets={},
            )
        )
    sampler = Sampler(e2e_ledger_url)
    sampler.start()
    try:
        started = dispatcher_loop(launcher="in-process", until_idle=True, max_passes=600)
    finally:
        sampler.stop.set()
        sampler.join(timeout=5)
        sampler.engine.dispose()
    assert started >= 36  # every instance started (a requeued attempt starts again)

    samples = sampler.samples
    assert len(samples) > 20
    totals = [sum(live.values()) for _, live, _ in samples]
    assert max(totals) <= CEILING
    # phase 1: both runs have queued work and the fleet is at the ceiling
    both = [
        (live.get(low, 0), live.get(high, 0))
        for _, live, queued in samples
        if queued.get(low, 0) and queued.get(high, 0) and sum(live.values()) >= CEILING - 1
    ]
    assert len(both) >= 5, "the two runs never competed for a full ceiling"
    assert max(lo for lo, _ in both) <= 2  # the low-priority run never exceeds its share
    high_share = sum(hi for _, hi in both) / sum(lo + hi for lo, hi in both)
    assert 0.65 <= high_share <= 0.85, f"high-priority share {high_share:.2f}, want ~0.75"
    # phase 2: the high-priority run is done; the low one takes the whole ceiling
    done_at = next(
        t for t, live, queued in samples if not live.get(high, 0) and not queued.get(high, 0)
    )
    alone = [live.get(low, 0) for t, live, _ in samples if t > done_at]
    assert max(alone) == CEILING, f"after the high run finished the low run peaked at {max(alone)}"
    print(
        f"fair share: {len(both)} saturated samples, high-priority share {high_share:.3f}, "
        f"low run max {max(lo for lo, _ in both)} while competing, {max(alone)} alone"
    )

    supervise_once(scale_eval_pool=False)
    with engine.connect() as conn:
        states = conn.execute(
            select(InstanceResult.run_id, InstanceResult.state).where(
                InstanceResult.run_id.in_((low, high))
            )
        ).all()
        assert len(states) == 36
        assert {s for _, s in states} <= {"resolved", "unresolved"}
        runs = dict(conn.execute(select(Run.id, Run.state)).tuples().all())
    assert runs[low] == runs[high] == "closed"
