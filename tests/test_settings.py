"""The settings object: every field defaulted, bounded and described; bad env values are clear errors."""

from __future__ import annotations

import os
import typing
from pathlib import Path

import annotated_types
import pytest
from pydantic import SecretStr

from evalfleet.errors import EvalfleetError
from evalfleet.settings import Settings, SettingsError, get_settings, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No EVALFLEET_* variable from the surrounding shell may leak into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("EVALFLEET_"):
            monkeypatch.delenv(name)


def _bounds(field_name: str) -> set[type]:
    return {type(m) for m in Settings.model_fields[field_name].metadata}


def _base_type(field_name: str) -> object:
    """The field's type without ``| None``."""
    annotation = Settings.model_fields[field_name].annotation
    args = typing.get_args(annotation)
    if type(None) in args:
        return next(a for a in args if a is not type(None))
    return annotation


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_every_field_has_default_description_and_bound(name: str) -> None:
    field = Settings.model_fields[name]
    assert not field.is_required(), f"{name} has no default"
    assert field.description and len(field.description) > 10, f"{name} has no description"
    base = _base_type(name)
    bounds = _bounds(name)
    if base in {int, float}:
        assert bounds & {annotated_types.Ge, annotated_types.Gt}, f"{name}: no lower bound"
        assert bounds & {annotated_types.Le, annotated_types.Lt}, f"{name}: no upper bound"
    elif base in {str, SecretStr}:
        assert annotated_types.MaxLen in bounds, f"{name}: no length bound"
    elif typing.get_origin(base) is typing.Literal:
        assert typing.get_args(base), name
    elif base is bool:
        assert isinstance(field.default, bool), f"{name}: a switch needs a default"
    else:
        assert base is Path, f"{name}: unexpected type {base!r}; extend this test"


def test_defaults_load_without_any_environment() -> None:
    settings = load_settings()
    assert settings.database_url is None
    assert settings.ledger_url == f"sqlite:///{settings.data_dir / 'ledger.sqlite3'}"
    assert 1 <= settings.default_max_attempts <= 20
    assert settings.heartbeat_s < settings.visibility_timeout_s


def test_environment_values_are_read_and_typed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("EVALFLEET_PLANNER_TICK_S", "20")
    monkeypatch.setenv("EVALFLEET_DEFAULT_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1/x")
    monkeypatch.setenv("EVALFLEET_DATA_DIR", str(tmp_path))
    settings = load_settings()
    assert settings.planner_tick_s == 20.0
    assert settings.default_max_attempts == 5
    assert settings.ledger_url == "postgresql+psycopg://postgres@127.0.0.1/x"
    assert settings.data_dir == tmp_path


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("EVALFLEET_PLANNER_TICK_S", "abc", "number"),
        ("EVALFLEET_PLANNER_TICK_S", "0", "greater than or equal to 1"),
        ("EVALFLEET_PLANNER_TICK_S", "1e9", "less than or equal to 300"),
        ("EVALFLEET_PLANNER_TICK_S", "nan", "finite number"),
        ("EVALFLEET_VISIBILITY_TIMEOUT_S", "inf", "finite number"),
        ("EVALFLEET_DEFAULT_MAX_ATTEMPTS", "0", "greater than or equal to 1"),
        ("EVALFLEET_PLANNER_TIMEOUT_FLOOR", "0.9", "greater than or equal to 1"),
        ("EVALFLEET_DEFAULT_MAX_ATTEMPTS", "2.5", "integer"),
        ("EVALFLEET_DEFAULT_MAX_ATTEMPTS", "21", "less than or equal to 20"),
        ("EVALFLEET_DATABASE_URL", "ledger.sqlite3", "URL with a scheme"),
        ("EVALFLEET_DATABASE_URL", "", "at least 1 character"),
        ("EVALFLEET_HARNESS_POOL", "x" * 65, "at most 64 characters"),
        ("EVALFLEET_GATEWAY_PORT", "70000", "less than or equal to 65535"),
        ("EVALFLEET_GATEWAY_PACER", "fast", "'prefect' or 'inprocess'"),
        ("EVALFLEET_LAUNCHER", "ecs", "'in-process' or 'work-pool'"),
        ("EVALFLEET_DATA_DIR", "", "must not be empty"),
        ("EVALFLEET_DATA_DIR", "a\x01b", "control characters"),
    ],
)
def test_bad_value_is_a_clear_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    try:
        monkeypatch.setenv(variable, value)
    except ValueError:  # the OS refuses this value in the environment: pass it directly
        pytest.skip("value not representable in the environment")
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert f"{variable}: " in message
    assert expected in message
    assert "Traceback" not in message


