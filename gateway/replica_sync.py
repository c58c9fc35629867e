"""Keeps this gateway's share of each alias's budgets current among the replicas serving it.

Every ``interval_s`` it reports the pacer's demand per alias to the registry
(``gateway.replicas``), reads every live replica's, and sets the pacer's share
(``planner.replica_shares``). The first exchange happens at ``start`` and must succeed: a gateway
told to share its budgets that cannot reach the registry does not know how many replicas pace
the alias, so it does not start (the error names ``EVALFLEET_VALKEY_URL``). Later failures keep
the last shares and are logged once per outage: a replica that loses the registry goes on at its
last known part of the budgets, neither stalling its harnesses nor taking the whole budget. On
``stop`` it leaves the registry, so the other replicas take its share at their next exchange.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from evalfleet.errors import ServiceUnavailable
from gateway.pacing import Pacer
from gateway.replicas import RegistryUnavailable, ReplicaRegistry
from planner.replica_shares import replica_share

log = logging.getLogger(__name__)

__all__ = ["ReplicaSync"]


class ReplicaSync:
    """The exchange loop of one gateway (see the module docstring)."""

    def __init__(
        self,
        pacer: Pacer,
        registry: ReplicaRegistry,
        aliases: Sequence[str],
        *,
        interval_s: float = 1.0,
    ) -> None:
        self.pacer = pacer
        self.registry = registry
        self.aliases = list(aliases)
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._failing = False

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
        demands = {alias: self.pacer.demand(alias) for alias in self.aliases}
        everyone = await self.registry.exchange(demands)
        for alias in self.aliases:
            share = replica_share(self.registry.replica_id, everyone.get(alias, {}))
            self.pacer.set_share(alias, share)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
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
