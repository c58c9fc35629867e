"""What every harness and evaluator adapter receives and returns, and how its options are checked.

A harness runs the agent on one instance through the gateway and returns a ``HarnessResult``
(the patch plus the usage it saw); an evaluator grades a patch into an ``Evaluation``. Adapters
raise ``HarnessFailed`` when the agent/program itself failed (the instance is scored ``error``)
and ``InfrastructureFailure`` when it was not the agent's fault (the instance is requeued).

The gateway key travels only inside ``HarnessContext.gateway_key`` (a ``SecretStr``): never in a
flow parameter, a log line or an exception message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, SecretStr

from evalfleet.documents import validate

ModelT = TypeVar("ModelT", bound=BaseModel)


class AdapterOptions(BaseModel):
    """Base of every adapter's options model: strict, unknown keys refused."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def parse_options(model: type[ModelT], options: dict[str, Any], source: str) -> ModelT:
    """Validate adapter options, or raise ConfigError naming ``source.field``."""
    return validate(model, dict(options), source)


@dataclass(frozen=True)
class HarnessContext:
    """One instance attempt as a harness sees it."""

    run_id: str
    instance_id: str
    alias: str
    gateway_url: str
    gateway_key: SecretStr
    attempt: int = 1
    harness: str = ""
    started_at: float | None = None
    """Epoch seconds the task started (the gateway's task age); None: the gateway decides."""
    http_client: httpx.Client | None = None
    """Transport seam: tests pass a client bound to an in-process ASGI app."""

    def __repr__(self) -> str:  # never show the key, even masked, in a traceback
        return f"HarnessContext(run_id={self.run_id!r}, instance_id={self.instance_id!r})"


@dataclass(frozen=True)
class HarnessResult:
    """What the harness stage produced: the patch (None = the agent gave up) and its usage."""

    patch: str | None
    calls: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class Evaluation:
    """The evaluation stage's verdict on one patch."""

    resolved: bool
    detail: str = ""


class Harness(Protocol):
    """A harness adapter: options are validated at construction (launch time)."""

    name: str

    def run(self, ctx: HarnessContext) -> HarnessResult: ...


class Evaluator(Protocol):
    """An evaluator adapter: grades one instance's patch."""

    name: str

    def evaluate(self, run_id: str, instance_id: str, patch: str | None) -> Evaluation: ...
