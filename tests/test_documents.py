"""The shared document loader: limits before parsing, strict YAML/JSON, problems with field paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from evalfleet.documents import (
    MAX_DOCUMENT_BYTES,
    MAX_NESTING,
    WholeNumber,
    format_loc,
    load_document,
    parse_document,
    validate,
)
from evalfleet.errors import ConfigError, EvalfleetError


def _write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_document(path)
    assert info.value.source == str(path)
    assert info.value.problems, "a ConfigError must carry at least one problem"
    return info.value.problems


def test_yaml_and_json_give_the_same_mapping(tmp_path: Path) -> None:
    yaml_doc = load_document(_write(tmp_path, "a.yaml", "a: 1\nb: [x, {c: null}]\n"))
    yml_doc = load_document(_write(tmp_path, "a.yml", "a: 1\nb: [x, {c: null}]\n"))
    json_doc = load_document(_write(tmp_path, "a.json", '{"a": 1, "b": ["x", {"c": null}]}'))
    assert yaml_doc == yml_doc == json_doc == {"a": 1, "b": ["x", {"c": None}]}


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    assert load_document(_write(tmp_path, "bom.json", b'\xef\xbb\xbf{"a": "\xc3\xa9"}')) == {
        "a": "é"
    }


def test_config_error_is_an_evalfleet_error() -> None:
    assert issubclass(ConfigError, EvalfleetError)


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("bad.yaml", "a: [1, 2\n", "invalid YAML: line 2, column 1"),
        ("bad.json", '{"a": 1,}', "invalid JSON: line 1, column 9"),
        ("empty.yaml", "", "file is empty"),
        ("empty.json", "\n\n", "file is empty"),
        ("doc-marker.yaml", "---\n", "file is empty"),
        ("list.yaml", "- a\n- b\n", "top level must be a mapping of keys to values, not a list"),
        ("scalar.json", "12", "top level must be a mapping of keys to values, not an integer"),
        ("dup.yaml", "a: 1\nb: 2\na: 3\n", "duplicate key 'a' (first defined on line 1)"),
        ("dup-nested.yaml", "a: {x: 1, x: 2}\n", "duplicate key 'x'"),
        ("dup.json", '{"a": {"x": 1, "x": 2}}', "duplicate key 'x'"),
        ("nan.json", '{"a": NaN}', "NaN is not a valid JSON number"),
        ("inf.json", '{"a": -Infinity}', "-Infinity is not a valid JSON number"),
        ("big.json", '{"a": 1e400}', "out of range"),
        ("digits.json", '{"a": ' + "9" * 5000 + "}", "invalid JSON"),
        ("digits.yaml", "a: " + "9" * 5000 + "\n", "invalid YAML"),
        ("alias.yaml", "a: &x {k: 1}\nb: *x\n", "b: YAML aliases (*name) are not supported"),
        ("merge.yaml", "a: {k: 1}\nb:\n  <<: {k: 2}\n", "merge keys"),
        ("intkey.yaml", "a: {1: x}\n", "a: key 1 must be a string"),
        ("boolkey.yaml", "on: x\n", "key True must be a string"),
        ("python.yaml", "a: !!python/object/apply:os.system [echo hi]\n", "invalid YAML"),
        ("latin1.yaml", b"a: caf\xe9\n", "not valid UTF-8 (byte 6)"),
        ("config.toml", "a = 1\n", "unsupported file type '.toml'"),
        ("noext", "a: 1\n", "unsupported file type '(none)'"),
    ],
)
def test_bad_documents_are_config_errors(
    tmp_path: Path, name: str, content: str | bytes, expected: str
) -> None:
    problems = _problems(_write(tmp_path, name, content))
    assert any(expected in p for p in problems), problems


def test_deep_nesting_is_refused_in_both_formats(tmp_path: Path) -> None:
    depth = MAX_NESTING + 5
    yaml_text = "a: " + "[" * depth + "]" * depth + "\n"
    json_text = '{"a": ' + "[" * depth + "]" * depth + "}"
    for path in (
        _write(tmp_path, "deep.yaml", yaml_text),
        _write(tmp_path, "deep.json", json_text),
    ):
        assert any(f"nested more than {MAX_NESTING} levels" in p for p in _problems(path))
    # Far deeper than any parser's recursion limit: still a ConfigError, not a RecursionError.
    very = 200_000
    for path in (
        _write(tmp_path, "very.yaml", "a: " + "[" * very + "]" * very + "\n"),
        _write(tmp_path, "very.json", '{"a": ' + "[" * very + "]" * very + "}"),
    ):
        _problems(path)


def test_missing_file_and_folder(tmp_path: Path) -> None:
    assert _problems(tmp_path / "nope.yaml") == ["file does not exist"]
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    assert _problems(folder) == ["file is not a regular file"]


def test_unreadable_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "secret.yaml", "a: 1\n")
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):  # running as root: permissions do not apply
            pytest.skip("permission bits are not enforced for this user")
        assert any("cannot read file" in p for p in _problems(path))
    finally:
        path.chmod(0o600)


def test_size_limit_is_checked_before_parsing(tmp_path: Path) -> None:
    # Just over the limit and unparseable: the size is what is reported (nothing was parsed).
    over = _write(tmp_path, "over.yaml", "a: [" + "x" * MAX_DOCUMENT_BYTES)
    problems = _problems(over)
    assert len(problems) == 1
    assert problems[0].startswith("file is too large")
    assert f"{MAX_DOCUMENT_BYTES:,}" in problems[0]


def test_document_at_the_size_limit_is_accepted(tmp_path: Path) -> None:
    head = "a: 1\n# "
    exact = _write(tmp_path, "exact.yaml", head + "x" * (MAX_DOCUMENT_BYTES - len(head)))
    assert exact.stat().st_size == MAX_DOCUMENT_BYTES
    assert load_document(exact) == {"a": 1}


def test_non_regular_file_is_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    # Opening a FIFO for reading would block forever; it must be refused before that.
    assert _problems(fifo) == ["file is not a regular file"]


def test_format_override_and_parse_document() -> None:
    assert parse_document('{"a": 1}', "inline", "json") == {"a": 1}
    assert parse_document("a: 1", "inline", "yaml") == {"a": 1}
    with pytest.raises(ConfigError) as info:
        parse_document("a: 1", "inline", "toml")
    assert info.value.source == "inline"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2e6", 2_000_000.0),
        ("1E+6", 1_000_000.0),
        ("-3e-2", -0.03),
        ("2_000e3", 2_000_000.0),
        ("1.5e+3", 1500.0),  # YAML 1.1's own float form still reads as before
        ("2.5e6", 2_500_000.0),
    ],
)
def test_yaml_reads_an_exponent_without_a_dot_as_a_number(text: str, value: float) -> None:
    parsed = parse_document(f"limit: {text}", "inline", "yaml")["limit"]
    assert isinstance(parsed, float)
    assert parsed == pytest.approx(value)


@pytest.mark.parametrize("text", ["e6", "2e", "1.2.3", "2e6x", "1e6e", "e+6"])
def test_yaml_strings_that_only_look_like_exponents_stay_strings(text: str) -> None:
    assert parse_document(f"v: {text}", "inline", "yaml")["v"] == text


class _Counts(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    rpm: WholeNumber = Field(ge=1)
    instances: WholeNumber | None = None


def test_a_whole_number_field_takes_an_integral_float_as_an_int() -> None:
    model = validate(_Counts, {"rpm": 4000.0, "instances": 5e2}, "src")
    assert model.rpm == 4000 and isinstance(model.rpm, int)
    assert model.instances == 500 and isinstance(model.instances, int)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4000.5, "rpm: must be a whole number (got 4000.5)"),
        (True, "rpm: must be a valid integer (got a boolean)"),
        ("4000", "rpm: must be a valid integer (got a string)"),
        (0.0, "rpm: must be greater than or equal to 1"),
    ],
)
def test_a_whole_number_field_refuses_the_rest_by_name(value: object, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate(_Counts, {"rpm": value}, "src")
    assert info.value.problems == [expected]


# ----------------------------------------------------------------------------------------------
# validate() and the problem lines


class _Inner(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
    spend_usd: float = Field(gt=0, le=100)


class _Outer(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
    name: str
    caps: _Inner
    items: list[int] = []


def test_validate_returns_the_model() -> None:
    model = validate(_Outer, {"name": "n", "caps": {"spend_usd": 5}, "items": [1]}, "src")
    assert model.caps.spend_usd == 5.0


def test_validate_reports_every_problem_with_its_path() -> None:
    data = {"caps": {"spend_usd": 0, "extra": 1}, "items": [1, "2", 3.5], "what": True}
    with pytest.raises(ConfigError) as info:
        validate(_Outer, data, "cfg.yaml")
    assert info.value.source == "cfg.yaml"
    assert info.value.problems == [
        "name: required",
        "caps.spend_usd: must be greater than 0",
        "caps.extra: unknown key (not allowed here)",
        "items[1]: must be a valid integer (got a string)",
        "items[2]: must be a valid integer (got a number)",
        "what: unknown key (not allowed here)",
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (float("nan"), "caps.spend_usd: must be a finite number (not NaN or infinity)"),
        (10**400, "caps.spend_usd: number is too large"),
        ("12", "caps.spend_usd: must be a valid number (got a string)"),
        (True, "caps.spend_usd: must be a valid number (got a boolean)"),
        (1000, "caps.spend_usd: must be less than or equal to 100"),
    ],
)
def test_number_problems_read_well(value: object, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate(_Outer, {"name": "n", "caps": {"spend_usd": value}}, "src")
    assert info.value.problems == [expected]


def test_mapping_expected_message() -> None:
    with pytest.raises(ConfigError) as info:
        validate(_Outer, {"name": "n", "caps": [1]}, "src")
    assert info.value.problems == ["caps: must be a mapping of keys to values (got a list)"]


def test_format_loc() -> None:
    assert format_loc(("caps", "spend_usd")) == "caps.spend_usd"
    assert format_loc(("instances", 3)) == "instances[3]"
    assert format_loc(("a", 0, "b", 2)) == "a[0].b[2]"
    assert format_loc(()) == "(top level)"
