"""The Prefect-backed pacer: an alias's budgets live in Prefect global concurrency limits.

Per alias, four limits (visible and editable in the Prefect UI; the planner writes them):

* ``evalfleet-pacer-<alias>-calls``: a rate limit, ``slot_decay_per_second`` = calls/s,
  ``limit`` = calls/s x burst (the burst a full bucket allows);
* ``evalfleet-pacer-<alias>-tokens``: a rate limit for the counted (input or combined) tokens;
* ``evalfleet-pacer-<alias>-output-tokens``: a rate limit for output tokens, when budgeted
  (configured, or written by the planner once the provider's headers state an output limit);
* ``evalfleet-pacer-<alias>-inflight-tokens``: a plain concurrency limit (no decay).

Acquiring a Prefect limit per call is one HTTP round trip that serialises per process (~24/s
measured, PREFECT-NOTES.md), far below the gateway's 100+ calls/s. So calls are paced
locally by ``InProcessPacer`` (the ``planner.pacer`` core), whose budgets are re-read from
these limits every ``sync_interval_s``: Prefect is the source of truth, and an edit in the UI
takes effect within one interval. Reads are strict: a missing limit fails the alias (calls get
503, nothing is admitted unpaced) until it exists again. An inactive limit is not enforced —
Prefect's own meaning of ``active=False`` — and a warning is logged.

``ensure_limits`` creates missing limits from the alias's seed (never overwriting what an
operator or the planner set); ``push_budgets`` upserts them (the planner's write). Whether the
provider counts cache reads against its token limit is the alias config's belief until the
planner infers otherwise from the provider's headers (``planner.cache_counting``); it then
writes the Prefect variable ``evalfleet-pacer-<alias>-cached-input-counts``, which each sync
applies to the local pacer.

The pacer holds one Prefect client from ``start`` to ``close`` and every sync reads through
it: building a client costs ~50 ms of CPU on the event loop (its HTTP transport and TLS
context), and a client per read (three per alias per sync) stalled every call the gateway was
relaying, which set the Prefect pacer's p99 added latency at ~55 ms on a slow machine.

Several gateway processes may serve an alias: each reads the same limits and paces at its
share of them (``gateway.replica_sync``). The limits' active slots are not mirrored, so the UI
shows budgets, not usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.actions import (
    GlobalConcurrencyLimitCreate,
    VariableCreate,
    VariableUpdate,
)
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from gateway.aliases import Alias, Aliases
from gateway.pacer_local import InProcessPacer, seed_budgets
from planner.budgets import Budgets

log = logging.getLogger(__name__)

UNENFORCED = 1e12
"""Budget used for a class whose Prefect limit is inactive (Prefect admits everything)."""


def limit_names(alias: str) -> dict[str, str]:
    """The Prefect limit names of an alias, by budget field."""
    prefix = f"evalfleet-pacer-{alias}"
    return {
        "calls_per_s": f"{prefix}-calls",
        "tokens_per_s": f"{prefix}-tokens",
        "output_tokens_per_s": f"{prefix}-output-tokens",
        "inflight_tokens": f"{prefix}-inflight-tokens",
    }


def limit_values(budgets: Budgets, burst_s: float) -> dict[str, tuple[int, float | None]]:
    """(limit, slot_decay_per_second) per budget field for these budgets."""
    out: dict[str, tuple[int, float | None]] = {
        "calls_per_s": (max(1, math.ceil(budgets.calls_per_s * burst_s)), budgets.calls_per_s),
        "tokens_per_s": (max(1, math.ceil(budgets.tokens_per_s * burst_s)), budgets.tokens_per_s),
        "inflight_tokens": (max(1, math.ceil(budgets.inflight_tokens)), None),
    }
    if budgets.output_tokens_per_s is not None:
        rate = budgets.output_tokens_per_s
        out["output_tokens_per_s"] = (max(1, math.ceil(rate * burst_s)), rate)
    return out


@contextlib.asynccontextmanager
async def _using(client: PrefectClient | None) -> AsyncIterator[PrefectClient]:
    """The caller's open client, else one opened (and closed) for this read."""
    if client is not None:
        yield client
        return
    async with get_client() as opened:
        yield opened


