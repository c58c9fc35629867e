"""The in-process pacer: ``planner.pacer.PacerCore`` per alias, driven by asyncio.

Each alias has one core (pure, clock passed in) and one waker task. ``acquire`` queues the
call in the core; if it is not admitted at once, the caller awaits a future that the waker
resolves when ``PacerCore.poll`` admits it — the waker sleeps until ``next_ready_at`` or until
a release/budget change/new call wakes it. Head-of-line order (FIFO, or smallest prompt first
under a token limit), no starvation and admitting a call bigger than a bucket alone all come
from the core. A caller cancelled while queued is removed from the queue; one cancelled just
after admission is released (nothing leaks).

``set_budgets`` applies new budgets live (``PrefectPacer`` uses it after each sync).

Where several gateway replicas serve an alias, each paces at its share of the budgets
(``set_share``, from ``gateway.replica_sync``): rates, depths, in-flight tokens and the
provider's stated remaining alike. ``demand`` is what the share is split by: how many of the
alias's calls are in this gateway on average, waiting at the pacer or admitted and not yet
settled (``planner.replica_shares``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gateway.aliases import Alias, Aliases
from gateway.pacing import CallEstimate, CallUsage, PacerUnavailable, Permit
from planner.budgets import Budgets, TokenClass, header_classes
from planner.classify import Classification, LimitType
from planner.pacer import EVERY_BUCKET, PacerCore, classes_to_hold, hold_seconds
from planner.provisional_cut import ProvisionalCuts
from planner.replica_shares import PresenceAverage

log = logging.getLogger(__name__)

# the gateway's own cache-counting verdict stands this long against the planner's pushed belief
# (the planner adopts it at its next tick, 15 s; a planner that does not leaves it to lapse)
VERDICT_HOLD_S = 120.0


def token_class(alias: Alias) -> TokenClass:
    """OpenAI limits combined tokens (input + output); Anthropic input and output separately."""
    return "combined" if alias.flavour == "openai" else "input"


def seed_budgets(alias: Alias) -> Budgets:
    seed = alias.pacer
    return Budgets(
        calls_per_s=seed.calls_per_s,
        tokens_per_s=seed.tokens_per_s,
        output_tokens_per_s=seed.output_tokens_per_s,
        inflight_tokens=seed.inflight_tokens,
    )


@dataclass
class _AliasPacer:
    core: PacerCore
    # the planner's budgets with a 429's provisional cuts applied (what ``core`` paces at)
    provisional: ProvisionalCuts
    waiters: dict[str, asyncio.Future[float]] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    failure: str | None = None
    recounted_at: float | None = None  # the gateway's own cache-counting verdict (its clock)
    share: float = 1.0  # of the alias's budgets, among the gateway replicas that serve it
    # the calls present (waiting or admitted, not settled), averaged: the replica's demand
    # (starting at 0 at any time: the average of a count that was 0 is 0)
    presence: PresenceAverage = field(default_factory=lambda: PresenceAverage(0.0))

    def apply(self, now: float) -> None:
        """Pace at the provisional budgets, times this replica's share."""
        self.core.set_budgets(scaled(self.provisional.budgets(), self.share), now)
        self.changed.set()


def scaled(budgets: Budgets, share: float) -> Budgets:
    """Every budget times ``share`` (a replica's part of the alias's)."""
    if share == 1.0:
        return budgets
    output = budgets.output_tokens_per_s
    return Budgets(
        calls_per_s=budgets.calls_per_s * share,
        tokens_per_s=budgets.tokens_per_s * share,
        output_tokens_per_s=None if output is None else output * share,
        inflight_tokens=budgets.inflight_tokens * share,
    )


