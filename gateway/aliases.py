"""Gateway aliases: what a model name in a harness's request means.

An alias (the ``model`` a harness asks for, e.g. ``sim-openai``) names a provider profile — API
flavour, upstream base URL and model, prices, which token classes the provider's limits count —
and the seed constants of its pacer (calls/s, token budgets, in-flight tokens, burst, cooldown).
Aliases come from a YAML/JSON file (``EVALFLEET_ALIASES_FILE``) or from the embedded default,
which has ``sim-anthropic`` and ``sim-openai`` pointing at the simulated provider. Models are
strict pydantic models: a bad file is a ``ConfigError`` naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalfleet.documents import load_document, validate
from evalfleet.errors import NotFound
from planner.pacer import DEFAULT_BURST_S, DEFAULT_STATED_BURST_S, HOLD_AFTER_429_S

Flavour = Literal["openai", "anthropic"]

PROVIDER_SIM_URL = "${provider_sim_url}"
"""Placeholder in ``base_url`` replaced by the ``provider_sim_url`` setting when loading."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Prices(_Strict):
    """Prices in integer micro-dollars per million tokens ($3/Mtok = 3_000_000)."""

    input_per_mtok: int = Field(ge=0, le=10**9)
    cached_input_per_mtok: int = Field(ge=0, le=10**9)
    output_per_mtok: int = Field(ge=0, le=10**9)

    def cost_micro_usd(self, uncached_input: int, cached_input: int, output: int) -> int:
        """Cost of a call in micro-dollars, rounded up (never under-charged)."""
        total = (
            uncached_input * self.input_per_mtok
            + cached_input * self.cached_input_per_mtok
            + output * self.output_per_mtok
        )
        return -(-total // 1_000_000)


class PacerSeed(_Strict):
    """The pacer's constants for an alias (the seed; the planner adapts the budgets)."""

    calls_per_s: float = Field(gt=0, le=100_000)
    tokens_per_s: float = Field(gt=0, le=10**9)
    output_tokens_per_s: float | None = Field(default=None, gt=0, le=10**9)
    inflight_tokens: float = Field(gt=0, le=10**10)
    burst_s: float = Field(gt=0, le=600)
    stated_burst_s: float = Field(
        default=DEFAULT_STATED_BURST_S,
        gt=0,
        le=600,
        description="Seconds of its rate a bucket holds once the provider's headers state it "
        "(what remains of it): the provider's own bucket, mirrored, so its burst is used as it "
        "allows; burst_s is the depth where nothing is stated.",
    )
    cooldown_s: float = Field(ge=0, le=3600)
    hold_after_429_s: float = Field(
        default=HOLD_AFTER_429_S,
        ge=0,
        le=600,
        description="Seconds of refill the pacer sends nothing after a 429 whose headers say "
        "nothing of the provider's buckets (an empty bucket takes no retries at once).",
    )
    urgent_share: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="When set, a call whose task has run this share of its instance timeout "
        "(the harness's x-evalfleet-task-timeout-s) goes before every other call, oldest task "
        "first, until it has run all of it: fewer attempts past timeouts.instance_s, for some "
        "makespan (0.75: runs with an instance past a 3,600 s timeout 78 -> 24 of 168 "
        "simulated, mean makespan +0.54%). Unset: off.",
    )


class Alias(_Strict):
    """One gateway alias: a provider profile plus its pacer seed."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    flavour: Flavour
    base_url: str = Field(min_length=1, max_length=2048)
    model: str = Field(min_length=1, max_length=256)
    prices: Prices
    cached_input_counts: bool = Field(
        description="Whether cache reads count against the provider's input/combined token limit."
    )
    default_max_tokens: int = Field(default=4096, ge=1, le=1_000_000)
    key_minter: Literal["provider_admin", "prefect_secret"] = "provider_admin"
    static_key_block: str | None = Field(default=None, min_length=1, max_length=128)
    pacer: PacerSeed

    @model_validator(mode="after")
    def _static_key_needs_block(self) -> Alias:
        if self.key_minter == "prefect_secret" and self.static_key_block is None:
            raise ValueError(
                "key_minter prefect_secret needs static_key_block (a Secret block name)"
            )
        if not (
            self.base_url.startswith(("http://", "https://")) or self.base_url == PROVIDER_SIM_URL
        ):
            raise ValueError("base_url must be an http(s) URL or ${provider_sim_url}")
        return self

    @property
    def path(self) -> str:
        """The API path the alias is served on (and forwarded to)."""
        return "/v1/chat/completions" if self.flavour == "openai" else "/v1/messages"

    def worst_case_cost(self, input_tokens: int, max_tokens: int) -> int:
        """Most a call can cost: every input token uncached, ``max_tokens`` of output."""
        return self.prices.cost_micro_usd(input_tokens, 0, max_tokens)


class AliasFile(_Strict):
    """The aliases document: ``{"aliases": [ ... ]}``."""

    aliases: list[Alias] = Field(min_length=1, max_length=1000)

    @model_validator(mode="after")
    def _unique(self) -> AliasFile:
        names = [a.name for a in self.aliases]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate alias names: {', '.join(dupes)}")
        return self


DEFAULT_ALIASES: dict[str, Any] = {
    "aliases": [
        {
            "name": "sim-openai",
            "flavour": "openai",
            "base_url": PROVIDER_SIM_URL,
            "model": "sim-gpt",
            "prices": {
                "input_per_mtok": 2_500_000,
                "cached_input_per_mtok": 1_250_000,
                "output_per_mtok": 10_000_000,
            },
            "cached_input_counts": True,
            "pacer": {
                "calls_per_s": 9.0,
                "tokens_per_s": 27_000.0,
                "inflight_tokens": 400_000.0,
                "burst_s": DEFAULT_BURST_S,
                "cooldown_s": 30.0,
            },
        },
        {
            "name": "sim-anthropic",
            "flavour": "anthropic",
            "base_url": PROVIDER_SIM_URL,
            "model": "sim-claude",
            "prices": {
                "input_per_mtok": 3_000_000,
                "cached_input_per_mtok": 300_000,
                "output_per_mtok": 15_000_000,
            },
            "cached_input_counts": False,
            "pacer": {
                "calls_per_s": 9.0,
                "tokens_per_s": 18_000.0,
                "output_tokens_per_s": 3_600.0,
                "inflight_tokens": 400_000.0,
                "burst_s": DEFAULT_BURST_S,
                "cooldown_s": 30.0,
            },
        },
    ]
}


class Aliases:
    """The aliases in force, by name."""

    def __init__(self, aliases: list[Alias]) -> None:
        self._by_name = {a.name: a for a in aliases}

    def get(self, name: str) -> Alias:
        try:
            return self._by_name[name]
        except KeyError:
            raise NotFound(f"unknown gateway alias {name!r}") from None

    def find(self, name: str) -> Alias | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def __iter__(self) -> Any:
        return iter(self._by_name.values())


def _resolve(data: dict[str, Any], provider_sim_url: str, source: str) -> Aliases:
    parsed = validate(AliasFile, data, source=source)
    resolved = [
        a.model_copy(update={"base_url": provider_sim_url.rstrip("/")})
        if a.base_url == PROVIDER_SIM_URL
        else a
        for a in parsed.aliases
    ]
    return Aliases(resolved)


def load_aliases(path: Path | None, *, provider_sim_url: str) -> Aliases:
    """The aliases of ``path`` (YAML/JSON), or the embedded default when ``path`` is None."""
    if path is None:
        return _resolve(DEFAULT_ALIASES, provider_sim_url, "embedded default aliases")
    return _resolve(load_document(path), provider_sim_url, str(path))
