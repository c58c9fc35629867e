"""Which gateway replicas serve each alias, and what each one's pacer is asked for.

A replica reports, every ``share_interval_s``, its demand per alias (``planner.replica_shares``
says what that is and how the split follows from it) and reads back every live replica's.
With ``EVALFLEET_GATEWAY_BUDGET_SHARING=solo`` (the default) there is no registry: the gateway
is each alias's only one and paces at the full budgets. Otherwise:

* ``ValkeyRegistry`` (``valkey``): replicas meet in Valkey/Redis (``EVALFLEET_VALKEY_URL``).
  Per alias a sorted set of replicas scored by their last report, and a hash of their demands;
  one Lua script per report reaps replicas silent for ``replica_ttl_s``, writes this one's
  demand and returns all of them, atomically. Liveness is judged by the Valkey server's clock
  (``TIME``), never a replica's own, so a replica with a skewed clock cannot reap the others
  (nor keep a dead one alive). A replica that stops cleanly leaves at once; one that dies is
  reaped after ``replica_ttl_s``, until when the others keep its share unused (safe: under the
  budget, never over).
* ``MemoryRegistry``: the same protocol in one process, shared by several gateways under test,
  with the clock passed in.

Keys: ``evalfleet:pacer:{<alias>}:replicas`` and ``evalfleet:pacer:{<alias>}:demand`` (the
braces keep an alias's two keys in one Valkey cluster slot); both expire after ten TTLs without
a report, so an alias no gateway serves any more leaves nothing behind.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

__all__ = [
    "MemoryRegistry",
    "RegistryUnavailable",
    "ReplicaRegistry",
    "ValkeyRegistry",
    "demand_key",
    "replicas_key",
]


class RegistryUnavailable(Exception):
    """The shared registry could not be read or written (its message names no secret)."""


class ReplicaRegistry(Protocol):
    """Where replicas report their demand per alias and read everyone's."""

    replica_id: str

    async def exchange(self, demands: Mapping[str, float]) -> dict[str, dict[str, float]]:
        """Report this replica's demand per alias; return, per alias, every live replica's
        demand (this one's included). Raises ``RegistryUnavailable``."""

    async def leave(self) -> None:
        """Stop counting this replica (a clean shutdown): the others take its share at once."""

    async def close(self) -> None:
        """Release connections."""


class MemoryRegistry:
    """Replicas in one process (tests): a view per replica over one shared table."""

    def __init__(self, clock: Callable[[], float], ttl_s: float = 10.0) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._table: dict[str, dict[str, tuple[float, float]]] = {}  # alias -> id -> (at, d)

    def replica(self, replica_id: str) -> _MemoryReplica:
        return _MemoryReplica(self, replica_id)

    def _exchange(
        self, replica_id: str, demands: Mapping[str, float]
    ) -> dict[str, dict[str, float]]:
        now = self._clock()
        out: dict[str, dict[str, float]] = {}
        for alias, demand in demands.items():
            rows = self._table.setdefault(alias, {})
            for other, (at, _) in list(rows.items()):
                if at <= now - self._ttl_s:
                    del rows[other]
            rows[replica_id] = (now, demand)
            out[alias] = {other: d for other, (_, d) in rows.items()}
        return out

    def _leave(self, replica_id: str) -> None:
        for rows in self._table.values():
            rows.pop(replica_id, None)


class _MemoryReplica:
    def __init__(self, registry: MemoryRegistry, replica_id: str) -> None:
        self._registry = registry
        self.replica_id = replica_id

    async def exchange(self, demands: Mapping[str, float]) -> dict[str, dict[str, float]]:
        return self._registry._exchange(self.replica_id, demands)

    async def leave(self) -> None:
        self._registry._leave(self.replica_id)

    async def close(self) -> None:
        return None


def replicas_key(alias: str) -> str:
    return f"evalfleet:pacer:{{{alias}}}:replicas"


def demand_key(alias: str) -> str:
    return f"evalfleet:pacer:{{{alias}}}:demand"


# KEYS: replicas (sorted set), demand (hash). ARGV: replica id, demand, ttl in ms.
# Returns the demand hash as a flat [id, demand, ...] list.
_EXCHANGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
for _, id in ipairs(stale) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl * 10)
redis.call('PEXPIRE', KEYS[2], ttl * 10)
return redis.call('HGETALL', KEYS[2])
"""

_LEAVE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""


class ValkeyRegistry:
    """Replicas meet in Valkey/Redis (see the module docstring)."""

    def __init__(self, url: str, replica_id: str, ttl_s: float, timeout_s: float = 2.0) -> None:
        import redis.asyncio as aredis

        self.replica_id = replica_id
        self._ttl_ms = max(1, math.ceil(ttl_s * 1000))
        self._client: Any = aredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._exchange_script = self._client.register_script(_EXCHANGE)
        self._leave_script = self._client.register_script(_LEAVE)
        self._reported: set[str] = set()

    async def exchange(self, demands: Mapping[str, float]) -> dict[str, dict[str, float]]:
        from redis.exceptions import RedisError

        out: dict[str, dict[str, float]] = {}
        try:
            for alias, demand in demands.items():
                self._reported.add(alias)
                flat = await self._exchange_script(
                    keys=[replicas_key(alias), demand_key(alias)],
                    args=[self.replica_id, repr(float(demand)), self._ttl_ms],
                )
                out[alias] = _pairs(flat)
        except (RedisError, OSError) as exc:
            raise RegistryUnavailable(f"Valkey: {type(exc).__name__}: {exc}") from None
        return out

    async def leave(self) -> None:
        from redis.exceptions import RedisError

        try:
            for alias in sorted(self._reported):
                await self._leave_script(
                    keys=[replicas_key(alias), demand_key(alias)], args=[self.replica_id]
                )
        except (RedisError, OSError) as exc:
            raise RegistryUnavailable(f"Valkey: {type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        await self._client.aclose()


def _pairs(flat: list[Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for i in range(0, len(flat) - 1, 2):
        key, value = flat[i], flat[i + 1]
        name = key.decode() if isinstance(key, bytes) else str(key)
        raw = value.decode() if isinstance(value, bytes) else str(value)
        try:
            demand = float(raw)
        except ValueError:
            continue  # a value no replica wrote: leave it out rather than guess
        if math.isfinite(demand) and demand >= 0.0:
            out[name] = demand
    return out