class InProcessPacer:
    """Local token-bucket pacing per alias (see module docstring)."""

    def __init__(self, aliases: Aliases, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._aliases = {a.name: a for a in aliases}
        self._pacers: dict[str, _AliasPacer] = {}
        self._ids = itertools.count()
        for alias in aliases:
            seed = seed_budgets(alias)
            self._pacers[alias.name] = _AliasPacer(
                core=self._core(alias, seed),
                provisional=ProvisionalCuts(seed, cooldown_s=alias.pacer.cooldown_s),
            )

    def _core(self, alias: Alias, budgets: Budgets) -> PacerCore:
        return PacerCore(
            budgets,
            alias.pacer.burst_s,
            stated_burst_s=alias.pacer.stated_burst_s,
            token_class=token_class(alias),
            cached_input_counts=alias.cached_input_counts,
            now=self._clock(),
            urgent_share=alias.pacer.urgent_share,
        )

    async def start(self) -> None:
        for pacer in self._pacers.values():
            if pacer.task is None:
                pacer.task = asyncio.create_task(self._wake_loop(pacer))

    async def close(self) -> None:
        tasks = [p.task for p in self._pacers.values() if p.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for pacer in self._pacers.values():
            pacer.task = None

    def budgets(self, alias: str) -> Budgets:
        """What this gateway paces the alias at now (a provisional cut and its replica share
        included)."""
        return self._pacer(alias).core.budgets

    def share(self, alias: str) -> float:
        """This gateway's share of the alias's budgets (1: its only gateway)."""
        return self._pacer(alias).share

    def set_share(self, alias: str, share: float) -> None:
        """Pace the alias at ``share`` of its budgets from now (``gateway.replica_sync``)."""
        if not (0.0 < share <= 1.0 and math.isfinite(share)):
            raise ValueError(f"alias {alias}: a replica's share must be in (0, 1], got {share}")
        pacer = self._pacer(alias)
        if abs(share - pacer.share) > 1e-9:
            pacer.share = share
            pacer.apply(self._clock())

    def demand(self, alias: str) -> float:
        """How many of the alias's calls were in this gateway on average lately (waiting at the
        pacer or admitted and not yet settled): what its harnesses ask of the alias."""
        return self._pacer(alias).presence.average(self._clock())

    def pushed_budgets(self, alias: str) -> Budgets:
        """The alias's budgets as last set (the planner's, without provisional cuts)."""
        return self._pacer(alias).provisional.pushed

    def levels(self, alias: str) -> dict[str, float]:
        """The alias's bucket levels now (what may be sent at once)."""
        return self._pacer(alias).core.levels(self._clock())

    def set_budgets(self, alias: str, budgets: Budgets) -> None:
        """The planner's budgets: a provisional cut of a class stands until they move it
        (``planner.provisional_cut``)."""
        pacer = self._pacer(alias)
        now = self._clock()
        pacer.provisional.settle(now, budgets)
        pacer.apply(now)
        pacer.failure = None

    def cut_at_429(self, alias: str, view: Classification) -> None:
        """A call's first 429: the classes it hits are cut at once (and a limit it states caps
        its class), until the planner's next push moves them (``planner.provisional_cut``)."""
        pacer = self._pacers.get(alias)
        if pacer is None:
            return
        now = self._clock()
        moved = pacer.provisional.first_429(
            now, view.limit_type, token_class(self._aliases[alias]), view.limits
        )
        if moved:
            pacer.apply(now)
            log.info(
                "alias %s: a %s 429 cut %s at once, until the planner's next budgets",
                alias,
                view.limit_type.value,
                ", ".join(c.value for c in moved),
            )

    def set_old_tasks_first(self, alias: str, on: bool) -> None:
        """The queue order under an output limit (``PacerCore.set_old_tasks_first``)."""
        pacer = self._pacer(alias)
        pacer.core.set_old_tasks_first(on)
        pacer.changed.set()

    def cached_input_counts(self, alias: str) -> bool:
        """Whether the alias's pacer charges cache reads against its token budget."""
        return self._pacer(alias).core.cached_input_counts

    def recount(self, alias: str, counts: bool) -> None:
        """The gateway's own verdict at a token 429 (``gateway.send_log``): pace with cache
        reads counted or not at once. The planner adopts it at its next tick and pushes it
        back; a sync before that does not undo it (``holds_own_verdict``)."""
        pacer = self._pacer(alias)
        pacer.core.cached_input_counts = counts
        pacer.recounted_at = self._clock()
        pacer.changed.set()

    def holds_own_verdict(self, alias: str) -> bool:
        """The gateway recounted the alias within ``VERDICT_HOLD_S``: the planner's belief
        may not have caught up yet."""
        at = self._pacer(alias).recounted_at
        return at is not None and self._clock() - at < VERDICT_HOLD_S

    def observe_remaining(self, alias: str, remaining: Mapping[LimitType, float]) -> None:
        pacer = self._pacers.get(alias)
        if pacer is None or not remaining:
            return
        spec = self._aliases[alias]
        if pacer.share != 1.0:
            # the provider's buckets are the alias's: this replica may take its share of them
            remaining = {limit: left * pacer.share for limit, left in remaining.items()}
        pacer.core.observe_remaining(
            header_classes(
                remaining,
                token_class=token_class(spec),
                has_output_budget=pacer.core.budgets.output_tokens_per_s is not None,
            ),
            self._clock(),
        )

    def hold(
        self, alias: str, view: Classification | None = None, *, elapsed_s: float = 0.0
    ) -> None:
        pacer = self._pacers.get(alias)
        if pacer is None:
            return
        spec = self._aliases[alias]
        classes = (
            EVERY_BUCKET
            if view is None
            else classes_to_hold(
                view,
                token_class=token_class(spec),
                has_output_budget=pacer.core.budgets.output_tokens_per_s is not None,
            )
        )
        if classes:
            seconds = spec.pacer.hold_after_429_s
            if view is not None:
                seconds = hold_seconds(view, seconds)
            if seconds > elapsed_s:
                pacer.core.hold(classes, seconds - elapsed_s, self._clock())

    def fail(self, alias: str, reason: str) -> None:
        """Stop admitting on ``alias`` (queued callers get ``PacerUnavailable``)."""
        pacer = self._pacer(alias)
        pacer.failure = reason
        for call_id, fut in list(pacer.waiters.items()):
            if pacer.core.cancel(call_id, self._clock()) and not fut.done():
                fut.set_exception(PacerUnavailable(reason))
            pacer.waiters.pop(call_id, None)

    def _pacer(self, alias: str) -> _AliasPacer:
        try:
            return self._pacers[alias]
        except KeyError:
            raise PacerUnavailable(f"no pacer for alias {alias!r}") from None

    async def acquire(self, alias: str, estimate: CallEstimate) -> Permit:
        pacer = self._pacer(alias)
        if pacer.failure is not None:
            raise PacerUnavailable(pacer.failure)
        start = self._clock()
        pacer.presence.step(+1, start)  # until settled, or until it stops waiting
        call_id = str(next(self._ids))
        admission = pacer.core.request(call_id, estimate, start)
        self._resolve(pacer, start)
        if admission.admitted:
            return Permit(alias=alias, call_id=call_id, estimate=estimate, waited_s=0.0)
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        pacer.waiters[call_id] = future
        pacer.changed.set()
        try:
            admitted_at = await future
        except asyncio.CancelledError:
            pacer.waiters.pop(call_id, None)
            now = self._clock()
            pacer.presence.step(-1, now)
            if not pacer.core.cancel(call_id, now):
                with contextlib.suppress(KeyError):
                    pacer.core.release(call_id, None, now)
                pacer.changed.set()
            raise
        except BaseException:
            pacer.presence.step(-1, self._clock())  # refused (the alias's pacer failed)
            raise
        return Permit(alias=alias, call_id=call_id, estimate=estimate, waited_s=admitted_at - start)

    async def settle(self, permit: Permit, usage: CallUsage | None) -> None:
        pacer = self._pacer(permit.alias)
        now = self._clock()
        pacer.presence.step(-1, now)
        pacer.core.release(permit.call_id, usage, now)
        self._resolve(pacer, now)
        pacer.changed.set()

    def _resolve(self, pacer: _AliasPacer, now: float) -> None:
        for call_id in pacer.core.poll(now):
            future = pacer.waiters.pop(call_id, None)
            if future is not None and not future.done():
                future.set_result(now)

    async def _wake_loop(self, pacer: _AliasPacer) -> None:
        while True:
            now = self._clock()
            self._resolve(pacer, now)
            ready = pacer.core.next_ready_at(now)
            pacer.changed.clear()
            timeout = None if ready is None or math.isinf(ready) else max(0.0, ready - now)
            # ``asyncio.timeout``, not ``wait_for``: on 3.11 a ``wait_for`` whose event is set
            # as the task is cancelled swallows the cancellation, and ``close`` then waited
            # for a loop that went on (a release's ``changed.set()`` just before a shutdown)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await pacer.changed.wait()