async def ensure_limits(alias: Alias, client: PrefectClient | None = None) -> list[str]:
    """Create the alias's limits that do not exist yet, from its seed; returns those created."""
    created = []
    names = limit_names(alias.name)
    async with _using(client) as c:
        for field, (limit, decay) in limit_values(seed_budgets(alias), alias.pacer.burst_s).items():
            try:
                await c.read_global_concurrency_limit_by_name(names[field])
                continue
            except ObjectNotFound:
                pass
            kwargs: dict[str, Any] = {"name": names[field], "limit": limit}
            if decay is not None:
                kwargs["slot_decay_per_second"] = decay
            try:
                await c.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(**kwargs))
                created.append(names[field])
            except ObjectAlreadyExists:
                continue  # another process created it meanwhile
    return created


def counting_variable(alias: str) -> str:
    """The Prefect variable holding whether the alias's provider counts cache reads, as the
    planner last inferred it (absent: the alias config's belief)."""
    return f"evalfleet-pacer-{alias}-cached-input-counts"


def old_first_variable(alias: str) -> str:
    """The Prefect variable holding whether the alias's pacer puts old tasks' calls first under
    an output limit, as the planner last decided (``Decision.old_tasks_first``; absent: yes)."""
    return f"evalfleet-pacer-{alias}-old-tasks-first"


async def push_budgets(
    alias: Alias,
    budgets: Budgets,
    *,
    cached_input_counts: bool | None = None,
    old_tasks_first: bool | None = None,
    client: PrefectClient | None = None,
) -> None:
    """Write budgets to the alias's limits (create or update: the planner's tick), and the
    cache-counting belief and the queue order when given; through ``client`` when one is open
    (the planner's tick pushes every alias through one)."""
    names = limit_names(alias.name)
    async with _using(client) as c:
        for field, (limit, decay) in limit_values(budgets, alias.pacer.burst_s).items():
            await c.upsert_global_concurrency_limit_by_name(names[field], limit, decay)
        if cached_input_counts is not None:
            await _write_flag(c, counting_variable(alias.name), cached_input_counts)
        if old_tasks_first is not None:
            await _write_flag(c, old_first_variable(alias.name), old_tasks_first)


async def _write_flag(client: PrefectClient, name: str, value: bool) -> None:
    """Create or overwrite a boolean Prefect variable through ``client`` (``Variable.aset``
    would build a client of its own outside a flow run)."""
    if await client.read_variable_by_name(name) is None:
        try:
            await client.create_variable(VariableCreate(name=name, value=value))
            return
        except ObjectAlreadyExists:
            pass  # another process created it meanwhile: overwrite it
    await client.update_variable(VariableUpdate(name=name, value=value))


async def _read_flag(name: str, default: bool, client: PrefectClient | None = None) -> bool:
    """A boolean Prefect variable the planner writes; ``default`` when absent or not a bool."""
    async with _using(client) as c:
        variable = await c.read_variable_by_name(name)
    value = None if variable is None else variable.value
    return value if isinstance(value, bool) else default


async def read_counting(alias: Alias, client: PrefectClient | None = None) -> bool:
    """Whether the alias's pacer counts cache reads: the planner's inference, else the config."""
    return await _read_flag(counting_variable(alias.name), alias.cached_input_counts, client)


async def read_old_tasks_first(alias: Alias, client: PrefectClient | None = None) -> bool:
    """Whether the alias's pacer puts old tasks first under an output limit (absent: yes)."""
    return await _read_flag(old_first_variable(alias.name), True, client)


