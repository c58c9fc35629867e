"""ledger.curve_window and ledger.curves: the refit's window (which calls and instances count,
ages on the task's own clock), versioned curve writes, latest/list, the planner's per-tick cache,
and recovery of a known curve through the ledger and ``evalfleet curves fit --write``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, insert

from analysis.simfill import write_call_frames
from evalfleet.cli import main
from evalfleet.errors import ConfigError, NotFound
from evalfleet.settings import get_settings
from ledger.curve_window import load_fit_window
from ledger.curves import (
    CurveCache,
    latest_curve,
    latest_version,
    list_versions,
    read_version,
    write_curve,
)
from ledger.db import make_engine
from ledger.migrate import upgrade
from ledger.models import InstanceResult, LlmCall, Run
from planner.curves import HarnessCurve, default_curve
from sim.traces import synthesize_calls
from tests.analysis_fixtures import fresh_pg_ledger_url  # noqa: F401 (fixture)

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Engine]:
    """A freshly migrated ledger on each database (PostgreSQL: a new database per test)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    else:
        url = request.getfixturevalue("fresh_pg_ledger_url")
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


@pytest.fixture
def sqlite_engine(tmp_path: Any) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _run(engine: Engine, run_id: str, harness: str = "toy") -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(Run).values(
                id=run_id,
                name=run_id,
                harness=harness,
                alias="a",
                state="running",
                spend_cap_micro_usd=10**9,
                max_attempts=3,
                config={},
                created_at=T0,
            )
        )


def _instance(
    engine: Engine,
    run_id: str,
    iid: str,
    state: str,
    start_s: float,
    end_s: float | None,
    running_s: float | None = None,
) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(InstanceResult).values(
                run_id=run_id,
                instance_id=iid,
                state=state,
                started_at=T0 + timedelta(seconds=start_s),
                running_at=None if running_s is None else T0 + timedelta(seconds=running_s),
                finished_at=None if end_s is None else T0 + timedelta(seconds=end_s),
            )
        )


def _call(
    engine: Engine,
    run_id: str,
    iid: str,
    at_s: float,
    age_s: float | None,
    *,
    status: int = 200,
    tokens: int = 100,
    wait: float = 0.0,
    harness: str | None = "toy",
    sent_s: float | None = None,
) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(LlmCall).values(
                run_id=run_id,
                instance_id=iid,
                alias="a",
                harness=harness,
                requested_at=T0 + timedelta(seconds=at_s),
                sent_at=None if sent_s is None else T0 + timedelta(seconds=sent_s),
                task_age_s=age_s,
                input_tokens=tokens if status == 200 else 0,
                cached_input_tokens=0,
                output_tokens=10 if status == 200 else 0,
                pacer_wait_s=wait,
                status=status,
                limit_type=None if status == 200 else "tokens",
            )
        )


# ----------------------------------------------------------------------------- the window


def test_ages_are_on_the_tasks_own_clock_pacer_waits_and_429s_removed(engine: Engine) -> None:
    _run(engine, "r1")
    # Task starts at t=100. Call 1 at age 0 waits 4 s at the pacer; call 2 at age 30 is a 429,
    # retried at age 50 (20 s lost) and answered; the task ends at age 80.
    _instance(engine, "r1", "i1", "resolved", 90.0, 180.0)
    _call(engine, "r1", "i1", 100.0, 0.0, wait=4.0)
    _call(engine, "r1", "i1", 130.0, 30.0, status=429)
    _call(engine, "r1", "i1", 150.0, 50.0, wait=1.0)
    window = load_fit_window(engine, "toy")
    assert window.calls["t_request_s"].tolist() == pytest.approx([0.0, 50.0 - 4.0 - 20.0])
    assert window.instances["wall_time_s"].tolist() == pytest.approx([80.0 - 25.0])
    assert window.throttle_s == pytest.approx(25.0)
    raw = load_fit_window(engine, "toy", unthrottled=False)
    assert raw.calls["t_request_s"].tolist() == pytest.approx([0.0, 50.0])
    assert raw.instances["wall_time_s"].tolist() == pytest.approx([80.0])