def test_every_bad_variable_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALFLEET_PLANNER_TICK_S", "never")
    monkeypatch.setenv("EVALFLEET_STATIC_CAP", "-1")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "EVALFLEET_PLANNER_TICK_S" in str(info.value)
    assert "EVALFLEET_STATIC_CAP" in str(info.value)


def test_settings_error_is_an_evalfleet_error() -> None:
    # The CLI (and anything catching EvalfleetError) turns it into exit code 2, not a traceback.
    assert issubclass(SettingsError, EvalfleetError)


@pytest.mark.parametrize(
    ("env", "names"),
    [
        (
            {"EVALFLEET_HEARTBEAT_S": "200", "EVALFLEET_VISIBILITY_TIMEOUT_S": "100"},
            ["EVALFLEET_HEARTBEAT_S", "EVALFLEET_VISIBILITY_TIMEOUT_S"],
        ),
        (
            {"EVALFLEET_EVAL_CONCURRENCY_MIN": "8", "EVALFLEET_EVAL_CONCURRENCY_MAX": "2"},
            ["EVALFLEET_EVAL_CONCURRENCY_MIN", "EVALFLEET_EVAL_CONCURRENCY_MAX"],
        ),
    ],
)
def test_inconsistent_pairs_are_refused_naming_both(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], names: list[str]
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    for name in names:
        assert name in str(info.value)


def test_secrets_never_appear_in_errors_or_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "s3cr3t-admin-key-do-not-print"
    monkeypatch.setenv("EVALFLEET_PROVIDER_ADMIN_KEY", secret)
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", "postgresql://user:hunter2pw@db/x")
    settings = load_settings()
    assert settings.provider_admin_key is not None
    assert settings.provider_admin_key.get_secret_value() == secret
    assert secret not in repr(settings) and secret not in str(settings)
    assert "hunter2pw" not in repr(settings)

    # A malformed URL carrying a password: the error names the variable, never the value.
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", "user:hunter2pw@db/x")
    monkeypatch.setenv("EVALFLEET_PROVIDER_ADMIN_KEY", secret * 200)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "EVALFLEET_DATABASE_URL" in str(info.value)
    assert "EVALFLEET_PROVIDER_ADMIN_KEY" in str(info.value)
    assert "hunter2pw" not in str(info.value)
    assert secret not in str(info.value)


def test_unknown_override_is_refused() -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(planner_tick=3)
    assert "EVALFLEET_PLANNER_TICK" in str(info.value)


def test_get_settings_is_read_once() -> None:
    get_settings.cache_clear()
    try:
        assert get_settings() is get_settings()
    finally:
        get_settings.cache_clear()


def test_export_settings_validates_before_changing_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from evalfleet.settings import export_settings

    # Registered with monkeypatch so that teardown restores the environment.
    monkeypatch.setenv("EVALFLEET_PLANNER_TICK_S", "15")
    monkeypatch.setenv("EVALFLEET_STATIC_CAP", "64")
    try:
        with pytest.raises(SettingsError) as info:
            export_settings(planner_tick_s="20", static_cap="0")
        assert "EVALFLEET_STATIC_CAP" in str(info.value)
        assert os.environ["EVALFLEET_PLANNER_TICK_S"] == "15"  # rolled back
        assert os.environ["EVALFLEET_STATIC_CAP"] == "64"
        settings = export_settings(planner_tick_s="20")
        assert settings.planner_tick_s == 20.0
        assert get_settings() is settings
        assert os.environ["EVALFLEET_PLANNER_TICK_S"] == "20"
    finally:
        get_settings.cache_clear()


def test_the_timeout_floor_reaches_the_planners_sizing(monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks import plan_budgets

    assert plan_budgets.sizing_config().timeout_floor == 1.1
    monkeypatch.setenv("EVALFLEET_PLANNER_TIMEOUT_FLOOR", "1")
    get_settings.cache_clear()
    assert plan_budgets.sizing_config().timeout_floor == 1.0
