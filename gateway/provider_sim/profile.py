"""The simulated provider's profile: its true limits, prices, output and latency model.

Loaded from a YAML/JSON file (``evalfleet provider-sim serve --profile FILE``) or the embedded
default, which matches the embedded gateway aliases (same prices, limits a little above the
aliases' pacer seeds). Strict pydantic: a bad file is a ``ConfigError`` naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalfleet.documents import load_document, validate
from gateway.aliases import Prices
from sim.limits import LimitSpec


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class FlavourProfile(_Strict):
    """Limits (per minute, None = no such limit) and prices of one API flavour."""

    rpm: float | None = Field(default=None, gt=0, le=10**9)
    tpm: float | None = Field(default=None, gt=0, le=10**12)
    input_tpm: float | None = Field(default=None, gt=0, le=10**12)
    output_tpm: float | None = Field(default=None, gt=0, le=10**12)
    cached_input_counts: bool
    prices: Prices

    @model_validator(mode="after")
    def _some_limit(self) -> FlavourProfile:
        if all(v is None for v in (self.rpm, self.tpm, self.input_tpm, self.output_tpm)):
            raise ValueError("needs at least one of rpm, tpm, input_tpm, output_tpm")
        return self

    def limit_spec(self) -> LimitSpec:
        return LimitSpec(
            rpm=self.rpm,
            tpm=self.tpm,
            input_tpm=self.input_tpm,
            output_tpm=self.output_tpm,
            cached_input_counts=self.cached_input_counts,
        )


class SimProfile(_Strict):
    """The whole simulated provider."""

    openai: FlavourProfile
    anthropic: FlavourProfile
    latency_s: float = Field(default=0.0, ge=0, le=600, description="Base latency per call.")
    latency_per_output_token_s: float = Field(default=0.0, ge=0, le=1)
    output_fraction_min: float = Field(default=0.3, ge=0, le=1)
    output_fraction_max: float = Field(default=1.0, ge=0, le=1)
    overload_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of calls answered 529 (OpenAI: 503)."
    )
    stream_chunks: int = Field(default=4, ge=1, le=1000)
    cache_prefixes: int = Field(
        default=100_000, ge=0, le=10_000_000, description="Prompt prefixes remembered."
    )
    seed: int = Field(default=0, ge=0)
    rate_limit_headers: bool = Field(
        default=True,
        description="False: responses carry no rate-limit headers and a 429 names no limit "
        "(as some self-hosted and proxy providers).",
    )

    @model_validator(mode="after")
    def _fractions(self) -> SimProfile:
        if self.output_fraction_min > self.output_fraction_max:
            raise ValueError("output_fraction_min must be <= output_fraction_max")
        return self


DEFAULT_PROFILE: dict[str, Any] = {
    "openai": {
        "rpm": 600.0,
        "tpm": 1_800_000.0,
        "cached_input_counts": True,
        "prices": {
            "input_per_mtok": 2_500_000,
            "cached_input_per_mtok": 1_250_000,
            "output_per_mtok": 10_000_000,
        },
    },
    "anthropic": {
        "rpm": 600.0,
        "input_tpm": 1_200_000.0,
        "output_tpm": 240_000.0,
        "cached_input_counts": False,
        "prices": {
            "input_per_mtok": 3_000_000,
            "cached_input_per_mtok": 300_000,
            "output_per_mtok": 15_000_000,
        },
    },
}


def load_profile(path: Path | None) -> SimProfile:
    """The profile in ``path`` (YAML/JSON), or the embedded default."""
    if path is None:
        return validate(SimProfile, DEFAULT_PROFILE, source="embedded provider-sim profile")
    return validate(SimProfile, load_document(path), source=str(path))


def profile_from(data: dict[str, Any], source: str = "provider-sim profile") -> SimProfile:
    """A profile from a mapping (tests, benchmarks), validated like a file."""
    return validate(SimProfile, data, source=source)
