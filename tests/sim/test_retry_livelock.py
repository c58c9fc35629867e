"""Clients retrying into a request bucket their rejections keep empty: the planner finishes.

Providers count rejected requests against the request limit (OpenAI documents it). A few tasks
retrying every 15 s then keep a bucket of a few requests a minute empty, every call is rejected
for good, and only the first 429 of each call reached the controller: with a request budget
far above the limit and no new first 429s, nothing cut it down (documents drawn by the scenario
fuzzing; before, the planner stalled on both, as the baselines still do on the first). A window
in which the provider answered nothing and only retries drew 429s now counts one 429 per type
(``planner.retry_evidence``)."""

from __future__ import annotations

from typing import Any

import pytest

from sim.bench import run_scenario
from sim.scenario import parse_scenario

pytestmark = pytest.mark.slow

# a request limit of 5 a minute against a seed of 63 calls/s, no headers, 44 instances
RPM_5: dict[str, Any] = {
    "name": "fuzz-18",
    "seed": 521,
    "instances": 44,
    "harness": {
        "parametric": {
            "calls": {"median": 5.0, "p90": 15.0},
            "first_input_tokens": 14488,
            "input_growth_per_call": 2000,
            "output_tokens": {"median": 1.0, "p90": 6.0},
            "cached_share": 1.0,
            "gap_s": {"median": 1.6521973815147355, "p90": 2.4782960722721032},
        },
        "latency_s": {"base": 1.0, "per_output_token": 0.05},
        "boot_s": {"min": 0.0, "max": 30.0},
    },
    "provider": {
        "output_tpm": 500,
        "input_tpm": 3406732,
        "rpm": 5,
        "cached_input_counts": False,
        "headers": "none",
        "changes": [{"at_s": 60.0, "input_tpm": 6813464}, {"at_s": 120.0, "input_tpm": 6813464}],
    },
    "alias_config": {
        "calls_per_s": 63.14572342334196,
        "tokens_per_s": 3220.810985843786,
        "inflight_tokens": 6975.53903074113,
        "cached_input_counts": True,
        "seeded_hours_ago": 0,
    },
    "caps": {"static": 50, "run": None},
}

# a request limit that drops to 1 a minute (fuzz-251 in docs/bench-planner.md)
RPM_1: dict[str, Any] = {
    "name": "fuzz-251",
    "seed": 251,
    "instances": 57,
    "harness": {
        "parametric": {
            "calls": {"median": 1, "p90": 1},
            "first_input_tokens": 500,
            "input_growth_per_call": 0,
            "output_tokens": {"median": 3365, "p90": 5421},
            "cached_share": 0.0,
            "gap_s": {"median": 0.01, "p90": 0.0222},
        },
        "latency_s": {"base": 17.9, "per_output_token": 0.0},
    },
    "provider": {
        "rpm": 5,
        "input_tpm": 319172,
        "output_tpm": 216348,
        "cached_input_counts": False,
        "headers": "none",
        "changes": [
            {"at_s": 1822.0, "rpm": 10},
            {"at_s": 2909.0, "rpm": 1},
            {"at_s": 2913.0, "output_tpm": 535038},
        ],
    },
    "alias_config": {
        "calls_per_s": 1.213,
        "tokens_per_s": 2340.0,
        "inflight_tokens": 7316.0,
        "cached_input_counts": True,
        "seeded_hours_ago": 7,
        "output_tokens_per_s": 2011.0,
    },
    "caps": {"static": 1, "run": 178},
}


def test_a_seed_far_above_a_request_limit_that_retries_keep_empty_finishes() -> None:
    results = run_scenario(parse_scenario(RPM_5, "rpm-5"), ["planner", "aimd", "fixed:2"]).results

    planner = results["planner"]
    assert planner["makespan_s"] is not None, planner
    assert planner["ratio"] <= 1.3, planner
    # the baselines, which have no pacer, livelock on it: the scenario is that hard
    assert results["aimd"]["makespan_s"] is None and results["fixed:2"]["makespan_s"] is None
    assert planner["http_429"] < 0.2 * results["aimd"]["http_429"]


def test_a_request_limit_dropping_to_one_a_minute_finishes() -> None:
    planner = run_scenario(parse_scenario(RPM_1, "rpm-1"), ["planner"]).results["planner"]

    assert planner["makespan_s"] is not None, planner
    assert planner["ratio"] <= 1.3, planner
