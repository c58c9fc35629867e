"""The run config: good files load (YAML = JSON), each bad fixture fails with exactly its defect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from evalfleet.documents import MAX_DOCUMENT_BYTES
from evalfleet.errors import ConfigError
from evalfleet.runconfig import MAX_INSTANCES, RunConfig

CONFIGS = Path(__file__).parent / "data" / "configs"
GOOD = CONFIGS / "good"
BAD = CONFIGS / "bad"

# One file per defect, otherwise valid: each must fail with exactly this one problem line
# (a trailing "…" means "starts with": the rest names an absolute path).
BAD_FILES: dict[str, str] = {
    # the document itself
    "malformed.yaml": "invalid YAML: line 8, column 9: did not find expected ',' or '}'",
    "malformed.json": "invalid JSON: line 7, column 1: Expecting property name enclosed in double quotes",
    "empty.yaml": "file is empty (expected a mapping of keys to values)",
    "empty.json": "file is empty (expected a mapping of keys to values)",
    "comments_only.yaml": "file is empty (expected a mapping of keys to values)",
    "top_level_list.yaml": "top level must be a mapping of keys to values, not a list",
    "top_level_list.json": "top level must be a mapping of keys to values, not a list",
    "top_level_scalar.yaml": "top level must be a mapping of keys to values, not a string",
    "duplicate_key.yaml": "invalid YAML: line 6, column 1: duplicate key 'alias' (first defined on line 5)",
    "duplicate_key.json": "invalid JSON: duplicate key 'name'",
    "yaml_alias.yaml": "evaluator: YAML aliases (*name) are not supported; write the value out",
    # unknown keys, at every depth
    "unknown_top_key.yaml": "parallelism: unknown key (not allowed here)",
    "unknown_key_caps.yaml": "caps.spend_eur: unknown key (not allowed here)",
    "unknown_key_harness.yaml": "harness.opts: unknown key (not allowed here)",
    "unknown_key_timeouts.yaml": "timeouts.eval_s: unknown key (not allowed here)",
    "unknown_key_instances_file.yaml": "instances.step: unknown key (not allowed here)",
    # required keys
    "missing_spend.yaml": "caps.spend_usd: required",
    "missing_name.yaml": "name: required",
    # wrong types, no coercion
    "string_spend.yaml": "caps.spend_usd: must be a valid number (got a string)",
    "string_tasks.json": "caps.tasks: must be a valid integer (got a string)",
    "string_max_attempts.yaml": "max_attempts: must be a valid integer (got a string)",
    "bool_max_attempts.yaml": "max_attempts: must be a valid integer (got a boolean)",
    "float_max_attempts.yaml": "max_attempts: must be a valid integer (got a number)",
    "string_priority.yaml": "priority: must be a valid number (got a string)",
    "list_harness.yaml": "harness: must be a mapping of keys to values (got a list)",
    "string_instances.yaml": "instances: must be a list of instance ids or a mapping "
    "{file, start, stop, match} (got a string)",
    "name_number.yaml": "name: must be a valid string (got an integer)",
    "number_instance_id.yaml": "instances[1]: must be a string (got an integer)",
    # zero / negative / NaN / infinite / huge numbers
    "zero_spend.yaml": "caps.spend_usd: must be greater than 0",
    "negative_spend.yaml": "caps.spend_usd: must be greater than 0",
    "nan_spend.yaml": "caps.spend_usd: must be a finite number (not NaN or infinity)",
    "inf_spend.yaml": "caps.spend_usd: must be a finite number (not NaN or infinity)",
    "nan_spend.json": "invalid JSON: NaN is not a valid JSON number",
    "inf_spend.json": "invalid JSON: number 1e999 is out of range",
    "huge_spend.yaml": "caps.spend_usd: must be less than or equal to 1000000",
    "huge_int_spend.yaml": "caps.spend_usd: number is too large",
    "zero_tasks.yaml": "caps.tasks: must be greater than or equal to 1",
    "huge_tasks.yaml": "caps.tasks: must be less than or equal to 100000",
    "negative_instance_s.yaml": "timeouts.instance_s: must be greater than 0",
    "inf_instance_s.yaml": "timeouts.instance_s: must be a finite number (not NaN or infinity)",
    "huge_instance_s.yaml": "timeouts.instance_s: must be less than or equal to 604800",
    "zero_max_attempts.yaml": "max_attempts: must be greater than or equal to 1",
    "huge_max_attempts.yaml": "max_attempts: must be less than or equal to 20",
    "zero_priority.yaml": "priority: must be greater than 0",
    "negative_priority.yaml": "priority: must be greater than 0",
    "nan_priority.yaml": "priority: must be a finite number (not NaN or infinity)",
    "huge_priority.yaml": "priority: must be less than or equal to 1000",
    # adapter options: free-form but JSON-compatible
    "nan_option.yaml": "harness.options.temperature: must be a finite number",
    "set_option.yaml": "harness.options.tools: must be JSON-compatible data (got set)",
    "date_option.yaml": "harness.options.since: must be JSON-compatible data (got date)",
    # instance ids
    "empty_instance_id.yaml": "instances[1]: instance id must not be empty",
    "duplicate_instance_id.yaml": "instances[2]: duplicate instance id 'astropy__astropy-12907' "
    "(first at instances[0])",
    "whitespace_instance_id.yaml": "instances[1]: instance id 'django django-11099' must not "
    "contain whitespace",
    "control_instance_id.yaml": "instances[1]: instance id must not contain control characters "
    "(U+0007)",
    "long_instance_id.yaml": "instances[1]: instance id must be at most 256 characters (got 300)",
    "no_instances.yaml": "instances: must list 1 to 100,000 instance ids (got 0)",
    # names
    "name_control_char.yaml": "name: must not contain control characters (found U+0001)",
    "name_tab.yaml": "name: must not contain control characters (found U+0009)",
    "name_slash.yaml": "name: must not contain a path separator ('/')",
    "name_backslash.yaml": "name: must not contain a path separator ('\\\\')",
    "name_dotdot.yaml": "name: must not be '..'",
    "name_too_long.yaml": "name: must be at most 64 characters (got 65)",
    "name_empty.yaml": "name: must not be empty",
    "alias_slash.yaml": "alias: must not contain a path separator ('/')",
    "harness_name_control.yaml": "harness.name: must not contain control characters (found U+0000)",
    # the instances file form
    "missing_instances_file.yaml": "instances.file: 'no-such-instances.txt' (…",
    "instances_file_is_folder.yaml": "instances.file: '../good/lists' (…",
    "instances_file_duplicates.yaml": "instances.file: 'instances_with_duplicates.txt': line 5: "
    "duplicate instance id 'django__django-11099' (first on line 3)",
    "instances_file_none_selected.yaml": "instances.file: '../good/instances.txt' selects no "
    "instance ids (5 in the file, 0 matching; start=0, stop=None)",
    "instances_file_stop_before_start.yaml": "instances.stop: must be >= start (3)",
    "instances_file_negative_start.yaml": "instances.start: must be greater than or equal to 0",
}


def _problems_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        RunConfig.from_file(path)
    assert info.value.source == str(path)
    return info.value.problems


def test_every_bad_fixture_is_listed() -> None:
    on_disk = {p.name for p in BAD.iterdir() if p.suffix in {".yaml", ".json"}}
    assert on_disk == set(BAD_FILES)


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_file_fails_with_exactly_its_defect(name: str) -> None:
    problems = _problems_of(BAD / name)
    expected = BAD_FILES[name]
    assert len(problems) == 1, problems
    if expected.endswith("…"):
        assert problems[0].startswith(expected[:-1]), problems
    else:
        assert problems[0] == expected


def test_missing_instances_file_names_where_it_looked() -> None:
    (problem,) = _problems_of(BAD / "missing_instances_file.yaml")
    assert str(BAD / "no-such-instances.txt") in problem
    assert problem.endswith("instances file does not exist")


def test_every_problem_is_reported_at_once() -> None:
    data = yaml.safe_load((GOOD / "full.yaml").read_text())
    data["name"] = "a/b"
    data["caps"] = {"spend_usd": -1, "tasks": "5"}
    data["instances"] = ["x", "x", ""]
    data["priority"] = float("inf")
    data["colour"] = "blue"
    with pytest.raises(ConfigError) as info:
        RunConfig.from_mapping(data, GOOD)
    assert info.value.problems == [
        "name: must not contain a path separator ('/')",
        "instances[1]: duplicate instance id 'x' (first at instances[0])",
        "instances[2]: instance id must not be empty",
        "caps.tasks: must be a valid integer (got a string)",
        "caps.spend_usd: must be greater than 0",
        "priority: must be a finite number (not NaN or infinity)",
        "colour: unknown key (not allowed here)",
    ]


# ----------------------------------------------------------------------------------------------
# Good files


def test_full_yaml_and_json_are_the_same_config() -> None:
    from_yaml = RunConfig.from_file(GOOD / "full.yaml")
    from_json = RunConfig.from_file(GOOD / "full.json")
    assert from_yaml == from_json
    assert from_yaml.content_hash == from_json.content_hash
    assert from_yaml.name == "verified-sonnet-nightly"
    assert from_yaml.harness.options == {"steps": 30, "tools": ["bash", "edit"], "seed": None}
    assert from_yaml.evaluator is not None and from_yaml.evaluator.name == "simulated"
    assert from_yaml.instances == (
        "astropy__astropy-12907",
        "django__django-11099",
        "sympy__sympy-20590",
    )
    assert from_yaml.caps.tasks == 200
    assert from_yaml.caps.spend_usd == 500.0
    assert from_yaml.caps.spend_micro_usd == 500_000_000
    assert from_yaml.timeouts.instance_s == 3600.0


def test_minimal_config_takes_the_defaults() -> None:
    config = RunConfig.from_file(GOOD / "minimal.yaml")
    assert config.evaluator is None
    assert config.caps.tasks is None
    assert config.max_attempts is None  # the deployment's default, filled in at launch
    assert config.priority == 1.0
    assert config.timeouts.instance_s == 3600.0
    assert config.harness.options == {}


def test_instances_file_selection() -> None:
    # match filters first, then start/stop slice the matching ids.
    config = RunConfig.from_file(GOOD / "file_form.yaml")
    assert config.instances == ("django__django-11099", "django__django-11133")


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        ({}, ["a__1", "b__2", "django__3", "django__4", "c__5"]),
        ({"start": 1, "stop": 3}, ["b__2", "django__3"]),
        ({"start": 3}, ["django__4", "c__5"]),
        ({"stop": 100}, ["a__1", "b__2", "django__3", "django__4", "c__5"]),
        ({"match": "django__*"}, ["django__3", "django__4"]),
        ({"match": "django__*", "start": 1}, ["django__4"]),
        ({"match": "?__[12]"}, ["a__1", "b__2"]),
        ({"match": "A__*"}, None),  # case-sensitive
        ({"start": 5}, None),
    ],
)
def test_instances_file_start_stop_match(
    tmp_path: Path, selection: dict[str, object], expected: list[str] | None
) -> None:
    (tmp_path / "ids.txt").write_text(
        "# header\n  a__1  \n\nb__2\n# django__0 is commented out\ndjango__3\ndjango__4\nc__5\n"
    )
    data = yaml.safe_load((GOOD / "minimal.yaml").read_text())
    data["instances"] = {"file": "ids.txt", **selection}
    if expected is None:
        with pytest.raises(ConfigError) as info:
            RunConfig.from_mapping(data, tmp_path)
        assert info.value.problems[0].startswith(
            "instances.file: 'ids.txt' selects no instance ids"
        )
    else:
        assert list(RunConfig.from_mapping(data, tmp_path).instances) == expected


def test_instances_file_is_relative_to_the_config_not_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A decoy with the same relative path in the cwd must not be used.
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "verified.txt").write_text("decoy__decoy-1\n")
    monkeypatch.chdir(tmp_path)
    config = RunConfig.from_file(GOOD / "file_form_subdir.yaml")
    assert "decoy__decoy-1" not in config.instances
    assert len(config.instances) == 5
    # ...and a relative config path works from anywhere.
    monkeypatch.chdir(GOOD.parent)
    assert RunConfig.from_file(Path("good") / "file_form_subdir.yaml") == config


def test_absolute_instances_path_needs_no_base_dir(tmp_path: Path) -> None:
    ids = tmp_path / "ids.txt"
    ids.write_text("a__1\nb__2\n")
    data = yaml.safe_load((GOOD / "minimal.yaml").read_text())
    data["instances"] = {"file": str(ids)}
    assert RunConfig.from_mapping(data, None).instances == ("a__1", "b__2")
    data["instances"] = {"file": "ids.txt"}
    with pytest.raises(ConfigError) as info:
        RunConfig.from_mapping(data, None)
    assert "needs the config file's folder" in info.value.problems[0]


def test_instances_file_bad_lines_are_reported_with_line_numbers(tmp_path: Path) -> None:
    (tmp_path / "ids.txt").write_text("a__1\nhas space\nb__2\na__1\n" + "x" * 300 + "\n")
    data = yaml.safe_load((GOOD / "minimal.yaml").read_text())
    data["instances"] = {"file": "ids.txt"}
    with pytest.raises(ConfigError) as info:
        RunConfig.from_mapping(data, tmp_path)
    (problem,) = info.value.problems
    assert "line 2: instance id 'has space' must not contain whitespace" in problem
    assert "line 4: duplicate instance id 'a__1' (first on line 1)" in problem
    assert "line 5: instance id must be at most 256 characters (got 300)" in problem


def test_confined_instances_file_stays_in_the_config_folder(tmp_path: Path) -> None:
    config_dir = tmp_path / "upload"
    config_dir.mkdir()
    (config_dir / "ids.txt").write_text("a__1\n")
    (tmp_path / "outside.txt").write_text("b__2\n")
    (config_dir / "link.txt").symlink_to(tmp_path / "outside.txt")
    data = yaml.safe_load((GOOD / "minimal.yaml").read_text())
    data["instances"] = {"file": "ids.txt"}
    assert RunConfig.from_mapping(data, config_dir, confine=True).instances == ("a__1",)
    for file, message in [
        ("../outside.txt", "must stay inside the config file's folder"),
        ("link.txt", "must stay inside the config file's folder"),
        (str(tmp_path / "outside.txt"), "must be a path relative to the config file's folder"),
    ]:
        data["instances"] = {"file": file}
        # Unconfined (a local user's own file): allowed.
        assert RunConfig.from_mapping(data, config_dir).instances == ("b__2",)
        with pytest.raises(ConfigError) as info:
            RunConfig.from_mapping(data, config_dir, confine=True)
        (problem,) = info.value.problems
        assert problem.startswith("instances.file: ") and problem.endswith(message)


def test_lines_with_control_characters_are_not_echoed(tmp_path: Path) -> None:
    # e.g. a config pointing at a process environment: NUL-separated secrets on one "line".
    (tmp_path / "environ").write_bytes(b"HOME=/root\x00API_KEY=sk-very-secret\x00\n")
    data = yaml.safe_load((GOOD / "minimal.yaml").read_text())
    data["instances"] = {"file": "environ"}
    with pytest.raises(ConfigError) as info:
        RunConfig.from_mapping(data, tmp_path)
    (problem,) = info.value.problems
    assert "line 1: instance id must not contain control characters (U+0000)" in problem
    assert "sk-very-secret" not in problem


def test_instance_count_bounds(tmp_path: Path) -> None:
    data = yaml.safe_load((GOOD / "minimal.yaml").read_text())
    ids = [f"repo__repo-{i}" for i in range(MAX_INSTANCES + 1)]
    data["instances"] = ids[:MAX_INSTANCES]
    assert len(RunConfig.from_mapping(data, None).instances) == MAX_INSTANCES
    data["instances"] = ids
    with pytest.raises(ConfigError) as info:
        RunConfig.from_mapping(data, None)
    assert info.value.problems == ["instances: at most 100,000 instance ids (got 100,001)"]
    # From a file: the count applies after selection.
    (tmp_path / "ids.txt").write_text("\n".join(ids) + "\n")
    data["instances"] = {"file": "ids.txt"}
    with pytest.raises(ConfigError) as info:
        RunConfig.from_mapping(data, tmp_path)
    assert info.value.problems == ["instances: must list 1 to 100,000 instance ids (got 100,001)"]
    data["instances"] = {"file": "ids.txt", "start": 1}
    assert len(RunConfig.from_mapping(data, tmp_path).instances) == MAX_INSTANCES


def test_file_over_one_megabyte_is_refused(tmp_path: Path) -> None:
    text = (GOOD / "full.yaml").read_text()
    path = tmp_path / "big.yaml"
    path.write_text(text + "# " + "x" * MAX_DOCUMENT_BYTES + "\n")
    problems = _problems_of(path)
    assert len(problems) == 1 and problems[0].startswith("file is too large")
    # The same config padded to just under the limit is fine.
    path.write_text(text + "# " + "x" * (MAX_DOCUMENT_BYTES - len(text.encode()) - 3) + "\n")
    assert path.stat().st_size == MAX_DOCUMENT_BYTES
    assert RunConfig.from_file(path) == RunConfig.from_file(GOOD / "full.yaml")


def test_options_are_bounded(tmp_path: Path) -> None:
    data = yaml.safe_load((GOOD / "minimal.yaml").read_text())
    data["harness"]["options"] = {"blob": "x" * 70_000}
    with pytest.raises(ConfigError) as info:
        RunConfig.from_mapping(data, None)
    assert info.value.problems[0].startswith("harness.options: options are too large")
    data["harness"]["options"] = {"n": 2**60}
    with pytest.raises(ConfigError) as info:
        RunConfig.from_mapping(data, None)
    assert info.value.problems[0].startswith("harness.options.n: integer out of range")


def test_from_mapping_refuses_a_non_mapping() -> None:
    with pytest.raises(ConfigError) as info:
        RunConfig.from_mapping(["not", "a", "mapping"], None)
    assert info.value.problems == ["top level must be a mapping of keys to values"]


# ----------------------------------------------------------------------------------------------
# The resolved form and the content hash


def test_resolved_form_round_trips_through_json() -> None:
    config = RunConfig.from_file(GOOD / "file_form.yaml")
    stored = json.loads(json.dumps(config.to_json_dict()))
    assert stored["instances"] == ["django__django-11099", "django__django-11133"]
    assert "file" not in json.dumps(stored["instances"])
    again = RunConfig.from_mapping(stored, None)
    assert again == config
    assert again.content_hash == config.content_hash


def test_content_hash_is_stable_and_sensitive() -> None:
    config = RunConfig.from_file(GOOD / "full.yaml")
    # Pinned: a change to the canonical form would break idempotency of stored runs, so it
    # must be deliberate (update this value and say so).
    assert config.content_hash == (
        "sha256:26b8f466b459f1d04f69c8c5d4af6ead0d529d90a9914cf209555b90b9e1a54d"
    )
    assert config.content_hash == RunConfig.from_file(GOOD / "full.json").content_hash
    # Key order and integer-vs-float spelling of the same number do not matter...
    data = yaml.safe_load((GOOD / "full.yaml").read_text())
    reordered = dict(reversed(list(data.items())))
    reordered["caps"] = {"spend_usd": 500, "tasks": 200}
    assert RunConfig.from_mapping(reordered, GOOD).content_hash == config.content_hash
    # ...but any change of meaning does.
    changes = [
        ("caps", {"tasks": 200, "spend_usd": 500.01}),
        ("priority", 2.0),
        ("instances", ["astropy__astropy-12907", "django__django-11099"]),
        ("instances", ["django__django-11099", "astropy__astropy-12907", "sympy__sympy-20590"]),
        ("harness", {"name": "simulated", "options": {"steps": 31}}),
        ("alias", "sim-openai"),
    ]
    hashes = {config.content_hash}
    for key, value in changes:
        changed = dict(data)
        changed[key] = value
        hashes.add(RunConfig.from_mapping(changed, GOOD).content_hash)
    assert len(hashes) == len(changes) + 1


def test_list_and_file_forms_with_the_same_ids_hash_equal(tmp_path: Path) -> None:
    data = yaml.safe_load((GOOD / "minimal.yaml").read_text())
    data["instances"] = ["a__1", "b__2"]
    listed = RunConfig.from_mapping(data, None)
    (tmp_path / "ids.txt").write_text("a__1\nb__2\n")
    data["instances"] = {"file": "ids.txt"}
    filed = RunConfig.from_mapping(data, tmp_path)
    assert listed == filed and listed.content_hash == filed.content_hash


def test_config_is_immutable() -> None:
    config = RunConfig.from_file(GOOD / "minimal.yaml")
    with pytest.raises(Exception, match="frozen"):
        config.name = "other"  # type: ignore[misc]


def test_summary_is_one_line() -> None:
    summary = RunConfig.from_file(GOOD / "full.yaml").summary()
    assert "\n" not in summary
    for part in (
        "verified-sonnet-nightly",
        "harness simulated",
        "evaluator simulated",
        "alias sim-anthropic",
        "3 instances",
        "spend $500.00",
        "tasks 200",
    ):
        assert part in summary
    assert "1 instance," in RunConfig.from_file(GOOD / "minimal.yaml").summary()
