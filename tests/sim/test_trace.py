"""The planner's run traced tick by tick (``sim.trace``, ``evalfleet bench trace``): the same run
as the benchmark's, each 429 as the planner was told it and as it truly was, the provider's
limits as they change, the phases split where the queue empties, and clear errors for bad
input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.bench import make_policy, run_policy
from sim.engine import Simulation
from sim.limits import ProviderLimits
from sim.metrics import limit_spec, lower_bound
from sim.scenario import parse_scenario
from sim.trace import trace_planner
from sim.workload import build_workload
from tests.sim.sim_support import parametric, run_cli

# header-less, the operator's request seed 4x the provider's 2 calls/s: the planner is told
# only "unknown" and must find the limit by its 429s
_OVER_SEED = parametric(
    name="over-seed",
    instances=60,
    provider={"rpm": 120, "input_tpm": 6_000_000, "headers": "none"},
    alias_config={"calls_per_s": 8, "tokens_per_s": 80_000, "inflight_tokens": 2e6},
)


def test_the_trace_is_the_benchmarks_planner_run() -> None:
    scenario = parse_scenario(_OVER_SEED, "over-seed")
    trace = trace_planner(scenario)
    workload = build_workload(scenario)
    assert trace.result == run_policy(
        scenario, workload, "planner", lower_bound(scenario, workload)
    )
    assert len(trace.ticks) == trace.result["ticks"]
    told = sum(sum(k.seen.values()) for k in trace.ticks)
    hit = sum(sum(k.hit.values()) for k in trace.ticks)
    assert told == hit == trace.result["http_429"] > 0
    times = [k.t for k in trace.ticks]
    assert times == sorted(times) and times[1] - times[0] == pytest.approx(15.0)


def test_a_header_less_429_is_told_unknown_and_traced_to_the_limit_it_hit() -> None:
    trace = trace_planner(parse_scenario(_OVER_SEED, "over-seed"))
    throttled = [k for k in trace.ticks if k.seen]
    assert throttled
    for tick in throttled:
        assert set(tick.seen) == {"unknown"}
        assert set(tick.hit) == {"requests"}  # the token limit is 50x what the fleet draws
        assert tick.seen["unknown"] == tick.hit["requests"]
    first = throttled[0]
    assert "requests" in first.cut and first.notes  # the controller says what it did
    # the request budget ends near the provider's 2 calls/s, far under the seed of 8
    assert trace.ticks[-1].budgets["calls_per_s"] == pytest.approx(2.0, rel=0.5)
    assert all(k.limits["requests"] == pytest.approx(2.0) for k in trace.ticks)


def test_the_trace_follows_a_limit_that_changes_and_measures_its_use() -> None:
    doc = parametric(
        name="drop",
        instances=120,
        provider={
            "rpm": 600,
            "input_tpm": 300_000,
            "changes": [{"at_s": 600, "input_tpm": 150_000}],
        },
    )
    trace = trace_planner(parse_scenario(doc, "drop"))
    before = [k for k in trace.ticks if k.t < 600]
    after = [k for k in trace.ticks if k.t > 600]
    assert before and after
    assert [k.limits["input_tokens"] for k in before] == pytest.approx([5000.0] * len(before))
    assert [k.limits["input_tokens"] for k in after] == pytest.approx([2500.0] * len(after))
    assert "output_tokens" not in trace.ticks[0].limits  # the provider has no output limit
    # the binding limit is used while work is queued, and charged no more than it refills
    # over a window, the one-minute bucket's burst aside
    busy = [k.used["input_tokens"] for k in trace.ticks if k.queued > 0 and k.t > 120]
    assert max(busy) < 5.0 and sum(busy) / len(busy) > 0.8


def test_the_phases_split_where_the_queue_empties() -> None:
    doc = parametric(name="long", instances=300, provider={"rpm": 120, "input_tpm": 6_000_000})
    trace = trace_planner(parse_scenario(doc, "long"))
    queued, tail = trace.phases()
    emptied = next(k.t for k in trace.ticks if k.queued == 0)
    assert (queued.start_s, queued.end_s) == (0.0, emptied)
    assert (tail.start_s, tail.end_s) == (emptied, trace.result["makespan_s"])
    assert trace.bound_by == trace.binding_limit == "requests"
    assert queued.used is not None and tail.used is not None
    assert queued.used > tail.used  # the tail's last tasks cannot fill the limit alone
    # what the two left unused is what the run took over its lower bound (within the
    # one-minute bucket's start and the windows' granularity)
    assert queued.lost_s is not None and tail.lost_s is not None
    over = trace.result["makespan_s"] - trace.result["lower_bound_s"]
    assert queued.lost_s + tail.lost_s == pytest.approx(
        over, abs=0.05 * trace.result["lower_bound_s"]
    )


def test_a_run_no_limit_bounds_has_no_phase_loss() -> None:
    """Limits far above what 20 tasks draw: the longest instance sets the lower bound, and the
    limits' use says nothing of where the run lost time."""
    doc = parametric(
        name="roomy",
        instances=20,
        provider={"rpm": 100_000, "input_tpm": 600_000_000, "headers": "anthropic"},
    )
    trace = trace_planner(parse_scenario(doc, "roomy"))
    assert trace.bound_by == "longest_instance" and trace.binding_limit is None
    assert all(phase.used is None and phase.lost_s is None for phase in trace.phases())
    assert trace.result["binding_limit"] == "requests"  # the row names the tightest class


