"""``evalfleet curves fit-default`` / ``split-study``: refit the shipped default, check it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalfleet.cli import main
from evalfleet.commands.curves_study import split_study
from planner.curves import HarnessCurve, default_curve


def test_fit_default_writes_the_shipped_curve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["curves", "fit-default", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "checked on 100 held-out instances" in out
    assert "calls_per_s: worst" in out
    written = json.loads((tmp_path / "mini-swe-agent.json").read_text())
    # the same fit, to the last few bits: numpy's reductions round differently on other CPUs
    assert _same_numbers(HarnessCurve.from_params(written).to_params(), default_curve().to_params())
    assert written["fit"]["check"]["minutes"] == 8
    assert written["fit"]["check"]["held_out_alive"][-1] == 18
    lo, hi = written["fit"]["check"]["held_out_observed_95"]["uncached_input_tokens_per_s"][7]
    assert lo < 222.7 < hi  # the held-out minute-7 mean, inside its own interval
    assert "observed_lo" in out
    assert list(tmp_path.iterdir()) == [tmp_path / "mini-swe-agent.json"]  # no temp files left


def _same_numbers(got: object, want: object) -> bool:
    """Equal structure and strings; floats equal to a relative 1e-9."""
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(_same_numbers(got[k], want[k]) for k in want)
        )
    if isinstance(want, list | tuple):
        return (
            isinstance(got, list | tuple)
            and len(got) == len(want)
            and all(_same_numbers(g, w) for g, w in zip(got, want, strict=True))
        )
    if isinstance(want, float) and isinstance(got, int | float):
        return got == pytest.approx(want, rel=1e-9, abs=1e-12)
    return bool(got == want)


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


def test_split_study_compares_the_fit_with_per_minute_means() -> None:
    passes, median_abs = split_study("minisweagent-gemini3pro-verified", 3)
    assert list(passes.index) == ["fit", "train-means", "all-means"]
    assert ((passes >= 0) & (passes <= 1)).all().all()
    # The oracle (all instances' means) includes the held-out ones: close at minute 0, where
    # 100 held-out tasks are alive, and never far off for calls.
    assert (median_abs.loc["all-means", "min 0"] < 0.1).all(), median_abs
    assert median_abs.loc[("all-means", "calls_per_s")].max() < 0.2, median_abs
    assert median_abs.loc[("fit", "calls_per_s"), "min 0"] < 0.1, median_abs


def test_split_study_unknown_trace_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["curves", "split-study", "--trace", "nope", "--splits", "1"]) == 2
    assert "unknown trace 'nope'" in capsys.readouterr().err
