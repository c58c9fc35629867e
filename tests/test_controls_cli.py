"""The operator-control CLI end to end on a SQLite ledger (``evalfleet.cli.main``): each command
changes the ledger and writes one audit row; a missing reason, a bad value or an unknown alias
exits 2 with a message naming the problem, writing nothing; an abort whose key revocation fails
is still recorded and says so."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update

from evalfleet.cli import main
from ledger.db import make_engine
from ledger.migrate import upgrade
from ledger.models import AuditLog, InstanceResult, Job, Run
from ledger.runs import NewRun, create_run


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    from evalfleet.settings import get_settings
    from tasks import ledger_io

    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", url)
    monkeypatch.delenv("EVALFLEET_PROVIDER_ADMIN_KEY", raising=False)
    for cached in (get_settings, ledger_io.engine, ledger_io.sessions):
        cached.cache_clear()
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()
    ledger_io.engine().dispose()
    for cached in (get_settings, ledger_io.engine, ledger_io.sessions):
        cached.cache_clear()


def _run(engine: Engine) -> str:
    run_id = str(uuid.uuid4())
    create_run(
        engine,
        NewRun(
            run_id=run_id,
            name="r",
            harness="simulated",
            alias="sim-openai",
            instance_ids=["a", "b"],
            spend_cap_micro_usd=1_000_000,
            max_attempts=3,
        ),
    )
    return run_id


def _audits(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(AuditLog.action, AuditLog.actor, AuditLog.reason)).all())


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cap_and_override(ledger: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    run_id = _run(ledger)
    code, out, _ = _cli(capsys, "cap", run_id, "3", "--reason", "slow down", "--actor", "ana")
    assert code == 0 and "{'task_cap': None} -> {'task_cap': 3}" in out
    code, _, _ = _cli(capsys, "override", "alias", "sim-openai", "0", "--reason", "hold")
    assert code == 0
    code, _, _ = _cli(capsys, "cap", run_id, "none", "--reason", "normal again")
    assert code == 0
    with ledger.connect() as conn:
        assert conn.execute(select(Run.task_cap).where(Run.id == run_id)).scalar_one() is None
    audits = _audits(ledger)
    assert [a.action for a in audits] == ["run.task_cap", "alias.ceiling_override", "run.task_cap"]
    assert audits[0].actor == "ana" and audits[1].actor.startswith("cli")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["cap", "RUN", "3"], "Missing option '--reason'"),
        (["cap", "RUN", "0", "--reason", "r"], "task_cap: must be between 1 and"),
        (["cap", "RUN", "three", "--reason", "r"], "not a whole number or 'none'"),
        (["cap", "RUN", "3", "--reason", " "], "reason: an audit reason is required"),
        (["cap", "no-such-run", "3", "--reason", "r"], "run no-such-run does not exist"),
        (["override", "alias", "nope", "3", "--reason", "r"], "unknown gateway alias 'nope'"),
        (["pacer", "set", "sim-openai", "--calls-per-s", "-1", "--reason", "r"], "calls_per_s"),
        (["pacer", "set", "sim-openai", "--reason", "r"], "name at least one constant"),
        (["pacer", "rebase", "nope", "--calls-per-s", "3", "--reason", "r"], "unknown gateway"),
        (["abort", "alias", "--reason", "r"], "target: the alias to abort is required"),
    ],
)
def test_bad_input_exits_2_naming_the_problem_and_writes_nothing(
    ledger: Engine, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    run_id = _run(ledger)
    code, _, err = _cli(capsys, *[run_id if a == "RUN" else a for a in argv])
    assert code == 2
    assert needle in err
    assert "Traceback" not in err
    assert _audits(ledger) == []


def test_pacer_set_show_and_rebase(ledger: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = _cli(
        capsys, "pacer", "set", "sim-openai", "--calls-per-s", "5", "--burst-s", "4",
        "--reason", "429 storm",
    )  # fmt: skip
    assert code == 0
    code, out, _ = _cli(capsys, "pacer", "show", "sim-openai", "--json")
    shown = json.loads(out)
    assert (shown["calls_per_s"], shown["burst_s"], shown["version"]) == (5.0, 4.0, 1)
    code, _, _ = _cli(
        capsys, "pacer", "rebase", "sim-openai", "--tokens-per-s", "20000", "--reason", "new tier"
    )
    assert code == 0
    code, out, _ = _cli(capsys, "pacer", "show", "sim-openai", "--json")
    shown = json.loads(out)
    assert shown["seed_source"] == "operator" and shown["seed"]["tokens_per_s"] == 20_000.0
    assert shown["tokens_per_s"] == 20_000.0 and shown["version"] == 2
    assert [a.action for a in _audits(ledger)] == ["pacer.set", "pacer.rebase"]


def test_abort_with_live_instances_drains(
    ledger: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = _run(ledger)
    with ledger.begin() as conn:
        conn.execute(update(Job).where(Job.instance_id == "a").values(lease_token="L"))
        conn.execute(
            update(InstanceResult).where(InstanceResult.instance_id == "a").values(state="running")
        )
    code, out, _ = _cli(capsys, "abort", "run", run_id, "--reason", "wrong model")
    assert code == 0
    assert "running -> draining; removed 1 queued job(s), aborted 1 instance(s), 1 live left" in out
    assert [a.action for a in _audits(ledger)] == ["abort"]


def test_an_abort_whose_key_revocation_fails_is_recorded_and_says_so(
    ledger: Engine, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tasks.keys

    def provider_down(run_id: str) -> list[str]:
        raise ConnectionError("provider admin API unreachable")

    monkeypatch.setattr(tasks.keys, "revoke_keys", provider_down)
    run_id = _run(ledger)  # nothing live: the run is aborted now and its keys must be revoked
    code, _, err = _cli(capsys, "abort", "all", "--reason", "outage")
    assert code == 2
    assert "abort recorded, but 1 follow-up(s) failed" in err and run_id in err
    assert "provider admin API unreachable" in err
    with ledger.connect() as conn:
        assert conn.execute(select(Run.state).where(Run.id == run_id)).scalar_one() == "aborted"
        assert conn.execute(select(func.count()).select_from(AuditLog)).scalar_one() == 1
