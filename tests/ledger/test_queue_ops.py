"""Queue behaviour on both databases: claim, heartbeat, land, stale leases, expiry, max_attempts,
pauses and run states. Each test gets a fresh ledger (``ledger_engine`` is parametrized)."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from queue_helpers import jobs, make_run, states
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from evalfleet.errors import ConfigError, IllegalTransition, NotFound, StaleLease
from evalfleet.states import InstanceState, RunState
from ledger import queue, reaper
from ledger.models import AuditLog, InstanceResult
from ledger.pauses import set_pause
from ledger.runs import instance_state_counts, set_run_state

RESOLVED = queue.Outcome(
    InstanceState.RESOLVED,
    input_tokens=100,
    cached_input_tokens=40,
    output_tokens=7,
    calls=3,
    cost_micro_usd=1234,
)


def test_create_run_enqueues_every_instance(ledger_engine: Engine) -> None:
    run_id, instances = make_run(ledger_engine, 5)
    assert states(ledger_engine, run_id) == {i: "queued" for i in instances}
    assert jobs(ledger_engine, run_id) == {i: (None, 0) for i in instances}


def test_claim_leases_in_order_and_boots_instances(ledger_engine: Engine) -> None:
    run_id, instances = make_run(ledger_engine, 5)
    leases = queue.claim(ledger_engine, "harness", 3)
    assert [lease.instance_id for lease in leases] == instances[:3]
    assert len({lease.token for lease in leases}) == 3
    assert all(lease.attempt == 1 for lease in leases)
    assert states(ledger_engine, run_id) == {
        **{i: "booting" for i in instances[:3]},
        **{i: "queued" for i in instances[3:]},
    }
    # the job rows carry the same tokens as the leases
    assert {jobs(ledger_engine, run_id)[lease.instance_id][0] for lease in leases} == {
        lease.token for lease in leases
    }
    assert [lease.instance_id for lease in queue.claim(ledger_engine, "harness", 10)] == instances[
        3:
    ]
    assert queue.claim(ledger_engine, "harness", 10) == []
    assert queue.claim(ledger_engine, "eval", 10) == []


def test_land_writes_terminal_row_and_deletes_job_once(ledger_engine: Engine) -> None:
    run_id, _ = make_run(ledger_engine, 1)
    (lease,) = queue.claim(ledger_engine, "harness", 1)
    queue.mark_running(ledger_engine, lease, flow_run_id="fr-1")
    queue.land(ledger_engine, lease, RESOLVED)
    assert jobs(ledger_engine, run_id) == {}
    with Session(ledger_engine) as session:
        row = session.scalars(select(InstanceResult).where(InstanceResult.run_id == run_id)).one()
    assert (row.state, row.resolved, row.calls, row.cost_micro_usd) == ("resolved", True, 3, 1234)
    assert (row.input_tokens, row.cached_input_tokens, row.output_tokens) == (100, 40, 7)
    assert row.finished_at is not None and row.flow_run_id == "fr-1" and row.attempt == 1
    # landing twice (e.g. a retried task) is refused: the terminal row is written once
    with pytest.raises(StaleLease):
        queue.land(ledger_engine, lease, queue.Outcome(InstanceState.ERROR, error_class="x"))
    assert states(ledger_engine, run_id) == {lease.instance_id: "resolved"}


def test_land_with_a_stale_lease_is_refused(ledger_engine: Engine) -> None:
    run_id, _ = make_run(ledger_engine, 1)
    (old,) = queue.claim(ledger_engine, "harness", 1, visibility_timeout_s=0.05)
    queue.mark_running(ledger_engine, old, visibility_timeout_s=0.05)
    time.sleep(0.15)
    report = reaper.expire(ledger_engine)
    assert report.requeued == ((run_id, old.instance_id),) and report.lost == ()
    (new,) = queue.claim(ledger_engine, "harness", 1)
    assert new.token != old.token and new.attempt == 2
    for step in (
        lambda: queue.land(ledger_engine, old, RESOLVED),
        lambda: queue.heartbeat(ledger_engine, old),
        lambda: queue.mark_running(ledger_engine, old),
        lambda: reaper.requeue(ledger_engine, old, "late"),
    ):
        with pytest.raises(StaleLease):
            step()
    # the refused landing changed nothing: the new attempt is still live and can land
    assert states(ledger_engine, run_id) == {new.instance_id: "booting"}
    queue.mark_running(ledger_engine, new)
    queue.land(ledger_engine, new, RESOLVED)
    assert states(ledger_engine, run_id) == {new.instance_id: "resolved"}


def test_illegal_landing_changes_nothing(ledger_engine: Engine) -> None:
    run_id, _ = make_run(ledger_engine, 1)
    (lease,) = queue.claim(ledger_engine, "harness", 1)
    with pytest.raises(IllegalTransition, match="booting -> resolved"):
        queue.land(ledger_engine, lease, RESOLVED)
    assert jobs(ledger_engine, run_id)[lease.instance_id][0] == lease.token
    assert states(ledger_engine, run_id) == {lease.instance_id: "booting"}
    queue.land(ledger_engine, lease, queue.Outcome(InstanceState.ERROR, error_class="boot"))
    assert states(ledger_engine, run_id) == {lease.instance_id: "error"}


def test_heartbeat_keeps_the_lease_alive(ledger_engine: Engine) -> None:
    run_id, _ = make_run(ledger_engine, 1)
    (lease,) = queue.claim(ledger_engine, "harness", 1, visibility_timeout_s=0.3)
    for _ in range(3):
        time.sleep(0.15)
        deadline = queue.heartbeat(ledger_engine, lease, visibility_timeout_s=0.3)
        assert deadline > lease.visible_until
        assert reaper.expire(ledger_engine).requeued == ()
    assert states(ledger_engine, run_id) == {lease.instance_id: "booting"}


def test_expired_leases_come_back_and_end_lost_past_max_attempts(ledger_engine: Engine) -> None:
    run_id, instances = make_run(ledger_engine, 2, max_attempts=2)
    for attempt in (1, 2):
        leases = queue.claim(ledger_engine, "harness", 5, visibility_timeout_s=0.05)
        assert [lease.attempt for lease in leases] == [attempt, attempt]
        assert reaper.expire(ledger_engine).requeued == ()  # not expired yet
        time.sleep(0.15)
        report = reaper.expire(ledger_engine)
        if attempt == 1:
            assert sorted(report.requeued) == [(run_id, i) for i in instances]
            assert states(ledger_engine, run_id) == {i: "queued" for i in instances}
        else:
            assert sorted(report.lost) == [(run_id, i) for i in instances]
    assert states(ledger_engine, run_id) == {i: "lost" for i in instances}
    assert jobs(ledger_engine, run_id) == {}
    assert queue.claim(ledger_engine, "harness", 5) == []
    assert instance_state_counts(ledger_engine, run_id) == {"lost": 2}


def test_requeue_counts_attempts_then_lost(ledger_engine: Engine) -> None:
    run_id, (instance,) = make_run(ledger_engine, 1, max_attempts=3)
    for attempt in (1, 2, 3):
        (lease,) = queue.claim(ledger_engine, "harness", 1)
        assert lease.attempt == attempt
        queue.mark_running(ledger_engine, lease)
        result = reaper.requeue(ledger_engine, lease, "provider 429 storm")
        assert result == (InstanceState.QUEUED if attempt < 3 else InstanceState.LOST)
    assert states(ledger_engine, run_id) == {instance: "lost"}
    assert jobs(ledger_engine, run_id) == {}


Times = tuple[datetime | None, datetime | None, datetime | None]


def _times(engine: Engine, run_id: str) -> Times:
    """The instance's first claim, its attempt's claim and its attempt's harness start."""
    with Session(engine) as session:
        row = session.execute(
            select(
                InstanceResult.started_at, InstanceResult.claimed_at, InstanceResult.running_at
            ).where(InstanceResult.run_id == run_id)
        ).one()
    return row[0], row[1], row[2]