def test_a_gateway_retry_loses_its_retry_after_and_ages_fall_back_to_the_harness_start(
    engine: Engine,
) -> None:
    """The gateway retried call 1 itself: both attempts share the call's request (t=100), the
    first sent after a 2 s pacer wait and rejected, the second sent 21 s later (``sent_at``),
    after a 20 s retry-after. The task lost 23 s before call 2, not the 2 s of the pacer wait
    the attempts' ``pacer_wait_s`` say. A call without an age is aged from the harness's start
    (``running_at``, t=95), not from the claim (t=90) that counts the boot."""
    _run(engine, "r1")
    _instance(engine, "r1", "i1", "resolved", 90.0, 180.0, running_s=100.0)
    _call(engine, "r1", "i1", 100.0, 0.0, status=429, wait=2.0, sent_s=102.0)
    _call(engine, "r1", "i1", 100.0, 0.0, wait=2.0, sent_s=123.0)
    _call(engine, "r1", "i1", 150.0, 50.0, sent_s=150.0)
    _instance(engine, "r1", "i2", "resolved", 90.0, 200.0, running_s=95.0)
    _call(engine, "r1", "i2", 105.0, None)
    window = load_fit_window(engine, "toy")
    ages = window.calls.groupby("instance_id")["t_request_s"].apply(list).to_dict()
    assert ages["r1/i1"] == pytest.approx([0.0, 50.0 - 23.0])
    assert ages["r1/i2"] == pytest.approx([105.0 - 95.0])
    walls = dict(zip(window.instances.instance_id, window.instances.wall_time_s, strict=True))
    assert walls == pytest.approx({"r1/i1": 80.0 - 23.0, "r1/i2": 105.0})
    assert window.throttle_s == pytest.approx(23.0)


def test_only_naturally_ended_instances_inside_the_window_count(engine: Engine) -> None:
    _run(engine, "r1")
    _instance(engine, "r1", "done", "unresolved", 0.0, 60.0)
    _call(engine, "r1", "done", 10.0, 0.0)
    _instance(engine, "r1", "running", "running", 0.0, None)
    _call(engine, "r1", "running", 10.0, 0.0)
    _instance(engine, "r1", "lost", "lost", 0.0, 60.0)
    _call(engine, "r1", "lost", 10.0, 0.0)
    _instance(engine, "r1", "late", "resolved", 500.0, 900.0)  # ends after `until`
    _call(engine, "r1", "late", 510.0, 0.0)
    _instance(engine, "r1", "early", "error", 0.0, 50.0)  # started before `since`
    _call(engine, "r1", "early", 2.0, 0.0)
    _call(engine, "r1", "early", 20.0, 18.0)
    since, until = T0 + timedelta(seconds=5), T0 + timedelta(seconds=600)
    window = load_fit_window(engine, "toy", since, until)
    assert window.instances["instance_id"].tolist() == ["r1/done"]
    assert window.dropped == {
        "calls_of_unfinished_instances": 1,
        "calls_of_aborted_or_lost_instances": 1,
        "calls_of_earlier_attempts": 0,
        "instances_outside_window": 2,
    }
    assert load_fit_window(engine, "toy").instance_count == 3  # unbounded: late and early too
    assert load_fit_window(engine, "other").instance_count == 0


def test_calls_of_an_earlier_attempt_are_left_out_and_missing_ages_fall_back(
    engine: Engine,
) -> None:
    _run(engine, "r1", harness="toy")
    _instance(engine, "r1", "i1", "resolved", 0.0, 400.0)
    _call(engine, "r1", "i1", 10.0, 5.0)  # attempt 1 started at t=5
    _call(engine, "r1", "i1", 200.0, 0.0)  # attempt 2 started at t=200
    _call(engine, "r1", "i1", 260.0, 60.0)
    _instance(engine, "r1", "i2", "resolved", 100.0, 200.0)
    _call(engine, "r1", "i2", 130.0, None, harness=None)  # no age, harness from the run
    window = load_fit_window(engine, "toy")
    assert window.dropped["calls_of_earlier_attempts"] == 1
    by_instance = window.calls.groupby("instance_id")["t_request_s"].apply(list).to_dict()
    assert by_instance == {"r1/i1": [0.0, 60.0], "r1/i2": [30.0]}
    walls = dict(zip(window.instances.instance_id, window.instances.wall_time_s, strict=True))
    assert walls == pytest.approx({"r1/i1": 200.0, "r1/i2": 100.0})


