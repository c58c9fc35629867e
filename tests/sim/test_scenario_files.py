"""Scenario files: the shipped and outside ones are valid, and bad documents are clear errors
naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from evalfleet.errors import ConfigError
from sim.scenario import load_scenario, parse_scenario
from tests.sim.sim_support import ROOT, parametric


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_scenarios_are_valid(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.name == path.stem


@pytest.mark.parametrize(
    "path", sorted((ROOT / "scenarios" / "outside").glob("*.yaml")), ids=lambda p: p.stem
)
def test_scenarios_written_outside_the_generator_are_valid(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.name == path.stem and scenario.description


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"surprise": 1}, "surprise: unknown key"),
        ({"instances": 0}, "instances: must be greater than or equal to 1"),
        ({"harness": {"trace": "minisweagent-gemini3pro-verified"}}, "exactly one of"),
        ({"provider": {"rpm": None, "input_tpm": None}}, "at least one limit"),
        ({"provider": {"headers": "azure"}}, "provider.headers"),
        ({"provider": {"changes": [{"at_s": 60}]}}, "must set at least one"),
        ({"provider": {"changes": [{"at_s": 60, "output_tpm": 5}]}}, "no output_tpm limit"),
        ({"alias_config": {"calls_per_s": -1}}, "alias_config.calls_per_s"),
        ({"policies": ["fixed:0"]}, "policies"),
    ],
)
def test_bad_scenarios_are_clear_errors(change: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_scenario(parametric(**change), "s.yaml")
    assert problem in str(err.value)
    assert str(err.value).startswith("s.yaml")


def test_numbers_read_as_written_by_a_person_or_a_script(tmp_path: Path) -> None:
    # `2e6` is a float in YAML 1.2 and JSON (a string in YAML 1.1); 4000.0 is what a script
    # that computed a limit writes. Both are the whole numbers they say.
    data = parametric(provider={"rpm": 4000.0, "input_tpm": 2_000_000})
    text = yaml.safe_dump(data).replace("input_tpm: 2000000", "input_tpm: 2e6")
    assert "input_tpm: 2e6" in text
    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    scenario = load_scenario(path)
    assert scenario.provider.rpm == 4000 and isinstance(scenario.provider.rpm, int)
    assert scenario.provider.input_tpm == 2_000_000
    with pytest.raises(ConfigError) as err:
        parse_scenario(parametric(provider={"rpm": 4000.5}), "s.yaml")
    assert "provider.rpm: must be a whole number (got 4000.5)" in err.value.problems


def test_missing_required_keys_are_named() -> None:
    with pytest.raises(ConfigError) as err:
        parse_scenario({"name": "x"}, "s.yaml")
    for key in ("instances", "harness", "provider", "alias_config"):
        assert f"{key}: required" in err.value.problems