def test_each_attempt_records_its_claim_and_its_harness_start(ledger_engine: Engine) -> None:
    """The planner's ages (``tasks.plan.read_fleet``): ``started_at`` is the first claim,
    kept; ``claimed_at`` and ``running_at`` are the current attempt's, so a requeued instance
    boots and runs again from its new claim, not from its first."""
    run_id, _ = make_run(ledger_engine, 1, max_attempts=3)
    (first,) = queue.claim(ledger_engine, "harness", 1)
    started, claimed, running = _times(ledger_engine, run_id)
    assert started is not None and claimed == started and running is None
    time.sleep(0.05)
    queue.mark_running(ledger_engine, first)
    _, _, running = _times(ledger_engine, run_id)
    assert running is not None and running > started
    reaper.requeue(ledger_engine, first, "worker died")
    time.sleep(0.05)
    (second,) = queue.claim(ledger_engine, "harness", 1)
    again_started, again_claimed, again_running = _times(ledger_engine, run_id)
    assert second.attempt == 2
    assert again_started == started  # the instance's first claim
    assert again_claimed is not None and again_claimed > running
    assert again_running is None  # booting again: its harness has not started


def test_requeue_delay_hides_the_job(ledger_engine: Engine) -> None:
    make_run(ledger_engine, 1)
    (lease,) = queue.claim(ledger_engine, "harness", 1)
    reaper.requeue(ledger_engine, lease, "retry later", delay_s=0.3)
    assert queue.claim(ledger_engine, "harness", 1) == []
    time.sleep(0.4)
    assert len(queue.claim(ledger_engine, "harness", 1)) == 1


