"""A batch of planner runs in short (``sim.trace_summary``, ``evalfleet bench trace --count``):
each row read off its trace, judged against baseline rows by the benchmark's rule, the batch's
tally, and clear errors for options that do not go together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sim.scenario import parse_scenario
from sim.trace import trace_planner
from sim.trace_summary import NEAR_EMPTY_S, TraceRow, tally, trace_row
from tests.sim.sim_support import parametric, run_cli

_LONG = parametric(name="long", instances=120, provider={"rpm": 120, "input_tpm": 6_000_000})


def _baseline(makespan_s: float, http_429: int = 0, calls: int = 5_000) -> dict[str, Any]:
    return {
        "makespan_s": makespan_s,
        "ratio": 1.0,
        "calls": calls,
        "http_429": http_429,
        "rate_429": http_429 / calls,
    }


def test_a_row_is_read_off_its_trace() -> None:
    trace = trace_planner(parse_scenario(_LONG, "long"))
    row = trace_row(trace)
    queued, tail = trace.phases()
    last = trace.ends_on
    assert last is not None
    assert row.scenario == "long" and row.ratio == trace.result["ratio"]
    assert row.bound_by == "requests"
    assert (row.queued_lost_s, row.tail_lost_s) == (queued.lost_s, tail.lost_s)
    assert row.tail_s == pytest.approx(trace.result["makespan_s"] - tail.start_s)
    assert row.longer == last.longer
    assert row.launched_before_empty_s == pytest.approx(tail.start_s - last.launched_s)
    assert row.soonest_over_bound == pytest.approx(last.soonest_s / trace.result["lower_bound_s"])
    assert (row.paced_s, row.throttled_s) == (last.paced_s, last.throttled_s)
    assert row.missed is None  # not judged without baselines


def test_a_row_is_judged_by_the_benchmarks_rule_against_the_baselines() -> None:
    trace = trace_planner(parse_scenario(_LONG, "long"))
    ours = trace.result["makespan_s"]
    slower = {"fixed:40": _baseline(ours * 1.5), "aimd": _baseline(ours * 1.2, 900)}
    assert trace_row(trace, slower).missed == ()
    faster = {"fixed:40": _baseline(ours / 1.2)}
    (missed,) = trace_row(trace, faster).missed or ("",)
    assert "> 1.05x fixed:40" in missed


def _row(**given: Any) -> TraceRow:
    base: dict[str, Any] = {
        "scenario": "x",
        "ratio": 1.1,
        "http_429": 0,
        "bound_by": "requests",
        "queued_lost_s": 100.0,
        "tail_s": 900.0,
        "tail_lost_s": 300.0,
        "longer": 0,
        "launched_before_empty_s": 50.0,
        "soonest_over_bound": 0.9,
        "paced_s": 400.0,
        "throttled_s": 0.0,
    }
    return TraceRow(**{**base, **given})


def test_the_tally_counts_each_cause_once_and_skips_what_a_row_lacks() -> None:
    rows = [
        _row(),
        _row(queued_lost_s=500.0, longer=3, paced_s=100.0, throttled_s=30.0),
        _row(longer=7, launched_before_empty_s=NEAR_EMPTY_S + 1, soonest_over_bound=1.25),
        # a stalled run: no phases' loss, no last instance
        _row(
            ratio=None,
            queued_lost_s=None,
            tail_lost_s=None,
            longer=None,
            launched_before_empty_s=None,
            soonest_over_bound=None,
            paced_s=None,
            throttled_s=None,
        ),
    ]
    t = tally(rows)
    assert t.runs == 4
    assert t.tail_loses_more == 2  # the second row's queued phase lost more
    assert t.ends_on_longest == 1
    assert t.ends_on_top == 2  # 0 and 3 run longer: under five; 7 is not
    assert t.launched_near_empty == 2
    assert t.soonest_over_ratio == 1
    assert t.median_held_s == pytest.approx(400.0)  # of 400, 130 and 400
    assert tally([]).median_held_s is None and tally([]).runs == 0


def test_the_command_traces_a_batch_and_judges_it(tmp_path: Path) -> None:
    code, out = run_cli(["bench", "trace", "--random", "3", "--count", "2", "--json"])
    assert code == 0, out
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["scenario"] for line in lines[:2]] == ["random-3", "random-4"]
    assert lines[2]["tally"]["runs"] == 2 and lines[2]["judged"] == 0
    ours = lines[0]
    # random-3 judged against a baseline far faster than it: a miss; random-4 is not in the
    # file and goes unjudged
    base = tmp_path / "full.jsonl"
    base.write_text(
        json.dumps({"scenario": "random-3", "results": {"fixed:9": _baseline(10.0)}}) + "\n"
    )
    code, out = run_cli(
        ["bench", "trace", "--random", "3", "--count", "2", "--jobs", "2", "--baselines", str(base)]
    )
    assert code == 0, out
    text = out.splitlines()
    assert text[0].startswith("scenario") and "verdict" in text[0]
    assert text[2].startswith("random-3") and f"{ours['ratio']:.3f}" in text[2]
    assert "> 1.05x fixed:9" in text[2]
    assert text[3].startswith("random-4") and text[3].rstrip().endswith(
        f"{lines[1]['paced_s']:.0f}+{lines[1]['throttled_s']:.0f}"
    )
    assert any(line.startswith("all: 2 runs.") for line in text)
    assert "met every target: 0 of 1 judged (1 not in --baselines)" in text
    assert any(line.startswith("missed: 1 run. ") for line in text)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--count", "2"], "--count needs exactly one of --random SEED, --wide SEED"),
        (["--scenario", "s.yaml", "--count", "2"], "--count applies to --random SEED or --wide"),
        (["--random", "1", "--count", "2", "--every", "5"], "--every and --notes"),
        (["--random", "1", "--count", "2", "--notes"], "--every and --notes"),
        (["--random", "1", "--jobs", "2"], "--jobs and --baselines apply with --count only"),
        (["--random", "1", "--count", "1", "--baselines", "/nonexistent/f.jsonl"], "f.jsonl"),
        (["--random", "1", "--count", "0"], "--count"),
    ],
)
def test_bad_batch_options_are_a_clear_error(args: list[str], needle: str) -> None:
    code, out = run_cli(["bench", "trace", *args])
    assert code != 0
    assert needle in out
    assert "Traceback" not in out