def test_bad_windows_and_harness_names_are_clear_errors(sqlite_engine: Engine) -> None:
    with pytest.raises(ConfigError, match=r"since.*must be timezone-aware"):
        load_fit_window(sqlite_engine, "toy", datetime(2026, 1, 1))
    with pytest.raises(ConfigError, match="must be before until"):
        load_fit_window(sqlite_engine, "toy", T0, T0)
    with pytest.raises(ConfigError, match="--harness"):
        load_fit_window(sqlite_engine, "")


# ----------------------------------------------------------------------------- versions


def _toy_curve(harness: str, scale: float = 1.0) -> HarnessCurve:
    params = default_curve().to_params()
    params["harness"] = harness
    params["rates"]["calls_per_s"] = [v * scale for v in params["rates"]["calls_per_s"]]
    return HarnessCurve.from_params(params)


def test_versions_increment_per_harness_and_latest_wins(engine: Engine) -> None:
    assert latest_version(engine, "toy") == 0
    with pytest.raises(NotFound, match="no default usage curve ships for harness 'toy'"):
        latest_curve(engine, "toy")
    shipped = latest_curve(engine, "mini-swe-agent")
    assert (shipped.version, shipped.curve) == (0, default_curve())
    v1 = write_curve(engine, _toy_curve("toy"), sample_count=10, fit_quality={}, source="t")
    v2 = write_curve(
        engine, _toy_curve("toy", 2.0), sample_count=20, fit_quality={"x": 1.5}, source="t2"
    )
    other = write_curve(engine, _toy_curve("other"), sample_count=5, fit_quality={}, source="o")
    assert (v1, v2, other) == (1, 2, 1)
    latest = latest_curve(engine, "toy")
    assert latest.version == 2
    assert latest.curve == _toy_curve("toy", 2.0)
    assert (latest.sample_count, dict(latest.fit_quality), latest.source) == (20, {"x": 1.5}, "t2")
    assert read_version(engine, "toy", 1).curve == _toy_curve("toy")
    with pytest.raises(NotFound, match="no curve version 3"):
        read_version(engine, "toy", 3)
    listed = [(v.harness, v.version, v.sample_count) for v in list_versions(engine)]
    assert listed == [("other", 1, 5), ("toy", 1, 10), ("toy", 2, 20)]
    assert [v.version for v in list_versions(engine, "toy")] == [1, 2]


