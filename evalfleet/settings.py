"""The one settings object of evalfleet, read once from ``EVALFLEET_*`` environment variables.

Every field has a default, a bound and a description. A bad value is a startup error that names
the variable (see ``load_settings``); nothing else in the project reads the environment.
"""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class SettingsError(Exception):
    """A setting read from the environment is invalid; the message names every bad variable."""


class Settings(BaseSettings):
    """evalfleet's configuration. Environment variable = ``EVALFLEET_`` + field name, upper case."""

    model_config = SettingsConfigDict(env_prefix="EVALFLEET_", extra="forbid", frozen=True)

    data_dir: Path = Field(
        default=PROJECT_ROOT / "data",
        description="Folder for the default SQLite ledger, demo output and local state.",
    )
    database_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description="SQLAlchemy URL of the ledger; default: SQLite file data_dir/ledger.sqlite3. "
        "PostgreSQL in production (postgresql+psycopg://...).",
    )
    valkey_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description="Valkey/Redis URL for live progress (optional; the ledger is the truth).",
    )
    harness_pool: str = Field(
        default="evalfleet-harness",
        min_length=1,
        max_length=64,
        description="Prefect work pool that runs instance (harness stage) flow runs.",
    )
    ecs_pool: str = Field(
        default="evalfleet-ecs",
        min_length=1,
        max_length=64,
        description="Prefect ECS work pool (prefect-aws) for production instance runs.",
    )
    eval_pool: str = Field(
        default="evalfleet-eval",
        min_length=1,
        max_length=64,
        description="Prefect work pool that runs the evaluation stage.",
    )
    planner_tick_s: float = Field(
        default=15.0, ge=1.0, le=300.0, description="Seconds between planner ticks."
    )
    supervisor_tick_s: float = Field(
        default=30.0, ge=1.0, le=600.0, description="Seconds between supervisor ticks."
    )
    heartbeat_s: float = Field(
        default=20.0,
        ge=0.5,
        le=600.0,
        description="Seconds between an instance's lease heartbeats.",
    )
    visibility_timeout_s: float = Field(
        default=120.0,
        ge=1.0,
        le=86_400.0,
        description="Seconds a claimed job stays invisible without a heartbeat before it is reaped.",
    )
    default_max_attempts: int = Field(
        default=3, ge=1, le=20, description="Attempts before an instance ends `lost` (run default)."
    )

    @field_validator("database_url", "valkey_url")
    @classmethod
    def _has_scheme(cls, value: str | None) -> str | None:
        if value is not None and "://" not in value:
            raise ValueError("must be a URL with a scheme (e.g. postgresql+psycopg://host/db)")
        return value

    @property
    def ledger_url(self) -> str:
        """The ledger's SQLAlchemy URL, defaulting to a SQLite file under ``data_dir``."""
        if self.database_url is not None:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'ledger.sqlite3'}"


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "settings"
        lines.append(f"EVALFLEET_{field.upper()}: {err['msg']}")
    return "invalid settings:\n  " + "\n  ".join(lines)


def load_settings(**overrides: object) -> Settings:
    """Read the settings from the environment (plus explicit overrides), or raise SettingsError."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise SettingsError(_format_errors(exc)) from None


@functools.cache
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
