"""The one settings object of evalfleet, read once from ``EVALFLEET_*`` environment variables.

Every field has a default, a bound and a description. A bad value is a startup error that names
the variable (see ``load_settings``); nothing else in the project reads the environment.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from evalfleet.errors import EvalfleetError

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class SettingsError(EvalfleetError):
    """A setting read from the environment is invalid; the message names every bad variable."""


class Settings(BaseSettings):
    """evalfleet's configuration. Environment variable = ``EVALFLEET_`` + field name, upper case."""

    model_config = SettingsConfigDict(
        env_prefix="EVALFLEET_", extra="forbid", frozen=True, allow_inf_nan=False
    )

    data_dir: Path = Field(
        default=PROJECT_ROOT / "data",
        description="Folder for the default SQLite ledger, demo output and local state.",
    )
    database_url: str | None = Field(
        default=None,
        repr=False,
        min_length=1,
        max_length=2048,
        description="SQLAlchemy URL of the ledger; default: SQLite file data_dir/ledger.sqlite3. "
        "PostgreSQL in production (postgresql+psycopg://...).",
    )
    valkey_url: str | None = Field(
        default=None,
        repr=False,
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
    planner_boot_s: float = Field(
        default=60.0,
        ge=0.0,
        le=3600.0,
        description="Seconds a fleet slot spends per task not running the harness (claim to the "
        "first LLM call, plus landing) that the planner sizes with: ~60 on ECS/Fargate, a few "
        "with the in-process launcher.",
    )
    planner_token_overdrive: float = Field(
        default=2.5,
        ge=1.0,
        le=4.0,
        description="How far above a token budget the planner sizes the fleet's demand when "
        "that budget saturates (the pacer admits the smallest prompts first and holds the rest "
        "back; 1.1 sizes as for the calls budget, with fewer idle tasks and a later tail).",
    )
    planner_token_max_wait_s: float = Field(
        default=30.0,
        ge=6.0,
        le=600.0,
        description="The longest wait at the pacer, per call, that a fleet sized against a token "
        "budget may project (bounds planner_token_overdrive for harnesses with short gaps "
        "between calls); at least the 6 s a calls budget may project.",
    )
    planner_timeout_margin: float = Field(
        default=0.8,
        ge=0.1,
        le=1.0,
        description="The share of a run's instance timeout (timeouts.instance_s) that the "
        "harness curve's long tasks may be stretched to by the pacer's holds: the planner sizes "
        "no fleet whose projected demand would stretch them further (binding instance_timeout).",
    )
    planner_timeout_floor: float = Field(
        default=1.1,
        ge=1.0,
        le=2.0,
        description="The least the instance timeout's bound lets a budget's projected demand be "
        "over the budget, however long the curve's tasks: at 1.0 a fleet only matches its budget "
        "and leaves the limit partly idle; higher is faster and stretches long tasks further.",
    )
    planner_launch_ramp_floor: int = Field(
        default=100,
        ge=1,
        le=100_000,
        description="Until the provider has answered an alias (or while its rate-limit headers "
        "leave a budgeted limit unstated) and no 429 has come, the planner's ceiling for it is at "
        "most this many tasks or planner_launch_ramp_growth x its live fleet, whichever is "
        "larger: a first cohort is not sized on a seed the provider has not confirmed.",
    )
    planner_launch_ramp_growth: float = Field(
        default=1.2,
        gt=1.0,
        le=4.0,
        description="How much the launch ramp lets an alias's fleet grow per planner tick "
        "(see planner_launch_ramp_floor; a floor above any fleet turns the ramp off).",
    )
    planner_old_first_min_spread: float = Field(
        default=1.7,
        ge=1.0,
        le=100.0,
        description="Once an alias has no instance left to launch, its pacer keeps putting old "
        "tasks' calls first under an output-token limit only if the harness curve's task "
        "durations spread at least this much (90th over 50th percentile); narrower, an old task "
        "is nearly done and calls go in arrival order, so the young tasks the run ends on are "
        "not stretched.",
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

    gateway_host: str = Field(
        default="127.0.0.1",
        min_length=1,
        max_length=255,
        description="Interface the gateway (`evalfleet gateway serve`) listens on.",
    )
    gateway_port: int = Field(
        default=8300, ge=1, le=65535, description="Port of the gateway (`evalfleet gateway serve`)."
    )
    gateway_url: str = Field(
        default="http://127.0.0.1:8300",
        min_length=1,
        max_length=2048,
        description="Base URL harnesses use to reach the gateway (OpenAI/Anthropic-compatible).",
    )
    provider_sim_url: str = Field(
        default="http://127.0.0.1:8301",
        min_length=1,
        max_length=2048,
        description="Base URL of the simulated provider; the embedded `sim-*` aliases point here.",
    )
    provider_admin_key: SecretStr | None = Field(
        default=None,
        max_length=4096,
        description="Admin key of the provider's key-minting API (the simulated provider's "
        "`/admin/keys`). Held in memory only; never logged or stored.",
    )
    aliases_file: Path | None = Field(
        default=None,
        description="YAML/JSON file of gateway aliases (provider profile + pacer seed constants); "
        "default: the embedded aliases `sim-anthropic` and `sim-openai`.",
    )
    key_ttl_s: float = Field(
        default=7 * 86_400.0,
        ge=60.0,
        le=90 * 86_400.0,
        description="Lifetime of a run's gateway and provider keys, in seconds.",
    )
    gateway_max_retry_wait_s: float = Field(
        default=30.0,
        ge=0.0,
        le=600.0,
        description="Total seconds the gateway may spend retrying a provider 429/529 (honouring "
        "retry-after) before passing it to the harness; 0 passes the first one through.",
    )
    gateway_pacer: Literal["prefect", "inprocess"] = Field(
        default="prefect",
        description="Pacer of `evalfleet gateway serve`: `prefect` (global concurrency limits, "
        "the source of truth) or `inprocess` (local token buckets only; simulator and tests).",
    )
    pacer_sync_interval_s: float = Field(
        default=3.0,
        ge=0.1,
        le=60.0,
        description="Seconds between re-reads of an alias's Prefect concurrency limits by the "
        "gateway's local pacer.",
    )
    gateway_budget_sharing: Literal["solo", "valkey"] = Field(
        default="solo",
        description="How gateway processes serving the same aliases pace them: `solo` (this "
        "gateway is each alias's only one and paces at the full budgets) or `valkey` (replicas "
        "behind a load balancer split every budget by demand through EVALFLEET_VALKEY_URL).",
    )
    gateway_replica_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._:-]+$",
        description="This gateway replica's name among those sharing budgets; default: host "
        "name, process id and a random suffix (unique per start).",
    )
    gateway_share_interval_s: float = Field(
        default=1.0,
        ge=0.1,
        le=30.0,
        description="Seconds between a gateway replica's reports of its demand (and re-reads "
        "of its share of the budgets) when budgets are shared.",
    )
    gateway_share_429s: bool = Field(
        default=True,
        description="With budgets shared through Valkey, post each call's first 429 to the "
        "other replicas and cut and hold as theirs say (off: a replica learns only from its "
        "own 429s and the planner's tick).",
    )
    gateway_replica_ttl_s: float = Field(
        default=10.0,
        ge=1.0,
        le=600.0,
        description="Seconds without a report after which a gateway replica counts as gone "
        "and the others take its share (by the Valkey server's clock).",
    )

    project_dir: Path = Field(
        default=PROJECT_ROOT,
        description="Checkout that local process workers run flows from (the pull step of the "
        "process deployments in prefect.yaml).",
    )
    launcher: Literal["in-process", "work-pool"] = Field(
        default="in-process",
        description="How the dispatcher starts instances: `in-process` (subflows in a bounded "
        "thread pool; the embedded default) or `work-pool` (run-instance deployments on a pool).",
    )
    instance_deployment: str = Field(
        default="run-instance/process",
        min_length=3,
        max_length=200,
        pattern="^[^/]+/[^/]+$",
        description="`flow/deployment` the work-pool launcher runs (`run-instance/ecs` on AWS).",
    )
    static_cap: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="Most live instances across all runs (also the harness pools' Prefect "
        "concurrency limit).",
    )
    in_process_threads: int = Field(
        default=32,
        ge=1,
        le=1024,
        description="Threads of the in-process launcher (its hard bound on live instances).",
    )
    dispatch_tick_s: float = Field(
        default=1.0, ge=0.05, le=60.0, description="Seconds between dispatcher admission passes."
    )
    bootstrap_ceiling: int = Field(
        default=4,
        ge=1,
        le=100_000,
        description="Most live instances per alias the dispatcher admits while the planner has "
        "no fresh decision for it (a new alias before the planner's first tick, or a planner "
        "that stopped deciding): a conservative start, never a stall.",
    )
    planner_decision_max_age_s: float | None = Field(
        default=None,
        ge=1.0,
        le=86_400.0,
        description="Seconds a planner decision stays in force for the dispatcher; an older one "
        "counts as none (bootstrap ceiling). Default: 4 planner ticks.",
    )
    eval_concurrency_min: int = Field(
        default=1, ge=1, le=10_000, description="Lower bound the eval-pool scaler keeps."
    )
    eval_concurrency_max: int = Field(
        default=16, ge=1, le=10_000, description="Upper bound the eval-pool scaler keeps."
    )
    eval_per_slot: int = Field(
        default=4,
        ge=1,
        le=10_000,
        description="Queued evaluations per eval-pool concurrency slot the scaler provides.",
    )
    eval_launcher: Literal["in-process", "work-pool"] = Field(
        default="in-process",
        description="Where an instance's evaluation stage runs: `in-process` (inside its "
        "run-instance flow run) or `work-pool` (a `run-eval` flow run on the eval pool, handed "
        "the instance's lease; the harness's flow run ends once it is created).",
    )
    eval_deployment: str = Field(
        default="run-eval/eval",
        min_length=3,
        max_length=200,
        pattern="^[^/]+/[^/]+$",
        description="`flow/deployment` of the evaluation stage when `eval_launcher` is "
        "`work-pool`.",
    )
    eval_wait_s: float = Field(
        default=3600.0,
        ge=10.0,
        le=86_400.0,
        description="Seconds a handed-off evaluation may wait for an eval-pool slot: its lease "
        "is extended by this much at the hand-off (the run-eval flow run then heartbeats it); a "
        "run-eval flow run that ends without landing is requeued at the next supervisor tick.",
    )

    s3_endpoint_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description="S3 endpoint for run configs dropped into a bucket (`s3://` config URIs, "
        "`evalfleet s3 watch`); default: AWS's own. Set it for MinIO, moto or LocalStack. "
        "Credentials and region come from boto3's usual chain (AWS_* variables, profile, role).",
    )

    @field_validator(
        "database_url", "valkey_url", "gateway_url", "provider_sim_url", "s3_endpoint_url"
    )
    @classmethod
    def _has_scheme(cls, value: str | None) -> str | None:
        if value is not None and "://" not in value:
            raise ValueError("must be a URL with a scheme (e.g. postgresql+psycopg://host/db)")
        return value

    @field_validator("data_dir", "project_dir", "aliases_file", mode="before")
    @classmethod
    def _sane_path(cls, value: Any) -> Any:
        if isinstance(value, str | Path):
            text = str(value)
            if not text.strip():
                raise ValueError("must not be empty")
            if len(text) > 4096:
                raise ValueError("must be at most 4096 characters")
            if not text.isprintable():
                raise ValueError("must not contain control characters")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.heartbeat_s >= self.visibility_timeout_s:
            raise ValueError(
                "EVALFLEET_HEARTBEAT_S must be less than EVALFLEET_VISIBILITY_TIMEOUT_S "
                f"(got {self.heartbeat_s:g} >= {self.visibility_timeout_s:g}): leases would expire "
                "between heartbeats"
            )
        if (
            self.planner_decision_max_age_s is not None
            and self.planner_decision_max_age_s < 2 * self.planner_tick_s
        ):
            raise ValueError(
                "EVALFLEET_PLANNER_DECISION_MAX_AGE_S must be at least twice "
                f"EVALFLEET_PLANNER_TICK_S (got {self.planner_decision_max_age_s:g} < "
                f"2 x {self.planner_tick_s:g}): every decision would expire before the next one"
            )
        if self.gateway_budget_sharing == "valkey" and self.valkey_url is None:
            raise ValueError(
                "EVALFLEET_GATEWAY_BUDGET_SHARING is `valkey` but EVALFLEET_VALKEY_URL is not "
                "set: replicas share budgets through it"
            )
        if self.gateway_replica_ttl_s < 3 * self.gateway_share_interval_s:
            raise ValueError(
                "EVALFLEET_GATEWAY_REPLICA_TTL_S must be at least three times "
                f"EVALFLEET_GATEWAY_SHARE_INTERVAL_S (got {self.gateway_replica_ttl_s:g} < "
                f"3 x {self.gateway_share_interval_s:g}): live replicas would be reaped between "
                "their reports"
            )
        if self.eval_concurrency_min > self.eval_concurrency_max:
            raise ValueError(
                "EVALFLEET_EVAL_CONCURRENCY_MIN must not exceed EVALFLEET_EVAL_CONCURRENCY_MAX "
                f"(got {self.eval_concurrency_min} > {self.eval_concurrency_max})"
            )
        return self

    @property
    def decision_max_age_s(self) -> float:
        """How long a planner decision stays in force (``planner_decision_max_age_s``, default
        four planner ticks)."""
        if self.planner_decision_max_age_s is not None:
            return self.planner_decision_max_age_s
        return 4 * self.planner_tick_s

    @property
    def ledger_url(self) -> str:
        """The ledger's SQLAlchemy URL, defaulting to a SQLite file under ``data_dir``."""
        if self.database_url is not None:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'ledger.sqlite3'}"


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors(include_url=False):
        message = str(err["msg"]).removeprefix("Value error, ")
        if message.startswith("Input should be "):
            message = "must be " + message.removeprefix("Input should be ")
        field = ".".join(str(p) for p in err["loc"])
        lines.append(f"EVALFLEET_{field.upper()}: {message}" if field else message)
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


def export_settings(**values: str) -> Settings:
    """Set ``EVALFLEET_<NAME>`` variables for this process and its children, then re-read.

    Used by commands that start the embedded stack (``evalfleet demo``): the values must be
    valid (they are checked before anything is changed) and become what ``get_settings``
    returns from now on.
    """
    env = {f"EVALFLEET_{name.upper()}": value for name, value in values.items()}
    previous = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        load_settings()
    except SettingsError:
        for key, old in previous.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        raise
    get_settings.cache_clear()
    return get_settings()


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment plus ``extra``: for servers and workers it starts."""
    return {**os.environ, **extra}


def export_environment(values: dict[str, str]) -> None:
    """Set non-evalfleet variables (e.g. ``PREFECT_API_URL``) for this process and its children.

    For commands that start servers themselves (``evalfleet demo``); evalfleet's own settings go
    through ``export_settings`` so that they are validated.
    """
    bad = [k for k in values if k.startswith("EVALFLEET_")]
    if bad:
        raise SettingsError(f"use export_settings for {', '.join(sorted(bad))}")
    os.environ.update(values)
