"""``evalfleet bench compare`` and ``sim.compare``: a changed planner's rows judged against a
full run's baselines by the benchmark's own targets (``sim.targets``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from evalfleet.cli import main
from evalfleet.errors import ConfigError
from sim.compare import compare, read_results
from tests.sim.sim_support import result_row as row

OLD = {
    # met before; the new planner is 10% slower than fixed:20: newly missed
    "slower": {"planner": row(1050.0), "fixed:20": row(1000.0)},
    # missed before (ratio 1.25); the new planner is at 1.15: newly met
    "faster": {"planner": row(1250.0), "fixed:20": row(1300.0, http_429=5)},
    # met before and after, 429s unchanged
    "same": {"planner": row(1100.0, http_429=3), "aimd": row(1500.0, http_429=900)},
    # in the old set only
    "old-only": {"planner": row(1000.0), "fixed:20": row(1200.0)},
}
NEW = {
    "slower": {"planner": row(1100.0, http_429=2)},
    "faster": {"planner": row(1150.0, http_429=1)},
    "same": {"planner": row(1100.0, http_429=3), "aimd": row(99.0, http_429=0)},
    "new-only": {"planner": row(1000.0)},
}


def test_new_planner_rows_are_judged_against_the_old_baselines() -> None:
    result = compare(OLD, NEW)
    assert result.compared == 3
    assert (result.met_before, result.met_after) == (2, 2)
    assert [f.scenario for f in result.newly_met] == ["faster"]
    assert result.newly_met[0].missed == ()
    assert [f.scenario for f in result.newly_missed] == ["slower"]
    lost = result.newly_missed[0]
    assert (lost.old_makespan_s, lost.new_makespan_s) == (1050.0, 1100.0)
    assert any("1.05x fixed:20" in m for m in lost.missed)
    # the new file's own aimd row (99 s) is not the baseline: "same" still meets every target
    assert result.mean_makespan_ratio == pytest.approx(
        math.exp((math.log(1100 / 1050) + math.log(1150 / 1250) + 0.0) / 3)
    )
    assert (result.http_429_before, result.http_429_after) == (3, 6)
    assert result.highest_rate_429_after == pytest.approx(3 / 10_000)
    assert result.not_compared == ("new-only",)  # cannot be judged
    assert result.old_only == 1  # not run again: expected of a subset


def test_a_stalled_new_planner_is_newly_missed() -> None:
    result = compare(OLD, {"same": {"planner": row(None)}})
    assert [f.scenario for f in result.newly_missed] == ["same"]
    assert result.newly_missed[0].missed == ("planner stalled",)
    assert result.mean_makespan_ratio is None  # nothing both finished


def _write(path: Path, results: dict[str, dict[str, Any]]) -> Path:
    path.write_text(
        "".join(json.dumps({"scenario": n, "results": r}) + "\n" for n, r in results.items()),
        encoding="utf-8",
    )
    return path


def test_the_command_prints_the_verdicts_and_the_flips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = _write(tmp_path / "old.jsonl", OLD), _write(tmp_path / "new.jsonl", NEW)
    assert main(["bench", "compare", "--old", str(old), "--new", str(new)]) == 0
    out = capsys.readouterr().out
    assert "scenarios compared: 3" in out
    assert "meet every target: 2 -> 2" in out
    assert "newly met (1):\n  faster: 1,250.0 s -> 1,150.0 s\n" in out
    assert "newly missed (1):\n  slower: 1,050.0 s -> 1,100.0 s; planner 1100.0 s > 1.05x" in out
    assert "not compared (1: not in --old, or no planner row): new-only" in out
    assert "in --old only, not run again: 1" in out
    assert main(["bench", "compare", "--old", str(old), "--new", str(new), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["newly_missed"][0]["scenario"] == "slower"
    assert (report["met_before"], report["met_after"]) == (2, 2)


def test_a_bad_line_is_an_error_naming_the_file_and_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = _write(tmp_path / "new.jsonl", NEW)
    bad = tmp_path / "old.jsonl"
    bad.write_text(
        json.dumps({"scenario": "a", "results": {"planner": row(1.0)}})
        + "\nnot json\n"
        + json.dumps({"scenario": "b", "results": {"planner": {"makespan_s": 1.0}}})
        + "\n"
        + json.dumps({"scenario": "c", "results": {}, "extra": 1})
        + "\n"
        + json.dumps({"scenario": "d", "results": {"planner": {**row(1.0), "calls": "many"}}})
        + "\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        read_results([bad])
    assert info.value.source == str(bad)
    problems = info.value.problems
    assert problems[0].startswith("line 2: not JSON")
    assert problems[1] == (
        "line 3: b planner: ratio: Field required; calls: Field required; "
        "http_429: Field required; rate_429: Field required"
    )
    assert problems[2].startswith("line 4: extra:")
    assert problems[3] == "line 5: d planner: calls: Input should be a valid integer"
    assert main(["bench", "compare", "--old", str(bad), "--new", str(new)]) == 2
    err = capsys.readouterr().err
    assert f"error: {bad}: 4 problems" in err
    assert "Traceback" not in err
