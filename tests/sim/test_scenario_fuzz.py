"""The benchmark on scenario documents drawn anywhere within the public format's bounds.

The generators (``sim.generate``, ``sim.generate_wide``) draw realistic regions; a scenario
someone writes by hand can sit anywhere the format allows: one instance, a cap of 1, seeds
orders of magnitude off, several limit changes, calls that take longer than the planner's
look-backs. Whatever the document, the benchmark either refuses it with a ConfigError that
names the problem (a call that can never fit a limit) or runs every policy to a row; and the
planner launches work while work is queued. Two faults were found this way: a call answered
after longer than the drained-rate look-back emptied a deque into an IndexError (wide-1213),
and a seed below one task's demand sized a fleet of 0 that never launched anything.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from evalfleet.errors import ConfigError
from sim.bench import run_scenario
from sim.scenario import parse_scenario
from sim.workload import build_workload

pytestmark = pytest.mark.slow

FUZZ = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_LIMIT_RANGES = {
    "rpm": (5, 5_000),
    "tpm": (2_000, 5_000_000),
    "input_tpm": (2_000, 5_000_000),
    "output_tpm": (500, 1_000_000),
}


def _log_uniform(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(min_value=0.0, max_value=1.0).map(lambda u: low * (high / low) ** u)


@st.composite
def _spread(draw: st.DrawFn, low: float, high: float, whole: bool = False) -> dict[str, float]:
    median = draw(_log_uniform(low, high))
    p90 = median * draw(st.sampled_from([1.0, 1.5, 3.0, 6.0]))
    if whole:
        median, p90 = float(max(1, round(median))), float(max(1, round(p90)))
        p90 = max(p90, median)
    return {"median": median, "p90": p90}


@st.composite
def _harness(draw: st.DrawFn) -> dict[str, Any]:
    harness: dict[str, Any]
    if draw(st.booleans()) and draw(st.booleans()):
        harness = {"trace": "minisweagent-gemini3pro-verified"}
    else:
        harness = {
            "parametric": {
                "calls": draw(_spread(1, 15, whole=True)),
                "first_input_tokens": draw(st.integers(1, 40_000)),
                "input_growth_per_call": draw(st.sampled_from([0, 300, 2_000])),
                "output_tokens": draw(_spread(1, 3_000, whole=True)),
                "cached_share": draw(st.sampled_from([0.0, 0.5, 0.9, 1.0])),
                "gap_s": draw(_spread(0.01, 30)),
            }
        }
    if draw(st.booleans()):
        harness["latency_s"] = {
            "base": draw(st.sampled_from([0.0, 1.0, 30.0, 600.0])),
            "per_output_token": draw(st.sampled_from([0.0, 0.01, 0.05])),
        }
    low = draw(st.sampled_from([0.0, 5.0, 60.0]))
    harness["boot_s"] = {"min": low, "max": low + draw(st.sampled_from([0.0, 30.0]))}
    return harness


@st.composite
def _provider(draw: st.DrawFn) -> dict[str, Any]:
    fields = draw(
        st.lists(st.sampled_from(sorted(_LIMIT_RANGES)), min_size=1, max_size=3, unique=True)
    )
    if "tpm" in fields and "input_tpm" in fields:
        fields.remove(draw(st.sampled_from(["tpm", "input_tpm"])))
    provider: dict[str, Any] = {f: round(draw(_log_uniform(*_LIMIT_RANGES[f]))) for f in fields}
    provider["cached_input_counts"] = draw(st.booleans())
    provider["headers"] = draw(st.sampled_from(["anthropic", "openai", "none"]))
    changes, at_s = [], 0.0
    for _ in range(draw(st.integers(0, 2))):
        at_s += draw(st.sampled_from([0.0, 60.0, 900.0]))
        field = draw(st.sampled_from(fields))
        factor = draw(st.sampled_from([0.3, 0.6, 2.0]))
        changes.append({"at_s": at_s, field: max(1, round(provider[field] * factor))})
    if changes:
        provider["changes"] = changes
    return provider


@st.composite
def scenario_documents(draw: st.DrawFn) -> dict[str, Any]:
    alias: dict[str, Any] = {
        "calls_per_s": draw(_log_uniform(0.01, 100)),
        "tokens_per_s": draw(_log_uniform(10, 100_000)),
        "inflight_tokens": draw(_log_uniform(1_000, 10_000_000)),
        "cached_input_counts": draw(st.booleans()),
        "seeded_hours_ago": draw(st.sampled_from([0, 1, 7, 100])),
    }
    if draw(st.booleans()):
        alias["output_tokens_per_s"] = draw(_log_uniform(1, 10_000))
    caps = {
        "static": draw(st.sampled_from([None, 1, 2, 50, 1000])),
        "run": draw(st.sampled_from([None, None, 1, 7])),
    }
    return {
        "name": "fuzzed",
        "seed": draw(st.integers(0, 1_000)),
        "instances": draw(st.integers(1, 6)),
        "harness": draw(_harness()),
        "provider": draw(_provider()),
        "alias_config": alias,
        "caps": caps,
    }


def _document(harness: dict[str, Any], provider: dict[str, Any], **alias: Any) -> dict[str, Any]:
    seeds = {"calls_per_s": 8.0, "tokens_per_s": 8000.0, "inflight_tokens": 2e6, **alias}
    return {
        "name": "found",
        "instances": 2,
        "harness": harness,
        "provider": provider,
        "alias_config": seeds,
    }


def _parametric(calls: float, output: float, gap_s: float) -> dict[str, Any]:
    return {
        "calls": {"median": calls, "p90": calls},
        "first_input_tokens": 500,
        "output_tokens": {"median": output, "p90": output},
        "gap_s": {"median": gap_s, "p90": gap_s},
    }


# found by drawing documents like these: an output seed below one task's demand sized a fleet
# of 0 (nothing launched, no answer to correct the seed); tasks of no duration were refused by
# the curve fit as a bad table; a call answered after more than the drained-rate look-back
# emptied a deque (IndexError)
FOUND = [
    _document(
        {"trace": "minisweagent-gemini3pro-verified"},
        {"tpm": 188_767, "headers": "openai"},
        output_tokens_per_s=8.8,
    ),
    _document(
        {
            "parametric": _parametric(1, 1, 0.01),
            "latency_s": {"base": 0.0, "per_output_token": 0.0},
            "boot_s": {"min": 0.0, "max": 0.0},
        },
        {"input_tpm": 2_000, "headers": "anthropic"},
    ),
    _document(
        {
            "parametric": _parametric(3, 300, 3.0),
            "latency_s": {"base": 600.0, "per_output_token": 1.0},
            "boot_s": {"min": 1.0, "max": 2.0},
        },
        {"rpm": 600, "input_tpm": 600_000, "headers": "anthropic"},
    ),
]


@FUZZ
@given(document=scenario_documents())
@example(document=FOUND[0])
@example(document=FOUND[1])
@example(document=FOUND[2])
def test_any_valid_scenario_is_run_by_every_policy_or_refused_by_name(
    document: dict[str, Any],
) -> None:
    scenario = parse_scenario(document, "fuzzed")
    workload = build_workload(scenario)
    try:
        results = run_scenario(scenario).results
    except ConfigError as exc:
        assert "can never be admitted" in str(exc), exc
        return
    assert set(results) >= {"planner", "aimd"}
    planner = results["planner"]
    # work was queued: the planner launched some and its calls were sent
    assert planner["peak_fleet"] >= 1, (document, planner)
    assert planner["calls"] >= 1, (document, planner)
    finished = [name for name, row in results.items() if row["makespan_s"] is not None]
    for name in finished:
        # every call was sent and answered (retries are counted too)
        assert results[name]["calls"] >= len(workload.latency), (name, results[name])
