"""``evalfleet bench tally`` and ``sim.tally``: a batch of results summed up by the benchmark's
own targets (``sim.targets``), by header style, by the limit that binds, by the operator's
cache belief and by the binding class's seed over its limit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evalfleet.cli import main
from evalfleet.commands.bench_planner import SCENARIO_DIR
from sim.generate import random_scenario
from sim.generate_wide import wide_scenario
from sim.scenario import load_scenario
from sim.tally import (
    UNKNOWN,
    Group,
    ScenarioTraits,
    seed_bucket,
    tally,
    traits_by_name,
)
from tests.sim.sim_support import result_row as row

RESULTS = {
    # met: 5% faster than fixed:20, no 429s
    "a-met": {"planner": row(1000.0, timeouts=3), "fixed:20": row(1100.0)},
    # missed: 10% slower than fixed:20
    "b-slow": {"planner": row(1100.0, binding="output_tokens"), "fixed:20": row(1000.0)},
    # missed: rate_429 0.006 > 0.005 (and not 5% faster than aimd, with more than a tenth of
    # its 429s)
    "c-storm": {
        "planner": row(1000.0, http_429=60, binding="output_tokens", timeouts=1),
        "aimd": row(1020.0, http_429=90),
    },
    # met, its header style unknown and no binding limit in its row
    "d-odd": {"planner": row(1050.0, binding=None), "aimd": row(1500.0, http_429=900)},
    # no planner row: not judged
    "e-baselines": {"fixed:20": row(1000.0)},
}
HEADERS = {"a-met": "none", "b-slow": "none", "c-storm": "anthropic"}
TRAITS = {
    "a-met": ScenarioTraits("none", belief_right=True, seed_ratios={"requests": 0.4}),
    "b-slow": ScenarioTraits("none", belief_right=False, seed_ratios={"output_tokens": None}),
    "c-storm": ScenarioTraits("anthropic", seed_ratios={"output_tokens": 1.5}),
}


def _headers_only(name: str) -> ScenarioTraits | None:
    headers = HEADERS.get(name)
    return ScenarioTraits(headers) if headers is not None else None


def test_a_batch_is_counted_by_headers_and_by_binding_limit() -> None:
    result = tally(RESULTS, _headers_only)
    assert (result.met, result.judged) == (2, 4)
    assert result.by_headers == {
        "anthropic": Group(met=0, total=1),
        "none": Group(met=1, total=2),
        UNKNOWN: Group(met=1, total=1),
    }
    assert result.by_binding_limit == {
        "output_tokens": Group(met=0, total=2),
        "requests": Group(met=1, total=1),
        UNKNOWN: Group(met=1, total=1),
    }
    assert result.by_headers_and_binding == {
        "anthropic, output_tokens": Group(met=0, total=1),
        "none, output_tokens": Group(met=0, total=1),
        "none, requests": Group(met=1, total=1),
        f"{UNKNOWN}, {UNKNOWN}": Group(met=1, total=1),
    }
    assert (result.highest_rate_429, result.highest_rate_429_scenario) == (0.006, "c-storm")
    assert (result.timeouts, result.runs_with_timeouts) == (4, 2)
    assert [m.scenario for m in result.misses] == ["b-slow", "c-storm"]
    slow, storm = result.misses
    assert (slow.headers, slow.binding_limit) == ("none", "output_tokens")
    assert slow.missed == ("planner 1100.0 s > 1.05x fixed:20 1000.0 s",)
    assert storm.headers == "anthropic"
    assert storm.missed[0] == "planner rate_429 0.006 > 0.005"
    assert len(storm.missed) == 2  # and the 429s against aimd
    assert result.not_judged == ("e-baselines",)
    assert result.without_baselines == ()


def test_a_planner_row_alone_is_judged_and_named_as_without_baselines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `bench planner --policy planner`: only the ratio and rate_429 can be judged
    alone = {"random-7754": {"planner": row(1100.0)}, "wide-5283": {"planner": row(1300.0)}}
    result = tally(alone, lambda _: ScenarioTraits("none"))
    assert (result.met, result.judged) == (1, 2)
    assert result.without_baselines == ("random-7754", "wide-5283")
    assert result.misses[0].missed == ("planner ratio 1.3 > 1.20",)
    path = _write(tmp_path / "planner-only.jsonl", alone)
    assert main(["bench", "tally", str(path)]) == 0
    out = capsys.readouterr().out
    assert "judged on ratio and rate_429 alone (2: no baseline rows;" in out


def test_a_batch_without_429s_names_no_scenario_for_the_highest_rate() -> None:
    result = tally({"a-met": RESULTS["a-met"]}, lambda _: None)
    assert (result.highest_rate_429, result.highest_rate_429_scenario) == (0.0, None)
    assert result.misses == ()


def test_a_batch_is_counted_by_cache_belief_and_by_the_binding_class_seed() -> None:
    result = tally(RESULTS, TRAITS.get)
    assert result.by_headers_and_belief == {
        "anthropic, belief unknown": Group(met=0, total=1),
        "none, belief right": Group(met=1, total=1),
        "none, belief wrong": Group(met=0, total=1),
        f"{UNKNOWN}, belief unknown": Group(met=1, total=1),
    }
    assert result.by_headers_and_seed == {
        # the binding class's seed: a-met binds on requests (0.4x), b-slow on an output
        # limit its alias does not budget, c-storm on an output limit seeded at 1.5x
        "anthropic, output_tokens, seed 1.5x+": Group(met=0, total=1),
        "none, output_tokens, no seed": Group(met=0, total=1),
        "none, requests, seed 0-0.5x": Group(met=1, total=1),
        f"{UNKNOWN}, {UNKNOWN}, {UNKNOWN}": Group(met=1, total=1),
    }
    assert result.as_json()["by_headers_and_belief"]["none, belief wrong"] == {
        "met": 0,
        "total": 1,
    }


@pytest.mark.parametrize(
    ("ratio", "bucket"),
    [
        (None, "no seed"),
        (0.0, "seed 0-0.5x"),
        (0.4999, "seed 0-0.5x"),
        (0.5, "seed 0.5-1x"),
        (1.0, "seed 1-1.5x"),
        (1.4999, "seed 1-1.5x"),
        (1.5, "seed 1.5x+"),
        (30.0, "seed 1.5x+"),
    ],
)
def test_seed_buckets_split_at_half_one_and_one_and_a_half(
    ratio: float | None, bucket: str
) -> None:
    assert seed_bucket(ratio) == bucket


def test_traits_are_the_scenarios_belief_and_seeds_over_its_limits() -> None:
    lookup = traits_by_name(SCENARIO_DIR)
    wide = wide_scenario(5562)  # a request seed 1.5x its limit, a wrong belief
    traits = lookup("wide-5562")
    assert traits is not None
    assert traits.headers == wide.provider.headers == "none"
    assert traits.belief_right is False
    assert wide.provider.rpm is not None and wide.provider.tpm is not None
    assert traits.seed_ratios["requests"] == pytest.approx(
        wide.alias_config.calls_per_s * 60 / wide.provider.rpm
    )
    assert traits.seed_ratios["requests"] == pytest.approx(1.506, abs=0.001)
    assert traits.seed_ratios["tokens"] == pytest.approx(
        wide.alias_config.tokens_per_s * 60 / wide.provider.tpm
    )
    # no output seed in its alias config; no input limit at its provider
    assert traits.seed_ratios["output_tokens"] is None
    assert traits.seed_ratios["input_tokens"] is None
    shipped = load_scenario(SCENARIO_DIR / "trace-cache-belief-wrong.yaml")
    belief = lookup("trace-cache-belief-wrong@7")
    assert belief is not None and belief.belief_right is False
    assert shipped.alias_config.cached_input_counts != shipped.provider.cached_input_counts
    right = lookup("trace-booting")
    assert right is not None and right.belief_right is True
    # the generators draw both beliefs: the lookup is not one constant
    drawn = {t.belief_right for seed in range(5296, 5340) if (t := lookup(f"wide-{seed}"))}
    assert drawn == {True, False}
    assert lookup("no-such-scenario") is None


def test_header_styles_are_found_from_the_scenario_names(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("name: broken\ninstances: -1\n", encoding="utf-8")
    traits = traits_by_name(SCENARIO_DIR)

    def lookup(name: str) -> str | None:
        found = traits(name)
        return found.headers if found is not None else None

    assert lookup("random-7754") == random_scenario(7754).provider.headers
    assert lookup("wide-5283") == wide_scenario(5283).provider.headers
    # the generators draw every style: the lookup is not one constant
    assert {lookup(f"wide-{seed}") for seed in range(5224, 5236)} == {"anthropic", "openai", "none"}
    assert lookup("trace-booting") == "anthropic"
    assert lookup("trace-booting@101") == "anthropic"  # a seed moves instances, not the provider
    assert lookup("parametric-seed-high-no-headers") == "none"
    assert lookup("no-such-scenario") is None
    assert lookup("random-x") is None
    assert traits_by_name(tmp_path)("broken") is None


def _write(path: Path, results: dict[str, dict[str, Any]]) -> Path:
    path.write_text(
        "".join(json.dumps({"scenario": n, "results": r}) + "\n" for n, r in results.items()),
        encoding="utf-8",
    )
    return path


def test_the_command_prints_the_tally(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # names the lookup resolves: two generated scenarios and a shipped file
    first = _write(
        tmp_path / "one.jsonl",
        {"random-7754": RESULTS["a-met"], "wide-5283": RESULTS["b-slow"]},
    )
    # a later file's scenario replaces an earlier one's
    second = _write(
        tmp_path / "two.jsonl",
        {"trace-booting": RESULTS["c-storm"], "random-7754": RESULTS["b-slow"]},
    )
    assert main(["bench", "tally", str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("meet every target: 0 of 3 scenarios\n")
    assert (
        "by the provider's rate-limit headers:\n  anthropic  0 of 1\n  none       0 of 2\n" in out
    )
    assert "by the limit that binds the planner's run:\n  output_tokens  0 of 3\n" in out
    assert (
        "by both:\n  anthropic, output_tokens  0 of 1\n  none, output_tokens       0 of 2\n" in out
    )
    assert "by the operator's cache belief:\n" in out
    assert "by the binding class's seed over its limit at the start:\n" in out
    assert "highest rate_429: 0.006 (trace-booting)\n" in out
    assert "instances past their timeout: 1 in 1 runs\n" in out
    assert "misses (3):\n  random-7754 [none, output_tokens]: planner 1100.0 s > 1.05x" in out
    assert main(["bench", "tally", str(first), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["met"], report["judged"]) == (1, 2)
    assert report["by_headers"] == {"none": {"met": 1, "total": 2}}
    assert report["misses"][0]["scenario"] == "wide-5283"


def test_a_bad_file_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "batch.jsonl"
    bad.write_text('{"scenario": "a", "results": {}}\nnot json\n', encoding="utf-8")
    assert main(["bench", "tally", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"error: {bad}: 1 problem" in err
    assert "line 2: not JSON" in err
    assert "Traceback" not in err