def test_claim_after_pause_commits_gets_nothing(ledger_engine: Engine) -> None:
    run_a, _ = make_run(ledger_engine, 3, prefix="a")
    run_b, _ = make_run(ledger_engine, 3, prefix="b")
    set_pause(ledger_engine, "pool", "harness", True, actor="op", reason="maintenance")
    assert queue.claim(ledger_engine, "harness", 10) == []
    set_pause(ledger_engine, "pool", "harness", False, actor="op", reason="done")
    set_pause(ledger_engine, "run", run_a, True, actor="op", reason="spend cap")
    leases = queue.claim(ledger_engine, "harness", 10)
    assert {lease.run_id for lease in leases} == {run_b}
    set_pause(ledger_engine, "run", run_a, False, actor="op", reason="raised cap")
    assert {lease.run_id for lease in queue.claim(ledger_engine, "harness", 10)} == {run_a}
    with ledger_engine.connect() as conn:
        actions = conn.execute(select(AuditLog.action, AuditLog.target).order_by(AuditLog.id)).all()
    assert [a for a, _ in actions][-4:] == ["pause", "resume", "pause", "resume"]


def test_pause_input_is_checked(ledger_engine: Engine) -> None:
    with pytest.raises(ConfigError, match="target: pool must be one of"):
        set_pause(ledger_engine, "pool", "nonsense", True, actor="op", reason="r")
    with pytest.raises(ConfigError, match="reason"):
        set_pause(ledger_engine, "pool", "harness", True, actor="op", reason=" ")
    with pytest.raises(NotFound):
        set_pause(ledger_engine, "run", "no-such-run", True, actor="op", reason="r")


@pytest.mark.parametrize("run_state", ["pending", "launching", "closed", "aborted"])
def test_runs_not_claimable_give_nothing(ledger_engine: Engine, run_state: str) -> None:
    make_run(ledger_engine, 2, state=run_state)
    assert queue.claim(ledger_engine, "harness", 5) == []


def test_paused_run_state_gives_nothing_until_resumed(ledger_engine: Engine) -> None:
    run_id, _ = make_run(ledger_engine, 2)
    set_run_state(ledger_engine, run_id, RunState.PAUSED)
    assert queue.claim(ledger_engine, "harness", 5) == []
    set_run_state(ledger_engine, run_id, RunState.RUNNING)
    set_run_state(ledger_engine, run_id, RunState.DRAINING)
    assert len(queue.claim(ledger_engine, "harness", 5)) == 2
    with pytest.raises(IllegalTransition):
        set_run_state(ledger_engine, run_id, RunState.RUNNING)
    with pytest.raises(NotFound):
        set_run_state(ledger_engine, "nope", RunState.RUNNING)


def test_bad_arguments_are_clear_errors(ledger_engine: Engine) -> None:
    with pytest.raises(ConfigError, match="k: must be between"):
        queue.claim(ledger_engine, "harness", 0)
    with pytest.raises(ConfigError, match="visibility_timeout_s"):
        queue.claim(ledger_engine, "harness", 1, visibility_timeout_s=-1)
    with pytest.raises(ConfigError, match="lost is decided by the queue"):
        queue.Outcome(InstanceState.LOST)
    with pytest.raises(ConfigError, match="calls: must not be negative"):
        queue.Outcome(InstanceState.ERROR, calls=-1)
    with pytest.raises(ConfigError, match="instance ids must be unique"):
        from ledger.runs import NewRun, create_run

        create_run(
            ledger_engine,
            NewRun("r", "n", "h", "a", ["x", "x"], spend_cap_micro_usd=1),
        )
