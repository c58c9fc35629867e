"""The benchmark scenario file: a strict pydantic model of the public format (docs/scenarios.md).

A scenario names the work (instances of a trace or parametric harness), the provider's true
limits (hidden from every policy; they may change during the run), what the provider's responses
reveal (header style), what the operator configured for the alias (the planner's seed) and the
task caps. ``load_scenario`` reads a YAML/JSON file into a ``Scenario`` or raises
``ConfigError`` naming every bad field; unknown keys are errors.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evalfleet.documents import WholeNumber, load_document, validate
from evalfleet.errors import ConfigError

LIMIT_FIELDS = ("rpm", "tpm", "input_tpm", "output_tpm")
POLICY_RE = re.compile(r"^(planner|aimd|fixed:[1-9][0-9]{0,5})$")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Spread(_Strict):
    """A lognormal quantity given by its median and 90th percentile (p90 >= median)."""

    median: float = Field(gt=0, le=1e9)
    p90: float = Field(gt=0, le=1e9)

    @model_validator(mode="after")
    def _ordered(self) -> Spread:
        if self.p90 < self.median:
            raise ValueError("p90 must be >= median")
        return self


class Uniform(_Strict):
    """A uniform quantity on [min, max] seconds."""

    min: float = Field(ge=0, le=86_400)
    max: float = Field(ge=0, le=86_400)

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.max < self.min:
            raise ValueError("max must be >= min")
        return self


class Latency(_Strict):
    """LLM latency of one call: base + per_output_token x output tokens (seconds)."""

    base: float = Field(default=1.0, ge=0, le=600)
    per_output_token: float = Field(default=0.01, ge=0, le=10)


class Parametric(_Strict):
    """A synthetic harness: per instance a lognormal number of calls, growing context."""

    calls: Spread
    first_input_tokens: WholeNumber = Field(ge=1, le=2_000_000)
    input_growth_per_call: WholeNumber = Field(default=0, ge=0, le=1_000_000)
    output_tokens: Spread
    cached_share: float = Field(default=0.0, ge=0, le=1)
    gap_s: Spread

    @field_validator("calls")
    @classmethod
    def _few_calls(cls, value: Spread) -> Spread:
        if value.p90 > 5000:
            raise ValueError("calls.p90 must be <= 5000 per instance")
        return value


class Harness(_Strict):
    """Exactly one of ``trace`` (a shipped trace name) or ``parametric``."""

    trace: str | None = Field(default=None, min_length=1, max_length=128)
    parametric: Parametric | None = None
    latency_s: Latency | None = None
    boot_s: Uniform = Uniform(min=20, max=90)

    @model_validator(mode="after")
    def _one_kind(self) -> Harness:
        if (self.trace is None) == (self.parametric is None):
            raise ValueError("give exactly one of `trace` or `parametric`")
        return self

    @property
    def latency(self) -> Latency:
        return self.latency_s if self.latency_s is not None else Latency()


class LimitChange(_Strict):
    """From ``at_s`` on, the given limits replace the previous ones (others unchanged)."""

    at_s: float = Field(ge=0, le=10_000_000)
    rpm: WholeNumber | None = Field(default=None, ge=1)
    tpm: WholeNumber | None = Field(default=None, ge=1)
    input_tpm: WholeNumber | None = Field(default=None, ge=1)
    output_tpm: WholeNumber | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _changes_something(self) -> LimitChange:
        if all(getattr(self, f) is None for f in LIMIT_FIELDS):
            raise ValueError("a change must set at least one of rpm, tpm, input_tpm, output_tpm")
        return self


class Provider(_Strict):
    """The provider's true per-minute limits (null = no such limit) and what it reveals."""

    rpm: WholeNumber | None = Field(default=None, ge=1, le=100_000_000)
    tpm: WholeNumber | None = Field(default=None, ge=1, le=10_000_000_000)
    input_tpm: WholeNumber | None = Field(default=None, ge=1, le=10_000_000_000)
    output_tpm: WholeNumber | None = Field(default=None, ge=1, le=10_000_000_000)
    cached_input_counts: bool = False
    headers: Literal["anthropic", "openai", "none"] = "none"
    changes: list[LimitChange] = Field(default_factory=list, max_length=100)

    @model_validator(mode="after")
    def _valid(self) -> Provider:
        if all(getattr(self, f) is None for f in LIMIT_FIELDS):
            raise ValueError("give at least one limit (rpm, tpm, input_tpm or output_tpm)")
        if self.tpm is not None and self.input_tpm is not None:
            raise ValueError("tpm (combined tokens) and input_tpm cannot both be set")
        times = [c.at_s for c in self.changes]
        if times != sorted(times):
            raise ValueError("changes must be in increasing at_s order")
        for i, change in enumerate(self.changes):
            for f in LIMIT_FIELDS:
                if getattr(change, f) is not None and getattr(self, f) is None:
                    raise ValueError(f"changes[{i}].{f}: the provider has no {f} limit to change")
        return self


class AliasConfig(_Strict):
    """What the operator configured for the alias: the planner's seed (per second)."""

    calls_per_s: float = Field(gt=0, le=1e7)
    tokens_per_s: float = Field(gt=0, le=1e10)
    output_tokens_per_s: float | None = Field(default=None, gt=0, le=1e10)
    inflight_tokens: float = Field(gt=0, le=1e12)
    cached_input_counts: bool = False
    seeded_hours_ago: float = Field(default=0.0, ge=0, le=100_000)


class Caps(_Strict):
    """Task caps (a fleet of at most this many running + booting tasks); null = none."""

    static: WholeNumber | None = Field(default=1000, ge=1, le=1_000_000)
    run: WholeNumber | None = Field(default=None, ge=1, le=1_000_000)
    override: WholeNumber | None = Field(default=None, ge=0, le=1_000_000)

    @property
    def binding(self) -> int | None:
        present = [c for c in (self.static, self.run, self.override) if c is not None]
        return min(present) if present else None


class Scenario(_Strict):
    """One benchmark scenario (see docs/scenarios.md)."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = Field(default="", max_length=2000)
    seed: WholeNumber = Field(default=0, ge=0, le=2**32 - 1)
    instances: WholeNumber = Field(ge=1, le=100_000)
    harness: Harness
    provider: Provider
    alias_config: AliasConfig
    caps: Caps = Caps()
    instance_timeout_s: float = Field(default=3600.0, gt=0, le=604_800)
    policies: list[str] | None = Field(default=None, min_length=1, max_length=20)

    @field_validator("policies")
    @classmethod
    def _policy_names(cls, value: list[str] | None) -> list[str] | None:
        for i, name in enumerate(value or []):
            if not POLICY_RE.match(name):
                raise ValueError(f"[{i}] {name!r}: must be planner, aimd or fixed:N (N >= 1)")
        return value

    @model_validator(mode="after")
    def _no_override_zero(self) -> Scenario:
        if self.caps.override == 0:
            raise ValueError("caps.override: 0 would never finish the scenario; use >= 1")
        return self


def parse_scenario(data: dict[str, Any], source: str) -> Scenario:
    """Validate a parsed document into a Scenario, or raise ConfigError with field paths."""
    return validate(Scenario, data, source)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file (YAML or JSON)."""
    return parse_scenario(load_document(path), str(path))


def check_policy(name: str) -> str:
    """A policy name as given on the command line, or ConfigError."""
    if not POLICY_RE.match(name):
        raise ConfigError("--policy", [f"{name!r}: must be planner, aimd or fixed:N (N >= 1)"])
    return name
