"""Operator controls (ledger.controls) on SQLite and PostgreSQL.

Every control writes exactly one audit row in the same transaction as its change (a failure on
either side rolls back both); a missing reason and bad values are clear ConfigErrors that write
nothing; the audit log refuses UPDATE and DELETE. Abort removes queued work at once and either
leaves live instances to land (run draining) or cancels them (run aborted, flow runs listed).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from sqlalchemy import Engine, Table, func, select, text, update
from sqlalchemy.exc import DatabaseError

import ledger.controls as controls
import ledger.pacer_controls as pacer_controls
from evalfleet.errors import ConfigError, NotFound
from gateway.aliases import DEFAULT_ALIASES, load_aliases
from ledger.db import make_engine
from ledger.migrate import upgrade
from ledger.models import (
    AliasControl,
    AliasObservation,
    AuditLog,
    InstanceResult,
    Job,
    PacerConfig,
    PacerConfigHistory,
    Run,
)
from ledger.runs import NewRun, create_run
from tests.pg_support import sibling_database

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
ALIASES = load_aliases(None, provider_sim_url="http://127.0.0.1:9")
OPENAI = ALIASES.get("sim-openai")
assert DEFAULT_ALIASES  # the embedded aliases are the ones tested here
TABLES = (
    "jobs",
    "instance_results",
    "api_keys",
    "runs",
    "alias_controls",
    "pacer_config_history",
    "pacer_configs",
    "alias_observations",
)


_FIRST_AUDIT_ID: dict[int, int] = {}


@pytest.fixture(scope="session")
def pg_controls_url(pg_database: str) -> Iterator[str]:
    with sibling_database(pg_database, "ctl") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
        upgrade(url)
    else:
        url = request.getfixturevalue("pg_controls_url")
    eng = make_engine(url)
    if request.param == "postgresql":
        with eng.begin() as conn:
            conn.execute(text(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE"))
    with eng.connect() as conn:  # audit_log is append-only: each test sees only its own rows
        _FIRST_AUDIT_ID[id(eng)] = int(
            conn.execute(select(func.coalesce(func.max(AuditLog.id), 0))).scalar_one()
        )
    yield eng
    eng.dispose()


def _run(engine: Engine, alias: str = "sim-openai", n: int = 4, state: str = "running") -> str:
    run_id = str(uuid.uuid4())
    create_run(
        engine,
        NewRun(
            run_id=run_id,
            name="r",
            harness="simulated",
            alias=alias,
            instance_ids=[f"i-{k}" for k in range(n)],
            spend_cap_micro_usd=1_000_000,
            max_attempts=3,
        ),
    )
    if state != "running":
        with engine.begin() as conn:
            conn.execute(update(Run).where(Run.id == run_id).values(state=state))
    return run_id


def _lease(engine: Engine, run_id: str, instance_id: str, state: str = "running") -> None:
    """Make one instance live: its job leased, its row ``state`` with a flow run id."""
    with engine.begin() as conn:
        conn.execute(
            update(Job)
            .where(Job.run_id == run_id, Job.instance_id == instance_id)
            .values(lease_token="lease-1", receive_count=1)
        )
        conn.execute(
            update(InstanceResult)
            .where(InstanceResult.run_id == run_id, InstanceResult.instance_id == instance_id)
            .values(state=state, lease_token="lease-1", flow_run_id=f"fr-{instance_id}", attempt=1)
        )


def _audits(engine: Engine) -> list[AuditLog]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(AuditLog).where(AuditLog.id > _FIRST_AUDIT_ID[id(engine)]).order_by(AuditLog.id)
        ).all()
    return [AuditLog(**r._mapping) for r in rows]


def _audit_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(AuditLog.id > _FIRST_AUDIT_ID[id(engine)])
            ).scalar_one()
        )


def _states(engine: Engine, run_id: str) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(InstanceResult.instance_id, InstanceResult.state).where(
                InstanceResult.run_id == run_id
            )
        ).all()
    return dict((i, s) for i, s in rows)


def _run_row(engine: Engine, run_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(Run).where(Run.id == run_id)).one()


def _jobs(engine: Engine, run_id: str) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(Job.instance_id).where(Job.run_id == run_id)).scalars())


# ---------------------------------------------------------------------------------------------
# caps and overrides


def test_task_cap_is_set_and_cleared_with_one_audit_row_each(engine: Engine) -> None:
    run_id = _run(engine)
    with controls.control_session(engine) as s:
        controls.set_task_cap(s, run_id, 5, actor="ana", reason="provider asked us to slow down")
    assert _run_row(engine, run_id).task_cap == 5
    with controls.control_session(engine) as s:
        controls.set_task_cap(s, run_id, None, actor="ana", reason="back to normal")
    assert _run_row(engine, run_id).task_cap is None
    audits = _audits(engine)
    assert [(a.action, a.target, a.actor, a.old, a.new) for a in audits] == [
        ("run.task_cap", f"run:{run_id}", "ana", {"task_cap": None}, {"task_cap": 5}),
        ("run.task_cap", f"run:{run_id}", "ana", {"task_cap": 5}, {"task_cap": None}),
    ]
    assert audits[0].reason == "provider asked us to slow down"


def test_ceiling_overrides_of_a_run_and_of_an_alias(engine: Engine) -> None:
    run_id = _run(engine)
    with controls.control_session(engine) as s:
        controls.set_ceiling_override(s, "run", run_id, 0, actor="ana", reason="hold launches")
    with controls.control_session(engine) as s:
        controls.set_ceiling_override(s, "alias", "sim-openai", 12, actor="ana", reason="share")
    with controls.control_session(engine) as s:
        controls.set_ceiling_override(s, "alias", "sim-openai", 20, actor="bo", reason="more")
        assert controls.alias_ceiling_overrides(s) == {"sim-openai": 20}
    assert _run_row(engine, run_id).ceiling_override == 0
    audits = _audits(engine)
    assert [(a.action, a.old, a.new) for a in audits] == [
        ("run.ceiling_override", {"ceiling_override": None}, {"ceiling_override": 0}),
        ("alias.ceiling_override", {"ceiling_override": None}, {"ceiling_override": 12}),
        ("alias.ceiling_override", {"ceiling_override": 12}, {"ceiling_override": 20}),
    ]
    with controls.control_session(engine) as s:
        controls.set_ceiling_override(s, "alias", "sim-openai", None, actor="bo", reason="clear")
        assert controls.alias_ceiling_overrides(s) == {}
        assert s.get(AliasControl, "sim-openai") is not None


@pytest.mark.parametrize("reason", ["", "   ", None])
def test_a_missing_reason_is_refused_and_nothing_is_written(engine: Engine, reason: Any) -> None:
    run_id = _run(engine)
    with pytest.raises(ConfigError, match="reason: an audit reason is required"):  # noqa: SIM117
        with controls.control_session(engine) as s:
            controls.set_task_cap(s, run_id, 3, actor="ana", reason=reason)
    with pytest.raises(ConfigError, match="reason"), controls.control_session(engine) as s:
        pacer_controls.set_pacer(s, OPENAI, {"calls_per_s": 3.0}, now=NOW, actor="a", reason=reason)
    with pytest.raises(ConfigError, match="reason"), controls.control_session(engine) as s:
        controls.abort(s, "run", run_id, live="finish", actor="ana", reason=reason)
    assert _run_row(engine, run_id).task_cap is None
    assert _run_row(engine, run_id).state == "running"
    assert _audit_count(engine) == 0


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (0, "task_cap: must be between 1 and 100000"),
        (-1, "task_cap: must be between"),
        (10**9, "task_cap: must be between"),
        (True, "task_cap: must be a whole number"),
        ("3", "task_cap: must be a whole number"),
        (2.5, "task_cap: must be a whole number"),
    ],
)
def test_bad_caps_are_clear_errors(engine: Engine, value: Any, needle: str) -> None:
    run_id = _run(engine)
    with pytest.raises(ConfigError, match=needle), controls.control_session(engine) as s:
        controls.set_task_cap(s, run_id, value, actor="ana", reason="r")
    assert _audit_count(engine) == 0


def test_bad_overrides_targets_and_actors_are_clear_errors(engine: Engine) -> None:
    run_id = _run(engine)
    cases: list[tuple[Any, str]] = [
        (
            lambda s: controls.set_ceiling_override(s, "run", run_id, -1, actor="a", reason="r"),
            "ceiling_override: must be between 0",
        ),
        (
            lambda s: controls.set_ceiling_override(
                s, cast(Any, "pool"), "x", 1, actor="a", reason="r"
            ),
            "scope",
        ),
        (lambda s: controls.set_task_cap(s, run_id, 2, actor="", reason="r"), "actor"),
        (lambda s: controls.set_task_cap(s, run_id, 2, actor="a", reason="x" * 2001), "reason"),
    ]
    for call, needle in cases:
        with pytest.raises(ConfigError, match=needle):  # noqa: SIM117
            with controls.control_session(engine) as s:
                call(s)
    with pytest.raises(NotFound, match="does not exist"), controls.control_session(engine) as s:
        controls.set_task_cap(s, "no-such-run", 2, actor="a", reason="r")
    closed = _run(engine, state="closed")
    with pytest.raises(ConfigError, match="is closed"), controls.control_session(engine) as s:
        controls.set_task_cap(s, closed, 2, actor="a", reason="r")
    assert _audit_count(engine) == 0


# ---------------------------------------------------------------------------------------------
# one transaction


def test_a_failed_audit_write_rolls_back_the_change(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = _run(engine)

    def broken_audit(*_: Any, **__: Any) -> None:
        raise RuntimeError("audit write failed")

    monkeypatch.setattr(controls, "write_audit", broken_audit)
    with pytest.raises(RuntimeError, match="audit write failed"):  # noqa: SIM117
        with controls.control_session(engine) as s:
            controls.set_task_cap(s, run_id, 7, actor="ana", reason="r")
    with pytest.raises(RuntimeError), controls.control_session(engine) as s:
        pacer_controls.set_pacer(s, OPENAI, {"calls_per_s": 3.0}, now=NOW, actor="a", reason="r")
    with pytest.raises(RuntimeError), controls.control_session(engine) as s:
        controls.abort(s, "run", run_id, live="finish", actor="a", reason="r")
    row = _run_row(engine, run_id)
    assert row.task_cap is None and row.state == "running"
    assert len(_jobs(engine, run_id)) == 4
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(PacerConfig)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(PacerConfigHistory)).scalar_one() == 0
    assert _audit_count(engine) == 0


def test_a_failure_after_the_audit_row_rolls_back_both(engine: Engine) -> None:
    run_id = _run(engine)
    with pytest.raises(ZeroDivisionError), controls.control_session(engine) as s:
        controls.set_task_cap(s, run_id, 7, actor="ana", reason="r")
        _ = 1 / 0
    assert _run_row(engine, run_id).task_cap is None
    assert _audit_count(engine) == 0


@pytest.mark.parametrize(
    "statement", ["UPDATE audit_log SET reason = 'rewritten'", "DELETE FROM audit_log"]
)
def test_the_audit_log_cannot_be_updated_or_deleted(engine: Engine, statement: str) -> None:
    run_id = _run(engine)
    with controls.control_session(engine) as s:
        controls.set_task_cap(s, run_id, 3, actor="ana", reason="original")
    with pytest.raises(DatabaseError, match="append-only"), engine.begin() as conn:
        conn.execute(text(statement))
    with pytest.raises(DatabaseError, match="append-only"):  # noqa: SIM117
        with controls.control_session(engine) as s:
            row = s.execute(
                select(AuditLog).where(AuditLog.id > _FIRST_AUDIT_ID[id(engine)])
            ).scalar_one()
            row.reason = "rewritten through the ORM"
    audits = _audits(engine)
    assert [a.reason for a in audits] == ["original"]


# ---------------------------------------------------------------------------------------------
# abort


def test_abort_a_run_letting_live_instances_finish(engine: Engine) -> None:
    run_id = _run(engine)
    _lease(engine, run_id, "i-0", "running")
    _lease(engine, run_id, "i-1", "booting")
    with controls.control_session(engine) as s:
        result = controls.abort(s, "run", run_id, live="finish", actor="ana", reason="bad config")
    assert _states(engine, run_id) == {
        "i-0": "running",
        "i-1": "booting",
        "i-2": "aborted",
        "i-3": "aborted",
    }
    assert _jobs(engine, run_id) == {"i-0", "i-1"}  # the live ones can still land
    assert _run_row(engine, run_id).state == "draining"
    assert result.revoke_keys == () and result.cancel_flow_runs == ()
    (audit,) = _audits(engine)
    assert audit.action == "abort" and audit.target == f"run:{run_id}"
    assert audit.old == {"runs": {run_id: "running"}}
    assert audit.new is not None and audit.new["runs"] == {run_id: "draining"}
    assert audit.new["removed_jobs"] == 2 and audit.new["live_left"] == 2


def test_abort_a_run_cancelling_live_instances(engine: Engine) -> None:
    run_id = _run(engine)
    _lease(engine, run_id, "i-0", "running")
    _lease(engine, run_id, "i-1", "evaluating")
    with controls.control_session(engine) as s:
        result = controls.abort(s, "run", run_id, live="cancel", actor="ana", reason="runaway")
    assert set(_states(engine, run_id).values()) == {"aborted"}
    assert _jobs(engine, run_id) == set()
    row = _run_row(engine, run_id)
    assert row.state == "aborted" and row.closed_at is not None
    assert result.revoke_keys == (run_id,)
    assert sorted(result.cancel_flow_runs) == ["fr-i-0", "fr-i-1"]
    assert _audit_count(engine) == 1


def test_abort_an_alias_or_everything_touches_only_live_runs_in_scope(engine: Engine) -> None:
    a1, a2 = _run(engine, "sim-openai"), _run(engine, "sim-openai", state="paused")
    b = _run(engine, "sim-anthropic")
    done = _run(engine, "sim-openai", state="closed")
    with controls.control_session(engine) as s:
        result = controls.abort(s, "alias", "sim-openai", live="finish", actor="a", reason="r")
    assert {r.run_id for r in result.runs} == {a1, a2}
    assert _run_row(engine, a1).state == "aborted"  # nothing was live: aborted at once
    assert _run_row(engine, a2).state == "aborted"
    assert _run_row(engine, b).state == "running"
    assert _run_row(engine, done).state == "closed"
    with controls.control_session(engine) as s:
        everything = controls.abort(s, "all", None, live="finish", actor="a", reason="outage")
    assert [r.run_id for r in everything.runs] == [b]
    assert _run_row(engine, b).state == "aborted"
    assert _audit_count(engine) == 2
    with pytest.raises(ConfigError, match="is aborted"), controls.control_session(engine) as s:
        controls.abort(s, "run", b, live="finish", actor="a", reason="again")
    with pytest.raises(ConfigError, match="target"), controls.control_session(engine) as s:
        controls.abort(s, "alias", None, live="finish", actor="a", reason="r")
    with pytest.raises(ConfigError, match="live"):  # noqa: SIM117
        with controls.control_session(engine) as s:
            controls.abort(s, "all", None, live="later", actor="a", reason="r")  # type: ignore[arg-type]
    assert _audit_count(engine) == 2


# ---------------------------------------------------------------------------------------------
# pacer constants


def _history(engine: Engine) -> list[tuple[int, str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(PacerConfigHistory.version, PacerConfigHistory.actor, PacerConfigHistory.reason)
            .where(PacerConfigHistory.alias == "sim-openai")
            .order_by(PacerConfigHistory.version)
        ).all()
    return [tuple(r) for r in rows]


def test_pacer_edits_are_versioned_with_history_and_audit(engine: Engine) -> None:
    with controls.control_session(engine) as s:
        assert pacer_controls.show_pacer(s, OPENAI)["version"] == 0
        change = pacer_controls.set_pacer(
            s, OPENAI, {"calls_per_s": 5.0, "cooldown_s": 60}, now=NOW, actor="ana", reason="429s"
        )
    assert change.old is not None and change.new is not None
    assert change.old["calls_per_s"] == 9.0 and change.new["calls_per_s"] == 5.0
    assert change.new["cooldown_s"] == 60 and change.new["tokens_per_s"] == 27_000.0
    with controls.control_session(engine) as s:
        pacer_controls.set_pacer(
            s, OPENAI, {"tokens_per_s": 20_000.0}, now=NOW, actor="bo", reason="x"
        )
        shown = pacer_controls.show_pacer(s, OPENAI)
    assert shown["version"] == 2
    assert (shown["calls_per_s"], shown["tokens_per_s"]) == (5.0, 20_000.0)
    assert shown["seed"]["calls_per_s"] == 9.0  # an edit is not a re-base
    assert _history(engine) == [(1, "ana", "429s"), (2, "bo", "x")]
    audits = _audits(engine)
    assert [(a.action, a.target) for a in audits] == [("pacer.set", "alias:sim-openai")] * 2
    assert audits[1].old is not None and audits[1].old["tokens_per_s"] == 27_000.0


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"calls_per_s": -1.0}, "calls_per_s"),
        ({"calls_per_s": 0}, "calls_per_s"),
        ({"calls_per_s": float("nan")}, "calls_per_s: must be a finite number"),
        ({"tokens_per_s": 1e12}, "tokens_per_s"),
        ({"burst_s": 601.0}, "burst_s"),
        ({"cooldown_s": "10"}, "cooldown_s"),
        ({"calls_per_sec": 3.0}, "calls_per_sec: not a pacer constant"),
        ({}, "name at least one constant"),
        ({"calls_per_s": 9.0}, "already in force"),
    ],
)
def test_bad_pacer_values_are_clear_errors(
    engine: Engine, changes: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle), controls.control_session(engine) as s:
        pacer_controls.set_pacer(s, OPENAI, changes, now=NOW, actor="ana", reason="r")
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(PacerConfig)).scalar_one() == 0
    assert _audit_count(engine) == 0


def test_rebase_sets_seed_and_budgets_as_operator_within_header_caps(engine: Engine) -> None:
    with controls.control_session(engine) as s:
        pacer_controls.set_pacer(s, OPENAI, {"calls_per_s": 4.0}, now=NOW, actor="a", reason="cut")
    with engine.begin() as conn:  # the provider's headers state 600 requests/min = 10/s
        conn.execute(
            cast(Table, AliasObservation.__table__)
            .insert()
            .values(
                alias="sim-openai",
                observed_at=NOW,
                status=200,
                headers={},
                limits={"limits": {"requests": 600.0}, "remaining": {}},
            )
        )
    later = NOW.replace(hour=13)
    with controls.control_session(engine) as s:
        change = pacer_controls.rebase_pacer(
            s,
            OPENAI,
            {"calls_per_s": 12.0, "tokens_per_s": 30_000.0},
            now=later,
            actor="ana",
            reason="provider raised our tier",
        )
        shown = pacer_controls.show_pacer(s, OPENAI)
    assert change.new is not None and change.new["seed_source"] == "operator"
    assert shown["seed"]["calls_per_s"] == 12.0 and shown["seed"]["tokens_per_s"] == 30_000.0
    assert shown["calls_per_s"] == pytest.approx(10.0)  # the stated limit stays a hard cap
    assert shown["tokens_per_s"] == 30_000.0
    assert shown["burst_s"] == OPENAI.pacer.burst_s  # re-basing budgets keeps the other constants
    assert shown["seed_source"] == "operator" and shown["version"] == 2
    assert datetime.fromisoformat(shown["seeded_at"]) == later
    assert _history(engine)[-1] == (2, "ana", "provider raised our tier")
    assert [a.action for a in _audits(engine)] == ["pacer.set", "pacer.rebase"]
    with pytest.raises(ConfigError, match="seed: calls_per_s: must be a positive"):  # noqa: SIM117
        with controls.control_session(engine) as s:
            pacer_controls.rebase_pacer(
                s, OPENAI, {"calls_per_s": -2.0}, now=later, actor="a", reason="r"
            )
    with pytest.raises(ConfigError, match="burst_s: not a budget"):  # noqa: SIM117
        with controls.control_session(engine) as s:
            pacer_controls.rebase_pacer(
                s, OPENAI, {"burst_s": 3.0}, now=later, actor="a", reason="r"
            )
    assert _audit_count(engine) == 2