def test_concurrent_writers_get_distinct_versions(engine: Engine) -> None:
    """Twelve writers released together: each gets its own version, none fails. (More writers
    than ``write_curve``'s retries: a writer that relied on losing unique-constraint races and
    retrying could lose every round.)"""
    curve = _toy_curve("toy")
    writers = 12
    start = threading.Barrier(writers)
    versions: list[int] = []
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            start.wait(timeout=30)
            versions.append(
                write_curve(engine, curve, sample_count=1, fit_quality={}, source="race")
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    assert not errors
    assert sorted(versions) == list(range(1, writers + 1))
    assert [v.version for v in list_versions(engine, "toy")] == list(range(1, writers + 1))


def test_planner_cache_serves_a_new_version_at_the_next_tick(engine: Engine) -> None:
    """What the planner loop does every tick: ``CurveCache.get(harness)``. A version written
    between two ticks is what the next tick uses; without a new version the parsed curve is
    reused (same object)."""
    cache = CurveCache(engine)
    tick1 = cache.get("mini-swe-agent")
    assert tick1.version == 0 and tick1.curve == default_curve()
    assert cache.get("mini-swe-agent") is tick1
    refit = _toy_curve("mini-swe-agent", 0.5)
    write_curve(engine, refit, sample_count=3, fit_quality={}, source="refit")
    tick2 = cache.get("mini-swe-agent")
    assert tick2.version == 1 and tick2.curve == refit
    assert cache.get("mini-swe-agent") is tick2


# ----------------------------------------------------------------------------- recovery


def test_refit_through_the_ledger_recovers_a_known_curve(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Calls generated from a known curve -> llm_calls -> ``curves fit --write`` -> read back:
    mean input tokens/s per minute of age within 10% over the first 10 minutes."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    upgrade(url)
    known = default_curve()
    calls, instances = synthesize_calls(known, 1500, seed=11)
    eng = make_engine(url)
    write_call_frames(eng, calls, instances, harness="known", start_at=T0, stagger_s=2.0)
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", url)
    get_settings.cache_clear()
    try:
        assert main(["curves", "fit", "--harness", "known", "--write", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert main(["curves", "show", "--harness", "known"]) == 0
        shown = capsys.readouterr().out
    finally:
        get_settings.cache_clear()
    assert report["written_version"] == 1
    assert report["instances"] == 1500
    assert report["sample_count"] == calls.shape[0]
    assert report["current_version"] is None  # no default ships for "known"
    assert "known  v1" in shown and "<- in use" in shown
    stored = latest_curve(eng, "known")
    eng.dispose()
    assert stored.version == 1 and stored.sample_count == calls.shape[0]
    grid = np.arange(600.0) + 0.5
    for method in ("input_tokens_per_s", "calls_per_s"):
        fitted = getattr(stored.curve, method)(grid).reshape(10, 60).mean(axis=1)
        truth = getattr(known, method)(grid).reshape(10, 60).mean(axis=1)
        error = fitted / truth - 1
        assert np.abs(error).max() < 0.10, (method, np.round(error, 3))


def test_curves_fit_refuses_a_thin_window_and_bad_times(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    upgrade(url)
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", url)
    get_settings.cache_clear()
    try:
        assert main(["curves", "fit", "--harness", "toy", "--write"]) == 2
        err = capsys.readouterr().err
        assert "only 0 finished instance(s)" in err and "--min-instances" in err
        assert main(["curves", "fit", "--harness", "toy", "--since", "last tuesday"]) == 2
        assert "--since" in capsys.readouterr().err
        assert main(["curves", "show"]) == 0
        assert "no stored curve versions" in capsys.readouterr().out
    finally:
        get_settings.cache_clear()
    eng = make_engine(url)
    assert list_versions(eng) == []  # nothing half-written
    eng.dispose()


# ----------------------------------------------------------------------------- planner loop


def test_planner_loop_uses_a_version_written_before_its_next_tick(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two planner ticks at the same instant over the same fleet; between them a curve with
    twice the token rates is written for the runs' harness. The second tick must project
    more demand."""
    from tasks import ledger_io, plan

    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    upgrade(url)
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", url)
    get_settings.cache_clear()
    cached: Any
    for cached in (getattr(ledger_io, "engine", None), getattr(ledger_io, "sessions", None)):
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()
    try:
        eng = make_engine(url)
        with eng.begin() as conn:
            conn.execute(
                insert(Run).values(
                    id="r1",
                    name="r1",
                    harness="mini-swe-agent",
                    alias="sim-openai",
                    state="running",
                    spend_cap_micro_usd=10**9,
                    max_attempts=3,
                    config={},
                    created_at=T0,
                )
            )
        for k in range(10):
            _instance(eng, "r1", f"i{k}", "running", -60.0 * k, None)
        now = T0 + timedelta(minutes=1)
        first = plan.plan_tick(now, False)["sim-openai"]
        params = default_curve().to_params()
        for key in ("cached_input_tokens_per_s", "uncached_input_tokens_per_s"):
            params["rates"][key] = [2 * v for v in params["rates"][key]]
        write_curve(
            eng, HarnessCurve.from_params(params), sample_count=1, fit_quality={}, source="x2"
        )
        second = plan.plan_tick(now, False)["sim-openai"]
        eng.dispose()
    finally:
        get_settings.cache_clear()
    assert second.projections["tokens_per_s"] > 1.5 * first.projections["tokens_per_s"]
