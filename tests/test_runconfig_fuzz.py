"""Fuzzing the run-config validator: whatever the input, the only failure allowed is ConfigError.

Random bytes (as YAML and JSON files), random nested structures, and mutations of a valid config
(values replaced, keys deleted or added at any depth, text edits of the YAML). Whatever is
accepted must be a sound config: its resolved form round-trips and hashes the same.
"""

from __future__ import annotations

import copy
import datetime
import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evalfleet.errors import ConfigError
from evalfleet.runconfig import MAX_INSTANCES, RunConfig

GOOD = Path(__file__).parent / "data" / "configs" / "good"
BASE: dict[str, Any] = yaml.safe_load((GOOD / "full.yaml").read_text())
BASE_TEXT = (GOOD / "full.yaml").read_text()

FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
_counter = itertools.count()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "ids.txt").write_text("a__1\nb__2\n# c\n\ndjango__3\ndjango__4\n")
    return folder


def check_sound(config: RunConfig, base_dir: Path) -> None:
    """Invariants of an accepted config; a failure here is a validator bug."""
    assert 1 <= len(config.instances) <= MAX_INSTANCES
    assert len(set(config.instances)) == len(config.instances)
    assert all(i and i.isprintable() and not any(c.isspace() for c in i) for i in config.instances)
    assert math.isfinite(config.caps.spend_usd) and config.caps.spend_usd > 0
    assert math.isfinite(config.priority) and config.priority > 0
    assert config.max_attempts is None or 1 <= config.max_attempts <= 20
    for name in (config.name, config.alias, config.harness.name):
        assert 1 <= len(name) <= 64 and "/" not in name and name.isprintable()
    stored = json.loads(config.canonical_json())["config"]  # strict JSON: no NaN can slip in
    again = RunConfig.from_mapping(stored, base_dir)
    assert again == config
    assert again.content_hash == config.content_hash


def validate_or_config_error(data: Any, base_dir: Path) -> None:
    try:
        config = RunConfig.from_mapping(data, base_dir)
    except ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
        assert all("Traceback" not in p for p in exc.problems)
        return
    check_sound(config, base_dir)


def load_or_config_error(path: Path) -> None:
    try:
        config = RunConfig.from_file(path)
    except ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
        return
    check_sound(config, path.parent)


# ----------------------------------------------------------------------------------------------
# Strategies

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["", "12", "1e9", "nan", "a/b", "x\x00y", "..", "django__*", "ids.txt"]),
    st.binary(max_size=8),
    st.dates(),
    st.just(datetime.datetime(2024, 1, 1)),
)
keys = st.one_of(
    st.text(max_size=12),
    st.sampled_from(sorted({*BASE, "options", "file", "start", "stop", "match", "spend_usd"})),
    st.integers(),
    st.booleans(),
    st.none(),
)
structures = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.tuples(children, children),
        st.dictionaries(keys, children, max_size=5),
        st.frozensets(st.integers(), max_size=3),
    ),
    max_leaves=25,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out.extend(_paths(item, (*prefix, index)))
    return out


@st.composite
def mutated_configs(draw: st.DrawFn) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    if draw(st.booleans()):
        data["instances"] = {
            "file": "ids.txt",
            **draw(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "start": st.integers(-2, 6),
                        "stop": st.integers(-2, 6),
                        "match": st.sampled_from(["django__*", "*", "?__[12]", "nope*", "[", ""]),
                    },
                )
            ),
        }
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(data)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if not path:
            continue
        parent = data
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        if action == "replace":
            parent[last] = draw(structures)
        elif action == "delete":
            del parent[last]
        elif isinstance(parent[last], dict):
            parent[last][draw(keys)] = draw(structures)
        elif isinstance(parent[last], list):
            parent[last].append(draw(structures))
    return data


# ----------------------------------------------------------------------------------------------
# Properties


@FUZZ
@given(raw=st.binary(max_size=2048), suffix=st.sampled_from([".yaml", ".json"]))
def test_random_bytes_only_config_error(workdir: Path, raw: bytes, suffix: str) -> None:
    path = workdir / f"bytes-{next(_counter)}{suffix}"
    path.write_bytes(raw)
    load_or_config_error(path)


@FUZZ
@given(data=structures)
def test_random_structures_only_config_error(workdir: Path, data: Any) -> None:
    validate_or_config_error(data, workdir)


@settings(FUZZ, max_examples=50)
@given(data=st.dictionaries(keys, structures, max_size=8))
def test_random_mappings_only_config_error(workdir: Path, data: dict[Any, Any]) -> None:
    validate_or_config_error(data, workdir)


@FUZZ
@given(data=mutated_configs())
def test_mutated_configs_only_config_error(workdir: Path, data: dict[str, Any]) -> None:
    validate_or_config_error(data, workdir)


@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(BASE_TEXT)), st.integers(0, 3), st.text(max_size=4)),
        min_size=1,
        max_size=4,
    ),
    suffix=st.sampled_from([".yaml", ".json"]),
)
def test_text_edits_only_config_error(
    workdir: Path, edits: list[tuple[int, int, str]], suffix: str
) -> None:
    text = BASE_TEXT if suffix == ".yaml" else json.dumps(BASE)
    for position, delete, insert in edits:
        position = min(position, len(text))
        text = text[:position] + insert + text[position + delete :]
    path = workdir / f"edit-{next(_counter)}{suffix}"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    load_or_config_error(path)


def test_unmutated_base_is_accepted(workdir: Path) -> None:
    # The fuzz starts from a valid config: if this failed, every mutation would be rejected
    # trivially and the properties above would prove nothing.
    config = RunConfig.from_mapping(copy.deepcopy(BASE), workdir)
    check_sound(config, workdir)
    data = copy.deepcopy(BASE)
    data["instances"] = {"file": "ids.txt", "match": "django__*"}
    assert RunConfig.from_mapping(data, workdir).instances == ("django__3", "django__4")