@pytest.mark.parametrize("policy", ["planner", "fixed:60"])
def test_each_instance_ends_its_unthrottled_duration_and_its_waits_after_its_launch(
    policy: str,
) -> None:
    """The simulator's per-instance accounting: what the pacer held and what 429s made wait
    is all that stands between an instance's launch plus its unthrottled duration and its
    end. The planner's gate holds calls; the fixed fleet has none and retries after 429s."""
    scenario = parse_scenario(_OVER_SEED, "over-seed")
    workload = build_workload(scenario)
    spec, changes = limit_spec(scenario)
    provider = ProviderLimits(spec, changes)
    stats = Simulation(
        workload, make_policy(policy, scenario, workload, provider), provider, "none"
    ).run()
    durations = workload.durations()
    for i in range(workload.n_instances):
        took = stats.finished_at[i] - stats.launched_at[i]
        waits = stats.paced_s[i] + stats.throttled_s[i]
        assert took == pytest.approx(durations[i] + waits, abs=1e-6), i
    assert max(stats.finished_at) == stats.makespan_s
    assert sum(stats.paced_s) == pytest.approx(stats.pacer_wait_s)
    if policy == "planner":
        assert stats.pacer_wait_s > 0
    else:
        assert stats.pacer_wait_s == 0 and stats.http_429 > 0
        # a header-less 429 is retried after the clients' default 15 s
        assert sum(stats.throttled_s) == pytest.approx(15.0 * stats.http_429)


def test_the_trace_names_the_instance_the_run_ends_on() -> None:
    # far-off limits: nothing holds an instance, and the run ends on the one whose launch
    # plus its duration is latest
    roomy = parametric(
        name="roomy",
        instances=20,
        provider={"rpm": 100_000, "input_tpm": 600_000_000, "headers": "anthropic"},
    )
    last = trace_planner(parse_scenario(roomy, "roomy")).ends_on
    assert last is not None
    assert last.paced_s == last.throttled_s == 0.0
    assert last.finished_s == pytest.approx(last.soonest_s)
    # the over-seed run holds its calls to the request limit: the pacer's hold is what the
    # run ended later than the instance's launch and duration allowed
    trace = trace_planner(parse_scenario(_OVER_SEED, "over-seed"))
    last = trace.ends_on
    assert last is not None
    assert last.finished_s == pytest.approx(trace.result["makespan_s"], abs=0.05)
    assert last.paced_s > 0
    assert last.finished_s == pytest.approx(last.soonest_s + last.paced_s + last.throttled_s)
    durations = build_workload(parse_scenario(_OVER_SEED, "over-seed")).durations()
    assert last.duration_s == pytest.approx(durations[last.instance])
    assert last.longer == int((durations > durations[last.instance]).sum())


def test_the_command_prints_the_ticks_and_json(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_OVER_SEED))
    code, out = run_cli(["bench", "trace", "--scenario", str(path), "--every", "1000", "--notes"])
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("over-seed (planner): makespan ")
    assert lines[1].lstrip().startswith("queued 0-")
    assert lines[2].lstrip().startswith("ends on instance ")
    assert "could end no sooner than" in lines[2] and "the pacer held it" in lines[2]
    assert "429s told -> hit" in lines[3]
    assert any("unknown:" in line and "-> requests:" in line for line in lines[4:])
    assert any(line.startswith("      requests: ") for line in lines)  # a controller note
    code, out = run_cli(["bench", "trace", "--scenario", str(path), "--seed", "5", "--json"])
    assert code == 0, out
    doc = json.loads(out)
    assert doc["scenario"] == "over-seed@5"
    assert [p["name"] for p in doc["phases"]] == ["queued", "tail"]
    assert len(doc["ticks"]) == doc["result"]["ticks"]
    assert doc["ends_on"]["finished_s"] == pytest.approx(doc["result"]["makespan_s"], abs=0.05)
    assert doc["ends_on"]["soonest_s"] <= doc["ends_on"]["finished_s"]
    assert {"t", "budgets", "limits", "used", "seen", "hit", "notes"} <= set(doc["ticks"][0])


def test_the_command_traces_a_generated_scenario_by_its_seed() -> None:
    code, out = run_cli(["bench", "trace", "--random", "3", "--every", "5000"])
    assert code == 0, out
    assert out.startswith("random-3 (planner): ")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "give exactly one of --scenario FILE, --random SEED, --wide SEED"),
        (["--random", "1", "--wide", "2"], "give exactly one of"),
        (["--random", "1", "--seed", "3"], "--seed applies to a --scenario file only"),
        (["--scenario", "/nonexistent/s.yaml"], "s.yaml"),
        (["--random", "1", "--every", "0"], "--every"),
    ],
)
def test_bad_input_is_a_clear_error(args: list[str], needle: str) -> None:
    code, out = run_cli(["bench", "trace", *args])
    assert code != 0
    assert needle in out
    assert "Traceback" not in out
