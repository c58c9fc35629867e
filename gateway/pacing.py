"""The gateway's view of a pacer: acquire a permit on a call's estimate, settle it afterwards.

Two implementations share this interface: ``gateway.pacer_local.InProcessPacer`` (asyncio
around the pure ``planner.pacer.PacerCore``: head-of-line order, big calls admitted alone;
the simulator's rule, used by unit tests and `--pacer inprocess`) and
``gateway.pacer_prefect.PrefectPacer`` (the same local pacing, with its budgets read from the
alias's Prefect global concurrency limits every few seconds — Prefect is the source of truth).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from planner.classify import Classification, LimitType
from planner.pacer import CallEstimate, CallUsage

__all__ = ["CallEstimate", "CallUsage", "Pacer", "PacerUnavailable", "Permit"]


class PacerUnavailable(Exception):
    """The alias's pacer cannot admit anything (e.g. its Prefect limit is missing)."""


@dataclass(frozen=True)
class Permit:
    """An admitted call: its id in the alias's core, its estimate and how long it waited."""

    alias: str
    call_id: str
    estimate: CallEstimate
    waited_s: float


class Pacer(Protocol):
    """Admits calls per alias against calls/s, token budgets and in-flight tokens."""

    async def start(self) -> None:
        """Prepare (create/read limits); called once before the first acquire."""

    async def acquire(self, alias: str, estimate: CallEstimate) -> Permit:
        """Wait until the call reaches the head of the alias's queue and fits, then charge it."""

    async def settle(self, permit: Permit, usage: CallUsage | None) -> None:
        """The call finished (``usage``) or failed (None): settle the estimate, free in-flight."""

    def observe_remaining(self, alias: str, remaining: Mapping[LimitType, float]) -> None:
        """The provider's rate-limit headers state what is left of its buckets (per limit
        type, as stated): no bucket of the alias's pacer holds more."""

    def cached_input_counts(self, alias: str) -> bool:
        """Whether the alias's pacer charges cache reads against its token budget."""

    def recount(self, alias: str, counts: bool) -> None:
        """The gateway's own verdict on whether the provider counts cache reads: pace so at
        once (the planner adopts it at its next tick)."""

    def cut_at_429(self, alias: str, view: Classification) -> None:
        """A call's first 429 (not a retry's): cut the budgets it hits at once, until the
        planner's next push (``planner.provisional_cut``)."""

    def hold(
        self, alias: str, view: Classification | None = None, *, elapsed_s: float = 0.0
    ) -> None:
        """A 429 left provider buckets empty without saying so (``view``: the 429's reading,
        see ``planner.pacer.classes_to_hold``; None: all of them): send nothing on those of
        the alias's buckets for its ``hold_after_429_s`` of refill (a per-day limit's 429: every
        bucket, for its retry-after, ``planner.pacer.hold_seconds``), less ``elapsed_s`` since
        the 429 (another replica's, heard of late: every replica's hold ends together)."""

    def demand(self, alias: str) -> float:
        """What this gateway's harnesses ask of the alias now (calls lately arrived and waiting):
        what replicas of the gateway split the alias's budgets by (``gateway.replica_sync``)."""

    def share(self, alias: str) -> float:
        """This gateway's share of the alias's budgets (1: it is the alias's only gateway)."""

    def set_share(self, alias: str, share: float) -> None:
        """Pace the alias at ``share`` (0-1] of its budgets: this replica's part of them."""

    async def close(self) -> None:
        """Stop background work."""