async def read_budgets(alias: Alias, client: PrefectClient | None = None) -> Budgets:
    """The alias's budgets as its Prefect limits state them now (strict: missing → error)."""
    names = limit_names(alias.name)
    values: dict[str, float | None] = {"output_tokens_per_s": None}
    async with _using(client) as c:
        for field, name in names.items():
            try:
                gcl = await c.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                if field == "output_tokens_per_s" and alias.pacer.output_tokens_per_s is None:
                    # not configured, and the planner has not adopted a stated output limit
                    continue
                raise
            if not gcl.active:
                log.warning("Prefect limit %s is inactive: not enforced", name)
                values[field] = UNENFORCED
            elif field == "inflight_tokens":
                values[field] = float(gcl.limit)
            elif not gcl.slot_decay_per_second:
                raise ObjectNotFound(http_exc=ValueError(f"{name} has no slot decay"))
            else:
                values[field] = float(gcl.slot_decay_per_second)
    return Budgets(
        calls_per_s=float(values["calls_per_s"] or 0),
        tokens_per_s=float(values["tokens_per_s"] or 0),
        output_tokens_per_s=values["output_tokens_per_s"],
        inflight_tokens=float(values["inflight_tokens"] or 0),
    )


class PrefectPacer(InProcessPacer):
    """Local pacing with budgets synced from the aliases' Prefect limits."""

    def __init__(
        self,
        aliases: Aliases,
        *,
        sync_interval_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        client_factory: Callable[[], PrefectClient] = get_client,
    ) -> None:
        super().__init__(aliases, clock=clock)
        self._client_factory = client_factory
        self._alias_list = list(aliases)
        self.sync_interval_s = sync_interval_s
        self._sync_task: asyncio.Task[None] | None = None
        self._client: PrefectClient | None = None  # open from start to close (module docstring)
        self.syncs = 0

    async def start(self) -> None:
        client = self._client_factory()
        await client.__aenter__()
        self._client = client
        try:
            for alias in self._alias_list:
                created = await ensure_limits(alias, client)
                if created:
                    log.info("created Prefect limits %s from alias %s's seed", created, alias.name)
            await self.sync()
            await super().start()
        except BaseException:
            await self._close_client()
            raise
        self._sync_task = asyncio.create_task(self._sync_loop(), name="evalfleet-pacer-sync")

    async def sync(self) -> None:
        """Re-read every alias's limits once and apply them."""
        for alias in self._alias_list:
            try:
                budgets = await read_budgets(alias, self._client)
            except ObjectNotFound:
                self.fail(
                    alias.name, f"a Prefect concurrency limit of alias {alias.name} is missing"
                )
                log.error("alias %s: a Prefect limit is missing; admitting nothing", alias.name)
                continue
            # against what was last set: what it paces at differs by a provisional cut (kept
            # by a push that does not move its class) and by a replica's share
            if budgets != self.pushed_budgets(alias.name) or self._pacer(alias.name).failure:
                self.set_budgets(alias.name, budgets)
            core = self._pacer(alias.name).core
            counts = await read_counting(alias, self._client)
            if counts != core.cached_input_counts and not self.holds_own_verdict(alias.name):
                log.info(
                    "alias %s: pacing with cache reads %s",
                    alias.name,
                    "counted" if counts else "not counted",
                )
                core.cached_input_counts = counts
            old_first = await read_old_tasks_first(alias, self._client)
            if old_first != core.old_tasks_first:
                log.info(
                    "alias %s: an output-bound queue goes %s",
                    alias.name,
                    "oldest task first" if old_first else "in arrival order",
                )
                self.set_old_tasks_first(alias.name, old_first)
        self.syncs += 1

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval_s)
            try:
                await self.sync()
            except Exception as exc:  # noqa: BLE001 - keep pacing on the last budgets; logged
                log.error("syncing pacer limits from Prefect failed: %s", type(exc).__name__)

    async def close(self) -> None:
        if self._sync_task is not None:
            self._sync_task.cancel()
            await asyncio.gather(self._sync_task, return_exceptions=True)
            self._sync_task = None
        await self._close_client()
        await super().close()

    async def _close_client(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.__aexit__(None, None, None)
