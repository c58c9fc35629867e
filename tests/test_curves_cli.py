"""``evalfleet curves fit-default``: refits the shipped default and reports the held-out check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalfleet.cli import main
from planner.curves import HarnessCurve, default_curve


def test_fit_default_writes_the_shipped_curve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["curves", "fit-default", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "checked on 100 held-out instances" in out
    assert "calls_per_s: worst" in out
    written = json.loads((tmp_path / "mini-swe-agent.json").read_text())
    assert HarnessCurve.from_params(written) == default_curve()
    assert written["fit"]["check"]["minutes"] == 8
    assert list(tmp_path.iterdir()) == [tmp_path / "mini-swe-agent.json"]  # no temp files left


def test_fit_default_dry_run_json_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["curves", "fit-default", "--out", str(tmp_path), "--dry-run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["written"] is False
    assert set(report["check"]["max_abs_rel_error"]) >= {"calls_per_s", "input_tokens_per_s"}
    assert not any(tmp_path.iterdir())


def test_fit_default_unknown_trace_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["curves", "fit-default", "--trace", "nope", "--dry-run"]) == 2
    assert "unknown trace 'nope'" in capsys.readouterr().err
