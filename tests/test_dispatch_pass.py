"""A dispatcher pass on a real (SQLite) ledger: it reads the planner's ceiling, the alias
override, pauses and live counts from the ledger, claims each run's own share and hands each
job reference to the launcher; a launch that fails returns the pass's claims to the queue."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, func, insert, select, update

from evalfleet.errors import NotFound
from evalfleet.settings import get_settings
from flows.dispatch import dispatch_pass
from ledger.controls import control_session, set_ceiling_override
from ledger.models import InstanceResult, Job, PlannerDecision
from ledger.pauses import set_pause
from ledger.runs import NewRun, create_run
from tasks import ledger_io
from tasks.instance import JobRef


class Recorder:
    """A launcher that records what it was asked to start (the edge of the dispatcher)."""

    def __init__(self, slots: int = 64, fail_after: int | None = None) -> None:
        self.slots = slots
        self.fail_after = fail_after
        self.started: list[JobRef] = []

    def free_slots(self) -> int:
        return self.slots

    def launch(self, ref: JobRef) -> None:
        if self.fail_after is not None and len(self.started) >= self.fail_after:
            raise RuntimeError("work pool unreachable")
        self.started.append(ref)

    def wait(self, timeout_s: float | None = None) -> None:
        return None

    def per_run(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ref in self.started:
            out[ref.run_id] = out.get(ref.run_id, 0) + 1
        return out


@pytest.fixture
def ledger(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    monkeypatch.setenv("EVALFLEET_STATIC_CAP", "64")
    get_settings.cache_clear()
    ledger_io.engine.cache_clear()
    ledger_io.sessions.cache_clear()
    yield ledger_io.engine()
    ledger_io.engine().dispose()
    get_settings.cache_clear()
    ledger_io.engine.cache_clear()
    ledger_io.sessions.cache_clear()


def run(engine: Engine, n: int, priority: float = 1.0, alias: str = "sim-openai") -> str:
    run_id = str(uuid.uuid4())
    create_run(
        engine,
        NewRun(
            run_id=run_id,
            name="dispatch",
            harness="simulated",
            alias=alias,
            instance_ids=[f"i-{k}" for k in range(n)],
            spend_cap_micro_usd=1_000_000,
            priority=priority,
        ),
    )
    return run_id


def decide(engine: Engine, alias: str, ceiling: int, age_s: float = 0.0) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(PlannerDecision).values(
                alias=alias,
                tick_at=datetime.now(UTC) - timedelta(seconds=age_s),
                live=0,
                booting=0,
                queued=0,
                ceiling=ceiling,
                launches_allowed=ceiling,
                binding="qps_budget",
                projections={},
                budgets={},
            )
        )


def booting(engine: Engine, run_id: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(
                    InstanceResult.run_id == run_id, InstanceResult.state == "booting"
                )
            ).scalar_one()
        )


def test_a_pass_claims_each_runs_fair_share_of_the_planner_ceiling(ledger: Engine) -> None:
    # the low-priority run's jobs are older: a FIFO claim would give it everything
    low = run(ledger, 20, priority=1.0)
    high = run(ledger, 20, priority=3.0)
    decide(ledger, "sim-openai", 8)
    launcher = Recorder()
    assert dispatch_pass(launcher) == 8
    assert launcher.per_run() == {low: 2, high: 6}
    assert (booting(ledger, low), booting(ledger, high)) == (2, 6)
    # booting tasks are live: a second pass admits nothing more
    assert dispatch_pass(launcher) == 0
    # the planner raises the ceiling: the new room is shared 1:3 again
    decide(ledger, "sim-openai", 16)
    assert dispatch_pass(launcher) == 8
    assert launcher.per_run() == {low: 4, high: 12}


def test_before_the_planners_first_decision_a_pass_admits_only_the_bootstrap(
    ledger: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # the static cap is 64: the first pass used to claim all 20 jobs before any decision
    a = run(ledger, 20)
    launcher = Recorder()
    with caplog.at_level(logging.INFO, logger="tasks.dispatch"):
        assert dispatch_pass(launcher) == get_settings().bootstrap_ceiling == 4
    assert "no planner decision in force" in caplog.text
    assert dispatch_pass(launcher) == 0  # booting tasks count: no more until a decision
    decide(ledger, "sim-openai", 10)
    assert dispatch_pass(launcher) == 6
    assert booting(ledger, a) == 10


def test_a_decision_older_than_its_max_age_is_not_in_force(ledger: Engine) -> None:
    run(ledger, 20)
    max_age = get_settings().decision_max_age_s
    assert max_age == 4 * get_settings().planner_tick_s
    # e.g. left from an earlier run, or the planner stopped: the bootstrap ceiling, not 16
    decide(ledger, "sim-openai", 16, age_s=max_age + 5)
    launcher = Recorder()
    assert dispatch_pass(launcher) == 4
    decide(ledger, "sim-openai", 16, age_s=max_age - 5)
    assert dispatch_pass(launcher) == 12


def test_an_alias_left_on_the_bootstrap_is_logged_then_warned_about() -> None:
    from tasks.dispatch import UnplannedLog
    from tests.test_dispatch_admission import fleet, load

    unplanned = UnplannedLog()
    waiting = fleet(load("a", alias="x"), ceiling=None)
    assert unplanned.note(waiting, 60.0, now=0.0) == []  # info only: a new run
    assert unplanned.note(waiting, 60.0, now=30.0) == []
    assert unplanned.note(waiting, 60.0, now=61.0) == ["x"]  # the planner is not deciding
    assert unplanned.note(waiting, 60.0, now=90.0) == []  # at most one warning a minute
    assert unplanned.note(waiting, 60.0, now=125.0) == ["x"]
    decided = fleet(load("a", alias="x"), ceiling=5)
    assert unplanned.note(decided, 60.0, now=130.0) == []
    assert unplanned.note(waiting, 60.0, now=140.0) == []  # a new episode starts over


def test_the_alias_override_and_pauses_hold_launches(ledger: Engine) -> None:
    a = run(ledger, 10)
    b = run(ledger, 10)
    decide(ledger, "sim-openai", 8)
    with control_session(ledger) as session:
        set_ceiling_override(session, "alias", "sim-openai", 2, actor="op", reason="test")
    launcher = Recorder()
    assert dispatch_pass(launcher) == 2
    assert launcher.per_run() == {a: 1, b: 1}
    with control_session(ledger) as session:
        set_ceiling_override(session, "alias", "sim-openai", None, actor="op", reason="test")
    set_pause(ledger, "pool", "harness", True, actor="op", reason="test")
    assert dispatch_pass(launcher) == 0
    set_pause(ledger, "pool", "harness", False, actor="op", reason="test")
    set_pause(ledger, "run", a, True, actor="op", reason="test")
    assert dispatch_pass(launcher) == 6
    assert launcher.per_run() == {a: 1, b: 7}


def test_a_failed_launch_returns_the_passes_claims_to_the_queue(ledger: Engine) -> None:
    a = run(ledger, 6)
    decide(ledger, "sim-openai", 4)
    launcher = Recorder(fail_after=1)
    with pytest.raises(RuntimeError, match="unreachable"):
        dispatch_pass(launcher)
    assert len(launcher.started) == 1
    with ledger.connect() as conn:
        leased = conn.execute(
            select(func.count()).where(Job.run_id == a, Job.lease_token.is_not(None))
        ).scalar_one()
    # only the one launched job keeps its lease; the three not launched are queued again
    assert leased == 1
    assert booting(ledger, a) == 1


@pytest.mark.prefect
def test_the_work_pool_launcher_creates_flow_runs_or_requeues_every_claim(
    ledger: Engine, prefect_api_url: str
) -> None:
    import prefect.context
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from flows.instance import run_instance
    from tasks.launchers import WorkPoolLauncher

    prefect.context.refresh_global_settings_context()
    a = run(ledger, 5)
    decide(ledger, "sim-openai", 4)
    # no such deployment: nothing is launched and every claim of the pass is queued again
    with pytest.raises(NotFound, match="run-instance/no-such-deployment"):
        dispatch_pass(WorkPoolLauncher("run-instance/no-such-deployment", 64))
    assert booting(ledger, a) == 0
    with ledger.connect() as conn:
        assert conn.execute(select(func.count()).where(Job.lease_token.is_not(None))).scalar() == 0

    tag = uuid.uuid4().hex[:8]
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=f"dispatch-test-{tag}", type="process"))
        deployment_id = client.create_deployment(
            flow_id=client.create_flow_from_name(run_instance.name),
            name=f"dispatch-test-{tag}",
            entrypoint="flows/instance.py:run_instance",
            work_pool_name=f"dispatch-test-{tag}",
            parameter_openapi_schema=run_instance.parameters.model_dump(),
            enforce_parameter_schema=True,
        )
        try:
            launcher = WorkPoolLauncher(f"{run_instance.name}/dispatch-test-{tag}", 64)
            assert dispatch_pass(launcher) == 4
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
            )
            # one flow run per claimed job, its only parameter the job reference
            with ledger.connect() as conn:
                leased: dict[str, str | None] = dict(
                    conn.execute(
                        select(Job.instance_id, Job.lease_token).where(Job.lease_token.is_not(None))
                    )
                    .tuples()
                    .all()
                )
            refs = [JobRef.model_validate(r.parameters["job"]) for r in runs]
            assert {ref.instance_id: ref.token for ref in refs} == leased
            assert all(r.state is not None and r.state.is_scheduled() for r in runs)
        finally:
            for flow_run in client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
            ):
                client.delete_flow_run(flow_run.id)
            client.delete_deployment(deployment_id)
            client.delete_work_pool(f"dispatch-test-{tag}")


def test_the_decision_max_age_defaults_to_four_ticks_and_must_outlast_two() -> None:
    from evalfleet.settings import SettingsError, load_settings

    assert load_settings(planner_tick_s=5.0).decision_max_age_s == 20.0
    assert load_settings(planner_decision_max_age_s=300.0).decision_max_age_s == 300.0
    with pytest.raises(SettingsError, match="EVALFLEET_PLANNER_DECISION_MAX_AGE_S"):
        load_settings(planner_tick_s=15.0, planner_decision_max_age_s=20.0)
    with pytest.raises(SettingsError, match="EVALFLEET_BOOTSTRAP_CEILING"):
        load_settings(bootstrap_ceiling=0)


def test_an_evaluating_instance_does_not_hold_a_harness_slot(ledger: Engine) -> None:
    """An instance whose harness stage is over calls no LLM: its grading (on the eval pool)
    must not keep the next instance from starting under the planner's ceiling."""
    rid = run(ledger, 6)
    decide(ledger, "sim-openai", 2)
    launcher = Recorder()
    assert dispatch_pass(launcher) == 2
    assert dispatch_pass(launcher) == 0  # two booting: the ceiling is full
    with ledger.begin() as conn:
        conn.execute(
            update(InstanceResult)
            .where(InstanceResult.run_id == rid, InstanceResult.state == "booting")
            .values(state="evaluating")
        )
    assert dispatch_pass(launcher) == 2  # both are grading: two more may call the LLM
    assert booting(ledger, rid) == 2
