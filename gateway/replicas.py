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

A replica's 429 is news for the others: the provider's bucket it found empty is everyone's.
Each replica posts the reading of every call's first 429 (``PeerThrottle``) and, at its next
exchange, takes the ones the others posted since its last read, to cut and hold its own pacer
as the replica that drew it did (``gateway.replica_sync``). A reading older than
``THROTTLE_NEWS_S`` by the registry's clock is no longer news: the planner's tick has acted on
it by then.

Keys: ``evalfleet:pacer:{<alias>}:replicas``, ``:demand`` and ``:throttles`` (a stream; the
braces keep an alias's keys in one Valkey cluster slot); all expire after ten TTLs without a
report, so an alias no gateway serves any more leaves nothing behind.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.classify import Classification, LimitType

log = logging.getLogger(__name__)

__all__ = [
    "THROTTLE_NEWS_S",
    "MemoryRegistry",
    "PeerThrottle",
    "RegistryUnavailable",
    "ReplicaRegistry",
    "ThrottleNews",
    "ValkeyRegistry",
    "demand_key",
    "replicas_key",
    "throttles_key",
]

#: how old (by the registry's clock) another replica's 429 may be and still cut this one's pacer
THROTTLE_NEWS_S = 15.0
#: how many 429 readings an alias's stream keeps (a storm's worth; older ones are not news)
THROTTLE_STREAM_LEN = 256


class RegistryUnavailable(Exception):
    """The shared registry could not be read or written (its message names no secret)."""


class PeerThrottle(BaseModel):
    """What one replica's first 429 of a call said, as the other replicas act on it: the
    parts of its ``Classification`` that the pacer's cut and hold read."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    status: int = Field(ge=100, le=599)
    limit_type: LimitType
    limits: dict[LimitType, float] = Field(default_factory=dict)
    remaining: dict[LimitType, float] = Field(default_factory=dict)
    retry_after_s: float | None = Field(default=None, ge=0.0)

    @classmethod
    def of(cls, view: Classification) -> PeerThrottle:
        return cls(
            status=view.status,
            limit_type=view.limit_type,
            limits=dict(view.limits),
            remaining=dict(view.remaining),
            retry_after_s=view.retry_after_s,
        )

    def classification(self) -> Classification:
        return Classification(
            status=self.status,
            limit_type=self.limit_type,
            limits=dict(self.limits),
            remaining=dict(self.remaining),
            retry_after_s=self.retry_after_s,
        )

    @classmethod
    def parse(cls, raw: bytes | str) -> PeerThrottle | None:
        """One stream entry; None (logged) for one no replica of this version wrote."""
        try:
            return cls.model_validate_json(raw, strict=False)
        except ValidationError as exc:
            log.warning("a peer's 429 reading that does not parse was skipped: %s", exc)
            return None


@dataclass(frozen=True, slots=True)
class ThrottleNews:
    """Another replica's 429 reading, ``age_s`` old by the registry's clock when read."""

    reading: PeerThrottle
    age_s: float


class ReplicaRegistry(Protocol):
    """Where replicas report their demand per alias and read everyone's."""

    replica_id: str

    async def exchange(self, demands: Mapping[str, float]) -> dict[str, dict[str, float]]:
        """Report this replica's demand per alias; return, per alias, every live replica's
        demand (this one's included). Raises ``RegistryUnavailable``."""

    async def swap_throttles(
        self, posted: Mapping[str, Sequence[PeerThrottle]]
    ) -> dict[str, list[ThrottleNews]]:
        """Post this replica's 429 readings per alias; return, per alias of ``posted`` (its
        keys are every alias this replica serves), the ones the other replicas posted since
        this replica's last swap and no older than its news age (``THROTTLE_NEWS_S`` by default;
        none at its first swap). Raises ``RegistryUnavailable``."""

    async def leave(self) -> None:
        """Stop counting this replica (a clean shutdown): the others take its share at once."""

    async def close(self) -> None:
        """Release connections."""


class MemoryRegistry:
    """Replicas in one process (tests): a view per replica over one shared table."""

    def __init__(
        self, clock: Callable[[], float], ttl_s: float = 10.0, news_s: float = THROTTLE_NEWS_S
    ) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._news_s = news_s
        self._table: dict[str, dict[str, tuple[float, float]]] = {}  # alias -> id -> (at, d)
        # alias -> [(seq, at, replica, reading)]; each replica's last seq read per alias
        self._throttles: dict[str, list[tuple[int, float, str, PeerThrottle]]] = {}
        self._read: dict[tuple[str, str], int] = {}
        self._seq = 0

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

    def _swap(
        self, replica_id: str, posted: Mapping[str, Sequence[PeerThrottle]]
    ) -> dict[str, list[ThrottleNews]]:
        now = self._clock()
        out: dict[str, list[ThrottleNews]] = {}
        for alias, readings in posted.items():
            stream = self._throttles.setdefault(alias, [])
            first = (alias, replica_id) not in self._read
            last = self._read.get((alias, replica_id), -1)
            out[alias] = (
                []
                if first
                else [
                    ThrottleNews(reading, now - at)
                    for seq, at, who, reading in stream
                    if seq > last and who != replica_id and at >= now - self._news_s
                ]
            )
            for reading in readings:
                self._seq += 1
                stream.append((self._seq, now, replica_id, reading))
            del stream[:-THROTTLE_STREAM_LEN]
            self._read[(alias, replica_id)] = self._seq
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

    async def swap_throttles(
        self, posted: Mapping[str, Sequence[PeerThrottle]]
    ) -> dict[str, list[ThrottleNews]]:
        return self._registry._swap(self.replica_id, posted)

    async def leave(self) -> None:
        self._registry._leave(self.replica_id)

    async def close(self) -> None:
        return None


def replicas_key(alias: str) -> str:
    return f"evalfleet:pacer:{{{alias}}}:replicas"


def demand_key(alias: str) -> str:
    return f"evalfleet:pacer:{{{alias}}}:demand"


def throttles_key(alias: str) -> str:
    return f"evalfleet:pacer:{{{alias}}}:throttles"


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

# KEYS: throttles (stream). ARGV: replica id, the last entry id this replica read ('' at its
# first swap: it starts from now), how old an entry may be in ms, the stream's length, ttl in ms,
# then this replica's readings to post. Returns {the last entry id, {reading, age in ms, ...}}
# for the others' entries after the one last read and no older than the age.
_SWAP_THROTTLES = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since = ARGV[2]
local oldest = tostring(now - tonumber(ARGV[3])) .. '-0'
local news = {}
if since ~= '' then
  local entries = redis.call('XRANGE', KEYS[1], '(' .. since, '+')
  for _, entry in ipairs(entries) do
    local id, fields = entry[1], entry[2]
    local ms = tonumber(string.match(id, '^(%d+)'))
    -- only entries shaped as this script writes them: r <replica> v <reading>
    local shaped = #fields == 4 and fields[1] == 'r' and fields[3] == 'v'
    if shaped and fields[2] ~= ARGV[1] and ms >= now - tonumber(ARGV[3]) then
      table.insert(news, fields[4])
      table.insert(news, now - ms)
    end
  end
end
for i = 6, #ARGV do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], '*', 'r', ARGV[1], 'v', ARGV[i])
end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local last_id = oldest
if #last > 0 then last_id = last[1][1] end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[5]) * 10)
return {last_id, news}
"""

_LEAVE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""


class ValkeyRegistry:
    """Replicas meet in Valkey/Redis (see the module docstring)."""

    def __init__(
        self,
        url: str,
        replica_id: str,
        ttl_s: float,
        timeout_s: float = 2.0,
        news_s: float = THROTTLE_NEWS_S,
    ) -> None:
        import redis.asyncio as aredis

        self.replica_id = replica_id
        self._ttl_ms = max(1, math.ceil(ttl_s * 1000))
        self._news_ms = max(1, math.ceil(news_s * 1000))
        self._client: Any = aredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._exchange_script = self._client.register_script(_EXCHANGE)
        self._leave_script = self._client.register_script(_LEAVE)
        self._swap_script = self._client.register_script(_SWAP_THROTTLES)
        self._reported: set[str] = set()
        self._last_read: dict[str, str] = {}  # alias -> the last throttles entry id read

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

    async def swap_throttles(
        self, posted: Mapping[str, Sequence[PeerThrottle]]
    ) -> dict[str, list[ThrottleNews]]:
        from redis.exceptions import RedisError

        out: dict[str, list[ThrottleNews]] = {}
        try:
            for alias, readings in posted.items():
                last_id, flat = await self._swap_script(
                    keys=[throttles_key(alias)],
                    args=[
                        self.replica_id,
                        self._last_read.get(alias, ""),
                        self._news_ms,
                        THROTTLE_STREAM_LEN,
                        self._ttl_ms,
                        *(r.model_dump_json() for r in readings),
                    ],
                )
                self._last_read[alias] = _text(last_id)
                out[alias] = [
                    ThrottleNews(reading, max(0.0, float(flat[i + 1]) / 1000.0))
                    for i in range(0, len(flat) - 1, 2)
                    if (reading := PeerThrottle.parse(flat[i])) is not None
                ]
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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(flat: list[Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for i in range(0, len(flat) - 1, 2):
        name, raw = _text(flat[i]), _text(flat[i + 1])
        try:
            demand = float(raw)
        except ValueError:
            continue  # a value no replica wrote: leave it out rather than guess
        if math.isfinite(demand) and demand >= 0.0:
            out[name] = demand
    return out
