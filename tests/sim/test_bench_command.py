"""The benchmark command: JSON per scenario, a target verdict under each table, random unseen
scenarios, scenario files at other seeds, the decision-speed figures, and clear errors for a bad
scenario or a call that can never fit a limit. Split from ``test_sim.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalfleet.errors import ConfigError
from sim.bench import run_scenario
from sim.scenario import parse_scenario
from sim.workload import build_workload
from tests.sim.sim_support import parametric, run_cli


def test_command_prints_json_per_scenario(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(parametric(instances=40)))
    code, out = run_cli(
        [
            "bench",
            "planner",
            "--scenario",
            str(path),
            "--policy",
            "planner",
            "--policy",
            "fixed:10",
            "--json",
        ]
    )
    assert code == 0
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["scenario"] == "t" and set(doc["results"]) == {"planner", "fixed:10"}
    assert {
        "makespan_s",
        "lower_bound_s",
        "ratio",
        "calls",
        "http_429",
        "rate_429",
        "utilisation",
        "peak_fleet",
        "ticks",
    } <= set(doc["results"]["planner"])


def test_command_refuses_a_bad_scenario_clearly(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\ninstances: many\n")
    code, out = run_cli(["bench", "planner", "--scenario", str(path)])
    assert code == 2
    assert "bad.yaml" in out and "instances" in out and "Traceback" not in out
    code, out = run_cli(["bench", "planner", "--scenario", str(path), "--policy", "greedy"])
    assert code == 2 and "greedy" in out


def test_decision_speed_command() -> None:
    code, out = run_cli(["bench", "planner", "--decision-speed", "--json"])
    assert code == 0
    figures = json.loads(out.strip().splitlines()[-1])["decision_speed"]
    assert figures["live_tasks"] == 10_000 and figures["median_ms"] > 0


def test_command_prints_a_target_verdict_under_each_table(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(parametric(instances=40)))
    # fixed:1 is so slow that the planner beats it; a planner-only run has nothing to lose to
    code, out = run_cli(
        ["bench", "planner", "--scenario", str(path), "--policy", "planner", "--policy", "fixed:1"]
    )
    assert code == 0
    verdicts = [line for line in out.splitlines() if line.strip().startswith("targets:")]
    assert len(verdicts) == 1
    assert out.strip().splitlines()[-1] in {
        "planner met every target on 1 of 1 scenarios",
        "planner met every target on 0 of 1 scenarios",
    }
    assert ("all met" in verdicts[0]) == out.strip().endswith("on 1 of 1 scenarios")


def test_command_runs_random_unseen_scenarios() -> None:
    code, out = run_cli(["bench", "planner", "--random", "1", "--random-from", "3", "--json"])
    assert code == 0
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["scenario"] == "random-3"
    assert {"planner", "aimd"} <= set(doc["results"])


def test_command_runs_scenario_files_at_other_seeds(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(parametric(instances=30)))
    args = ["bench", "planner", "--scenario", str(path), "--policy", "fixed:4", "--json"]
    code, out = run_cli([*args, "--seed", "5", "--seed", "6"])
    assert code == 0
    docs = [json.loads(line) for line in out.strip().splitlines()]
    name = parametric()["name"]
    assert [d["scenario"] for d in docs] == [f"{name}@5", f"{name}@6"]
    makespans = [d["results"]["fixed:4"]["makespan_s"] for d in docs]
    assert makespans[0] != makespans[1]  # other instances, not the same run twice
    code, again = run_cli([*args, "--seed", "5"])
    assert json.loads(again.strip().splitlines()[-1]) == docs[0]  # a seed is reproducible


def test_a_call_that_can_never_fit_a_limit_is_a_clear_error(tmp_path: Path) -> None:
    """A provider whose per-minute output limit is below one call's output answers that call
    "request too large" forever and every policy stalls: the benchmark refuses the scenario,
    naming the limit, instead of simulating a livelock."""
    doc = parametric(provider={"output_tpm": 500})
    scenario = parse_scenario(doc, "s")
    with pytest.raises(ConfigError, match=r"provider\.output_tpm \(500 per minute"):
        run_scenario(scenario)
    path = tmp_path / "tight.json"
    path.write_text(json.dumps(doc))
    code, out = run_cli(["bench", "planner", "--scenario", str(path)])
    assert code == 2
    assert "output_tpm" in out and "never be admitted" in out and "Traceback" not in out
    # with room for its largest call the same scenario runs
    assert run_scenario(parse_scenario(parametric(provider={"output_tpm": 60_000}), "s")).results


def test_random_scenarios_leave_room_for_their_largest_call() -> None:
    from sim.generate import random_scenario
    from sim.metrics import calls_that_never_fit

    for seed in (74, *range(8)):  # 74: the trace's 65,536-token output once exceeded its limit
        scenario = random_scenario(seed)
        assert calls_that_never_fit(scenario, build_workload(scenario)) == []


def test_command_runs_wide_unseen_scenarios() -> None:
    code, out = run_cli(
        ["bench", "planner", "--wide", "1", "--random-from", "2", "--policy", "planner", "--json"]
    )
    assert code == 0
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["scenario"] == "wide-2" and set(doc["results"]) == {"planner"}


def test_wide_scenarios_cover_what_the_narrow_generator_never_draws() -> None:
    """``sim.generate_wide`` draws regions ``sim.generate`` does not: seeds off by more than
    1.4x, raised limits, two binding limits, wrong cache beliefs, no output seed, run caps.
    Each scenario stays limit-bound and leaves room for its largest call."""
    from sim.generate_wide import wide_scenario
    from sim.metrics import calls_that_never_fit, lower_bound

    scenarios = [wide_scenario(seed) for seed in range(24)]
    assert wide_scenario(5) == wide_scenario(5)
    raised = wrong_belief = no_output_seed = run_cap = far_off = 0
    for sc in scenarios:
        workload = build_workload(sc)
        assert calls_that_never_fit(sc, workload) == [], sc.name
        assert lower_bound(sc, workload).seconds >= 3.4 * float(workload.durations().max())
        limits = [sc.provider.tpm, sc.provider.input_tpm, sc.provider.output_tpm, sc.provider.rpm]
        raised += any(
            (getattr(c, f) or 0) > (v or 0)
            for c in sc.provider.changes
            for f, v in zip(("tpm", "input_tpm", "output_tpm", "rpm"), limits, strict=True)
        )
        wrong_belief += sc.alias_config.cached_input_counts != sc.provider.cached_input_counts
        no_output_seed += sc.alias_config.output_tokens_per_s is None
        run_cap += sc.caps.run is not None
        far_off += not 0.6 <= sc.alias_config.calls_per_s * 60.0 / (sc.provider.rpm or 1) <= 1.4
    assert min(raised, wrong_belief, no_output_seed, run_cap, far_off) >= 1
    assert {s.provider.headers for s in scenarios} == {"anthropic", "openai", "none"}


def test_jobs_give_the_same_tables_in_the_same_order(tmp_path: Path) -> None:
    """``--jobs 2`` simulates the scenarios in two processes: the simulator is deterministic,
    so every table is what one process prints, in the order the scenarios were given."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps(parametric(instances=30)))
    args = ["bench", "planner", "--scenario", str(path), "--policy", "planner"]
    args += ["--policy", "fixed:4", "--seed", "7", "--seed", "5", "--seed", "6"]
    code, serial = run_cli([*args, "--json"])
    assert code == 0
    code, parallel = run_cli([*args, "--json", "--jobs", "2"])
    assert code == 0
    assert parallel == serial
    name = parametric()["name"]
    docs = [json.loads(line) for line in parallel.strip().splitlines()]
    assert [d["scenario"] for d in docs] == [f"{name}@7", f"{name}@5", f"{name}@6"]
    code, table = run_cli([*args, "--jobs", "3"])
    assert code == 0
    verdicts = [line for line in table.splitlines() if line.strip().startswith("targets:")]
    assert len(verdicts) == 3
    assert table.strip().splitlines()[-1].endswith("of 3 scenarios")


def test_jobs_report_a_scenario_that_can_never_fit_clearly(tmp_path: Path) -> None:
    """A scenario no policy can run, simulated in a worker process, is the same clear error as
    in one process (a ConfigError does not survive pickle: the worker sends its parts)."""
    good = tmp_path / "good.json"
    good.write_text(json.dumps(parametric(instances=30)))
    tight = tmp_path / "tight.json"
    tight.write_text(json.dumps(parametric(provider={"output_tpm": 500})))
    args = ["bench", "planner", "--scenario", str(good), "--scenario", str(tight)]
    code, out = run_cli([*args, "--policy", "fixed:4", "--jobs", "2", "--json"])
    assert code == 2
    assert "output_tpm" in out and "never be admitted" in out and "Traceback" not in out
    assert json.loads(out.splitlines()[0])["scenario"] == parametric()["name"]


def test_jobs_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(parametric(instances=30)))
    code, out = run_cli(["bench", "planner", "--scenario", str(path), "--jobs", "0"])
    assert code == 2 and "--jobs" in out and "Traceback" not in out
