"""What every harness and evaluator adapter receives and returns, and how its options are checked.

A harness runs the agent on one instance through the gateway and returns a ``HarnessResult``
(the patch plus the usage it saw); an evaluator grades a patch into an ``Evaluation``. Adapters
raise ``HarnessFailed`` when the agent/program itself failed (the instance is scored ``error``)
and ``InfrastructureFailure`` when it was not the agent's fault (the instance is requeued).

The gateway key travels only inside ``HarnessContext.gateway_key`` (a ``SecretStr``): never in a
flow parameter, a log line or an exception message.

A run's ``timeouts.instance_s`` reaches the harness as ``HarnessContext.deadline``: every adapter
bounds each call, sleep and child process by what is left of it, and past it raises
``HarnessFailed`` with ``error_class`` ``instance_timeout`` (``Deadline.expired``): the attempt is
scored ``error``, as a harness's own time limit is in SWE-bench practice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, SecretStr

from evalfleet.documents import validate
from evalfleet.errors import HarnessFailed

ModelT = TypeVar("ModelT", bound=BaseModel)


class AdapterOptions(BaseModel):
    """Base of every adapter's options model: strict, unknown keys refused."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def parse_options(model: type[ModelT], options: dict[str, Any], source: str) -> ModelT:
    """Validate adapter options, or raise ConfigError naming ``source.field``."""
    return validate(model, dict(options), source)


#: ``HarnessFailed.error_class`` of a harness stage that ran past the run's ``timeouts.instance_s``.
INSTANCE_TIMEOUT = "instance_timeout"


@dataclass(frozen=True)
class Deadline:
    """When the harness stage must have ended: ``timeout_s`` after it started, on the
    monotonic clock (``clock``, a test seam), so a wall-clock step cannot end an instance."""

    timeout_s: float
    at: float
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)

    @classmethod
    def after(cls, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> Deadline:
        """The deadline ``timeout_s`` seconds from now."""
        return cls(timeout_s=timeout_s, at=clock() + timeout_s, clock=clock)

    def seconds_left(self) -> float:
        """Seconds until the deadline (0 or less once it has passed)."""
        return float(self.at - self.clock())

    def bound(self, seconds: float) -> float:
        """``seconds``, cut to what is left of the deadline (never below 0)."""
        return max(0.0, min(seconds, self.seconds_left()))

    def check(self, calls_done: int) -> None:
        """Raise ``expired`` once the deadline has passed."""
        if self.seconds_left() <= 0:
            raise self.expired(calls_done)

    def expired(self, calls_done: int | None = None, detail: str = "") -> HarnessFailed:
        """The error of a harness stage that ran past the deadline, after ``calls_done`` calls
        (None: not known, as for a program the harness runs)."""
        text = f"the harness stage did not end within timeouts.instance_s = {self.timeout_s:g} s"
        if calls_done is not None:
            text += f" ({calls_done} call{'' if calls_done == 1 else 's'} done)"
        return HarnessFailed(INSTANCE_TIMEOUT, f"{text}; {detail}" if detail else text)


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
    deadline: Deadline | None = None
    """When the harness stage must end (the run's ``timeouts.instance_s``); None: unbounded."""

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
