"""A launched run's jobs follow its config's ``launch_order``: by default the instances that
were shortest in earlier runs of the harness are claimed last; ``listed`` keeps the config's
order; a bad value is refused naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select, update

from evalfleet.errors import ConfigError
from evalfleet.runconfig import RunConfig
from ledger import queue
from ledger.models import InstanceResult, Job
from tasks import launch, ledger_io

IDS = ["a__1", "a__2", "a__3", "a__4", "a__5", "a__6"]


def _config(name: str, **extra: Any) -> RunConfig:
    data = {
        "name": name,
        "harness": {"name": "simulated", "options": {}},
        "alias": "sim-openai",
        "instances": IDS,
        "caps": {"spend_usd": 1.0},
        **extra,
    }
    return RunConfig.from_mapping(data, None)


def _launch(cfg: RunConfig) -> str:
    run_id, created = launch.write_run(cfg, None, cfg.content_hash)
    assert created
    assert launch.enqueue_run(run_id, cfg.instances, cfg.launch_order)
    return run_id


def _claim_order(run_id: str) -> list[str]:
    leases = queue.claim(ledger_io.engine(), "harness", 100, run_id=run_id)
    return [lease.instance_id for lease in leases]


def test_a_run_launches_the_instances_that_were_short_before_last(
    sqlite_task_ledger: str, caplog: pytest.LogCaptureFixture
) -> None:
    first = _launch(_config("first"))
    assert _claim_order(first) == IDS  # no history: the listed order
    calls = dict(zip(IDS, [40, 8, 25, 90, 3, 12], strict=True))
    with ledger_io.engine().begin() as conn:
        for instance_id, n in calls.items():
            conn.execute(
                update(InstanceResult)
                .where(InstanceResult.run_id == first, InstanceResult.instance_id == instance_id)
                .values(state="resolved", calls=n)
            )
    with caplog.at_level("INFO", logger="tasks.launch"):
        again = _launch(_config("again"))
    assert "launch order short_last; 6 of 6 instances ran before under harness simulated" in (
        caplog.text
    )
    # the shorter half (3, 8, 12 calls) last, shortest at the end; the rest as listed
    assert _claim_order(again) == ["a__1", "a__3", "a__4", "a__6", "a__2", "a__5"]
    listed = _launch(_config("listed", launch_order="listed"))
    assert _claim_order(listed) == IDS
    with ledger_io.engine().connect() as conn:
        leased = conn.execute(select(Job.lease_token)).scalars().all()
    assert len(leased) == 3 * len(IDS) and None not in leased  # each job claimed once


def test_the_default_is_short_last_and_a_bad_value_names_the_field() -> None:
    assert _config("x").launch_order == "short_last"
    with pytest.raises(ConfigError) as caught:
        _config("x", launch_order="random")
    assert any(p.startswith("launch_order") for p in caught.value.problems), caught.value.problems


def test_the_default_order_hashes_as_a_config_written_before_it() -> None:
    assert _config("x").content_hash == _config("x", launch_order="short_last").content_hash
    assert _config("x").content_hash != _config("x", launch_order="listed").content_hash
    assert "launch_order" not in _config("x").canonical_json()
    assert _config("x").to_json_dict()["launch_order"] == "short_last"  # stored in full
