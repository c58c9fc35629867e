"""The gateway's view of a pacer: acquire a permit on a call's estimate, settle it afterwards.

Two implementations share this interface: ``gateway.pacer_local.InProcessPacer`` (asyncio
token buckets around the pure ``planner.pacer`` core; the simulator and unit tests) and
``gateway.pacer_prefect.PrefectPacer`` (the same local pacing, with its budgets read from the
alias's Prefect global concurrency limits every few seconds — Prefect is the source of truth).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Demand:
    """What a call asks of an alias's budgets: estimated counted tokens and output tokens.

    ``tokens`` is the estimate the pacer charges the token budget (uncached input + max_tokens,
    or all input + max_tokens when cache reads count); ``output_tokens`` is ``max_tokens``.
    In-flight tokens are ``tokens`` until the call is settled.
    """

    tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Permit:
    """An admitted call: what it was charged, and how long it waited."""

    alias: str
    demand: Demand
    waited_s: float
    handle: object


class Pacer(Protocol):
    """Admits calls per alias against calls/s, token budgets and in-flight tokens."""

    async def start(self) -> None:
        """Prepare (create/read limits); called once before the first acquire."""

    async def acquire(self, alias: str, demand: Demand) -> Permit:
        """Wait until the call fits the alias's budgets (FIFO), then charge it."""

    async def settle(self, permit: Permit, tokens: int, output_tokens: int) -> None:
        """The call finished with these actual counted/output tokens: correct the charge and
        release its in-flight tokens."""

    async def close(self) -> None:
        """Stop background work."""
