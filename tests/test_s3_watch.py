"""The S3 watcher (the poller bridging S3 to Prefect events), on a moto S3 server and a SQLite
ledger, with an emitter that records the events instead of sending them.

Shows: a valid config becomes one ``s3.object.created`` event with bucket/key/version in the
payload; an oversized, malformed or invalid object is recorded as rejected with the reason (and
announced as ``s3.object.rejected``), never a crash; a restarted watcher emits nothing again; a
new upload (new version) is a new event; a failing emitter records nothing, so the next poll
retries; the launch automation's templates are checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from deployments.s3 import (
    EVENT_CREATED,
    EVENT_REJECTED,
    LAUNCH_PARAMETERS,
    S3Watcher,
    check_templates,
    launch_automation,
    recorded_drops,
)
from evalfleet.config_sources import MAX_CONFIG_BYTES
from evalfleet.errors import ConfigError, ConfigSourceUnavailable
from ledger.db import make_engine
from ledger.migrate import upgrade
from ledger.models import S3Drop

pytest_plugins = ["s3_support"]


class Recorder:
    def __init__(self) -> None:
        self.events: list[Any] = []
        self.fail = False

    def __call__(self, events: Sequence[Any]) -> None:
        if self.fail:
            raise RuntimeError("prefect is down")
        self.events.extend(events)


@pytest.fixture
def ledger(tmp_path: Any) -> Any:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


def _watcher(s3: Any, ledger: Engine, emit: Recorder, prefix: str = "runs/") -> S3Watcher:
    return S3Watcher(s3=s3, engine=ledger, bucket="drops", prefix=prefix, emit=emit)


def _bucket(s3: Any) -> None:
    s3.create_bucket(Bucket="drops")
    s3.put_bucket_versioning(Bucket="drops", VersioningConfiguration={"Status": "Enabled"})


def test_new_configs_become_events_and_bad_ones_are_recorded(
    moto_s3: Any, ledger: Engine, good_config: bytes
) -> None:
    _bucket(moto_s3)
    put = moto_s3.put_object(Bucket="drops", Key="runs/a.yaml", Body=good_config)
    moto_s3.put_object(Bucket="drops", Key="runs/big.yaml", Body=b"#" * (MAX_CONFIG_BYTES + 10))
    moto_s3.put_object(Bucket="drops", Key="runs/broken.yaml", Body=b"name: [oops\n")
    moto_s3.put_object(Bucket="drops", Key="runs/notes.txt", Body=b"hello")
    moto_s3.put_object(Bucket="drops", Key="elsewhere/b.yaml", Body=good_config)
    gets: list[str] = []
    moto_s3.meta.events.register(
        "provide-client-params.s3.GetObject", lambda params, **_: gets.append(params["Key"])
    )
    emit = Recorder()

    report = _watcher(moto_s3, ledger, emit).poll_once()

    assert [i.key for i in report.emitted] == ["runs/a.yaml"]
    rejected = dict((i.key, reason) for i, reason in report.rejected)
    assert set(rejected) == {"runs/big.yaml", "runs/broken.yaml", "runs/notes.txt"}
    assert "too large" in rejected["runs/big.yaml"]
    assert "invalid YAML: line" in rejected["runs/broken.yaml"]
    assert "unsupported file type" in rejected["runs/notes.txt"]
    assert "runs/big.yaml" not in gets  # refused on its HEAD/listing size, never downloaded

    created = [e for e in emit.events if e.event == EVENT_CREATED]
    assert len(created) == 1
    event = created[0]
    version = put["VersionId"]
    assert event.resource.id == "s3.object.drops.runs/a.yaml"
    assert event.payload["bucket"] == "drops"
    assert event.payload["key"] == "runs/a.yaml"
    assert event.payload["version_id"] == version
    assert event.payload["uri"] == f"s3://drops/runs/a.yaml?versionId={version}"
    assert event.payload["idempotency_key"] == f"s3://drops/runs/a.yaml?versionId={version}"
    assert sorted(e.payload["key"] for e in emit.events if e.event == EVENT_REJECTED) == [
        "runs/big.yaml",
        "runs/broken.yaml",
        "runs/notes.txt",
    ]

    drops = {d.key: d for d in recorded_drops(ledger, "drops")}
    assert drops["runs/a.yaml"].state == "emitted"
    assert drops["runs/a.yaml"].event_id == str(event.id)
    assert drops["runs/big.yaml"].state == "rejected"
    assert "too large" in (drops["runs/big.yaml"].reason or "")


def test_a_restarted_watcher_does_not_relaunch_but_a_new_upload_does(
    moto_s3: Any, ledger: Engine, good_config: bytes
) -> None:
    _bucket(moto_s3)
    moto_s3.put_object(Bucket="drops", Key="runs/a.yaml", Body=good_config)
    first = Recorder()
    assert len(_watcher(moto_s3, ledger, first).poll_once().emitted) == 1

    again = Recorder()  # a new process: only the ledger remembers
    report = _watcher(moto_s3, ledger, again).poll_once()
    assert report.emitted == [] and report.rejected == [] and report.known == 1
    assert again.events == []

    moto_s3.put_object(Bucket="drops", Key="runs/a.yaml", Body=good_config)  # a new version
    report = _watcher(moto_s3, ledger, again).poll_once()
    assert len(report.emitted) == 1 and report.known == 0
    with ledger.connect() as conn:
        assert conn.execute(select(func.count()).select_from(S3Drop)).scalar_one() == 2


def test_same_bytes_again_on_an_unversioned_bucket_is_the_same_drop(
    moto_s3: Any, ledger: Engine, good_config: bytes
) -> None:
    moto_s3.create_bucket(Bucket="drops")
    moto_s3.put_object(Bucket="drops", Key="runs/a.yaml", Body=good_config)
    emit = Recorder()
    assert len(_watcher(moto_s3, ledger, emit).poll_once().emitted) == 1
    moto_s3.put_object(Bucket="drops", Key="runs/a.yaml", Body=good_config)  # same ETag
    assert _watcher(moto_s3, ledger, emit).poll_once().emitted == []
    moto_s3.put_object(Bucket="drops", Key="runs/a.yaml", Body=good_config + b"# edited\n")
    assert len(_watcher(moto_s3, ledger, emit).poll_once().emitted) == 1


def test_a_failed_emission_records_nothing_so_the_next_poll_retries(
    moto_s3: Any, ledger: Engine, good_config: bytes
) -> None:
    _bucket(moto_s3)
    moto_s3.put_object(Bucket="drops", Key="runs/a.yaml", Body=good_config)
    emit = Recorder()
    emit.fail = True
    with pytest.raises(RuntimeError, match="prefect is down"):
        _watcher(moto_s3, ledger, emit).poll_once()
    assert recorded_drops(ledger) == []
    emit.fail = False
    assert len(_watcher(moto_s3, ledger, emit).poll_once().emitted) == 1


def test_an_unlistable_bucket_is_a_clear_error(moto_s3: Any, ledger: Engine) -> None:
    with pytest.raises(ConfigSourceUnavailable, match="bucket 'drops' does not exist"):
        _watcher(moto_s3, ledger, Recorder()).poll_once()


@pytest.mark.parametrize(
    ("bucket", "prefix", "needle"),
    [("Drops", "runs/", "bucket"), ("drops", "runs/*", "prefix"), ("drops", "a\nb", "prefix")],
)
def test_bad_locations_are_refused(
    moto_s3: Any, ledger: Engine, bucket: str, prefix: str, needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        S3Watcher(s3=moto_s3, engine=ledger, bucket=bucket, prefix=prefix, emit=Recorder())


def test_launch_automation_shape_and_template_check() -> None:
    automation = launch_automation("drops", "runs/", "00000000-0000-0000-0000-000000000001")
    assert automation.trigger.expect == {"s3.object.created"}
    assert automation.trigger.match.model_dump() == {
        "prefect.resource.id": "s3.object.drops.runs/*"
    }
    assert automation.actions[0].parameters == LAUNCH_PARAMETERS
    check_templates({"ok": "{{ event.id | string }}", "also": "{{ event.payload.uri }}"})
    with pytest.raises(ConfigError, match=r"event\.id \| string"):
        check_templates({"trigger_event": "{{ event.id }}"})


def test_watch_cli_without_a_prefect_server_is_a_clear_error(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefect.context import refresh_global_settings_context

    from evalfleet.cli import main
    from evalfleet.settings import get_settings
    from tasks import ledger_io

    # Prefect snapshots its settings (PREFECT_API_URL among them) in a global context: after a
    # session Prefect server was started, removing the variable alone is not seen. Refresh the
    # snapshot without the URL, and again once the environment is restored.
    try:
        with monkeypatch.context() as env:
            env.setenv("EVALFLEET_DATABASE_URL", f"sqlite:///{tmp_path / 'l.sqlite3'}")
            env.delenv("PREFECT_API_URL", raising=False)
            refresh_global_settings_context()
            for cached in (get_settings, ledger_io.engine, ledger_io.sessions):
                cached.cache_clear()
            code = main(["s3", "watch", "--bucket", "drops", "--once"])
    finally:
        refresh_global_settings_context()
        for cached in (get_settings, ledger_io.engine, ledger_io.sessions):
            cached.cache_clear()
    err = capsys.readouterr().err
    assert code == 2
    assert "PREFECT_API_URL is not set" in err and "Traceback" not in err
