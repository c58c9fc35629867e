"""A hypothesis state machine drives the queue (claim, heartbeat, mark_running, land, requeue,
expire, pause/resume, stale landings, in any order) against a simple model, on both databases.

Invariants checked after every step, from the database itself:
* at most one terminal outcome per instance, and once terminal it never changes;
* no job lost: every instance is queued (job without lease), leased (job and instance carry the
  same token) or terminal (no job) — never anything else;
* the model's view (who holds which lease, how many attempts) matches the ledger's.
"""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from queue_helpers import jobs, states
from sqlalchemy import Engine

from evalfleet.errors import IllegalTransition, StaleLease
from evalfleet.states import INSTANCE_LEASED, INSTANCE_TERMINAL, InstanceState, RunState
from ledger import queue, reaper
from ledger.pauses import set_pause
from ledger.runs import NewRun, create_run, set_run_state

SHORT, LONG = 0.01, 60.0
N, MAX_ATTEMPTS = 4, 2
OUTCOMES = [
    InstanceState.RESOLVED,
    InstanceState.UNRESOLVED,
    InstanceState.ERROR,
    InstanceState.ABORTED,
]


class QueueMachine(RuleBasedStateMachine):
    engine: Engine

    def __init__(self) -> None:
        super().__init__()
        self.run_id = str(uuid.uuid4())
        self.instances = [f"i{n}" for n in range(N)]
        create_run(
            self.engine,
            NewRun(
                run_id=self.run_id,
                name="sm",
                harness="simulated",
                alias="sim",
                instance_ids=self.instances,
                spend_cap_micro_usd=1,
                max_attempts=MAX_ATTEMPTS,
            ),
        )
        self.queued = set(self.instances)
        self.held: dict[str, tuple[queue.Lease, bool]] = {}  # instance -> (lease, short?)
        self.running: set[str] = set()
        self.stale: list[queue.Lease] = []
        self.terminal: dict[str, str] = {}
        self.attempts = dict.fromkeys(self.instances, 0)
        self.pool_paused = False
        self.run_paused = False

    def teardown(self) -> None:
        if self.pool_paused:
            set_pause(self.engine, "pool", "harness", False, actor="t", reason="teardown")
        # keep this example's leftovers out of the next example's claims
        set_run_state(self.engine, self.run_id, RunState.ABORTED)

    # --- rules ----------------------------------------------------------------------------

    @rule(k=st.integers(1, 3), short=st.booleans())
    def claim(self, k: int, short: bool) -> None:
        leases = queue.claim(
            self.engine, "harness", k, visibility_timeout_s=SHORT if short else LONG
        )
        if self.pool_paused or self.run_paused:
            assert leases == []
            return
        got = [lease.instance_id for lease in leases]
        assert set(got) <= self.queued
        assert len(got) == min(k, len(self.queued))
        for lease in leases:
            self.attempts[lease.instance_id] += 1
            assert lease.attempt == self.attempts[lease.instance_id]
            self.queued.discard(lease.instance_id)
            self.held[lease.instance_id] = (lease, short)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), short=st.booleans())
    def heartbeat(self, data: st.DataObject, short: bool) -> None:
        instance = data.draw(st.sampled_from(sorted(self.held)))
        lease, _ = self.held[instance]
        queue.heartbeat(self.engine, lease, visibility_timeout_s=SHORT if short else LONG)
        self.held[instance] = (lease, short)

    @precondition(lambda self: set(self.held) - self.running)
    @rule(data=st.data())
    def mark_running(self, data: st.DataObject) -> None:
        instance = data.draw(st.sampled_from(sorted(set(self.held) - self.running)))
        lease, short = self.held[instance]
        queue.mark_running(self.engine, lease, visibility_timeout_s=SHORT if short else LONG)
        self.running.add(instance)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def land(self, data: st.DataObject, outcome: InstanceState) -> None:
        instance = data.draw(st.sampled_from(sorted(self.held)))
        lease, _ = self.held[instance]
        result = queue.Outcome(outcome, calls=1, cost_micro_usd=5)
        if instance not in self.running and outcome in (
            InstanceState.RESOLVED,
            InstanceState.UNRESOLVED,
        ):
            with pytest.raises(IllegalTransition):
                queue.land(self.engine, lease, result)
            return
        queue.land(self.engine, lease, result)
        del self.held[instance]
        self.running.discard(instance)
        self.stale.append(lease)
        self.terminal[instance] = outcome.value

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        instance = data.draw(st.sampled_from(sorted(self.held)))
        lease, _ = self.held.pop(instance)
        self.running.discard(instance)
        self.stale.append(lease)
        went = reaper.requeue(self.engine, lease, "infrastructure failure")
        self._returned(instance, went.value)

    @rule()
    def expire(self) -> None:
        short = {i for i, (_, is_short) in self.held.items() if is_short}
        if short:
            time.sleep(SHORT * 3)
        report = reaper.expire(self.engine)
        mine = {i for r, i in report.requeued + report.lost if r == self.run_id}
        assert mine == short
        for run_id, instance in report.requeued + report.lost:
            if run_id != self.run_id:
                continue
            lease, _ = self.held.pop(instance)
            self.running.discard(instance)
            self.stale.append(lease)
            self._returned(instance, "lost" if (run_id, instance) in report.lost else "queued")

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def stale_lease_is_refused(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.stale))
        with pytest.raises(StaleLease):
            queue.land(self.engine, lease, queue.Outcome(InstanceState.ERROR, error_class="late"))
        with pytest.raises(StaleLease):
            queue.heartbeat(self.engine, lease)

    @rule(paused=st.booleans())
    def pause_pool(self, paused: bool) -> None:
        set_pause(self.engine, "pool", "harness", paused, actor="t", reason="test")
        self.pool_paused = paused

    @rule(paused=st.booleans())
    def pause_run(self, paused: bool) -> None:
        set_pause(self.engine, "run", self.run_id, paused, actor="t", reason="test")
        self.run_paused = paused

    def _returned(self, instance: str, went: str) -> None:
        expected = "lost" if self.attempts[instance] >= MAX_ATTEMPTS else "queued"
        assert went == expected
        if went == "lost":
            self.terminal[instance] = "lost"
        else:
            self.queued.add(instance)

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def ledger_agrees_and_nothing_is_lost(self) -> None:
        db_states = states(self.engine, self.run_id)
        db_jobs = jobs(self.engine, self.run_id)
        assert sorted(db_states) == sorted(self.instances)
        for instance, state in db_states.items():
            if InstanceState(state) in INSTANCE_TERMINAL:
                assert instance not in db_jobs, f"terminal {instance} still has a job"
                assert self.terminal.get(instance) == state, "a terminal row changed or appeared"
            elif state == "queued":
                assert db_jobs[instance][0] is None
                assert instance in self.queued
            else:
                assert InstanceState(state) in INSTANCE_LEASED
                token = db_jobs[instance][0]
                assert token is not None and token == self.held[instance][0].token
                assert state == ("running" if instance in self.running else "booting")
        assert set(self.terminal) | self.queued | set(self.held) == set(self.instances)
        assert not (set(self.terminal) & (self.queued | set(self.held)))


def test_queue_state_machine(ledger_engine: Engine) -> None:
    class Machine(QueueMachine):
        engine = ledger_engine

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=15,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
            database=None,
        ),
    )
