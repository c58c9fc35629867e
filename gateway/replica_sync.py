"""Keeps this gateway's share of each alias's budgets current among the replicas serving it.

Every ``interval_s`` it reports the pacer's demand per alias to the registry
(``gateway.replicas``), reads every live replica's, and sets the pacer's share
(``planner.replica_shares``). The first exchange happens at ``start`` and must succeed: a gateway
told to share its budgets that cannot reach the registry does not know how many replicas pace
the alias, so it does not start (the error names ``EVALFLEET_VALKEY_URL``). Later failures keep
the last shares and are logged once per outage: a replica that loses the registry goes on at its
last known part of the budgets, neither stalling its harnesses nor taking the whole budget. On
``stop`` it leaves the registry, so the other replicas take its share at their next exchange.

It also carries 429s between replicas. A call's first 429 at this replica (``report_429``) is
posted at once (the loop wakes for it), and each exchange hands the ones the other replicas
posted, with their age, to ``on_peer_429``, which cuts and holds this replica's pacer as a 429
of its own would, the hold ending when the drawing replica's does
(``gateway.feedback.ProviderFeedback.peer_rejected``). Without it a replica whose share had
not drawn the 429 went on at its full share into the bucket another had found empty, until
its own 429s or the planner's next tick (up to 15 s). Readings that cannot be posted in an
outage are dropped: by the time the registry is back, they are no longer news.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from evalfleet.errors import ServiceUnavailable
from gateway.pacing import Pacer
from gateway.replicas import PeerThrottle, RegistryUnavailable, ReplicaRegistry
from planner.classify import Classification, LimitType
from planner.replica_shares import replica_share

log = logging.getLogger(__name__)

__all__ = ["POST_GATHER_S", "ReplicaSync"]

#: how long a 429 to post waits for others of the same storm before the loop posts them together
POST_GATHER_S = 0.05


class ReplicaSync:
    """The exchange loop of one gateway (see the module docstring)."""

    def __init__(
        self,
        pacer: Pacer,
        registry: ReplicaRegistry,
        aliases: Sequence[str],
        *,
        interval_s: float = 1.0,
        on_peer_429: Callable[[str, Classification, float], None] = lambda _a, _v, _age: None,
    ) -> None:
        self.pacer = pacer
        self.registry = registry
        self.aliases = list(aliases)
        self.interval_s = interval_s
        self.on_peer_429 = on_peer_429  # applies another replica's 429 to this one's pacer
        # per alias, the latest first-429 reading of each limit type since the last post: a
        # storm's many say the same, and the peers' cut is once per cooldown anyway
        self._outbox: dict[str, dict[LimitType, PeerThrottle]] = {a: {} for a in self.aliases}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def report_429(self, alias: str, view: Classification) -> None:
        """A call's first 429 at this replica: post it to the others at once."""
        if alias in self._outbox:
            self._outbox[alias][view.limit_type] = PeerThrottle.of(view)
            self._wake.set()

    async def start(self) -> None:
        try:
            await self.exchange()
        except RegistryUnavailable as exc:
            await self.registry.close()
            raise ServiceUnavailable(
                "EVALFLEET_VALKEY_URL",
                "the gateway shares its aliases' budgets with its other replicas through it "
                f"and cannot reach it ({exc})",
            ) from None
        self._task = asyncio.create_task(self._loop(), name="evalfleet-replica-sync")

    async def exchange(self) -> None:
        """One report and read; sets every alias's share. Raises ``RegistryUnavailable``."""
        outbox, self._outbox = self._outbox, {alias: {} for alias in self.aliases}
        self._wake.clear()
        news = await self.registry.swap_throttles(
            {alias: list(readings.values()) for alias, readings in outbox.items()}
        )
        for alias, items in news.items():
            for item in items:
                self.on_peer_429(alias, item.reading.classification(), item.age_s)
        demands = {alias: self.pacer.demand(alias) for alias in self.aliases}
        everyone = await self.registry.exchange(demands)
        for alias in self.aliases:
            share = replica_share(self.registry.replica_id, everyone.get(alias, {}))
            self.pacer.set_share(alias, share)

    async def _loop(self) -> None:
        while True:
            # the interval, or sooner when this replica has a 429 to post
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
                    await asyncio.sleep(POST_GATHER_S)  # a storm's first 429s in one post
            try:
                await self.exchange()
            except RegistryUnavailable as exc:
                if not self._failing:
                    log.error("replica registry unreachable, pacing at the last shares: %s", exc)
                self._failing = True
                continue
            if self._failing:
                log.warning("replica registry reachable again")
            self._failing = False

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            await self.registry.leave()
        except RegistryUnavailable as exc:
            log.warning("could not leave the replica registry (reaped after its TTL): %s", exc)
        await self.registry.close()
