"""A token 429's reading of the provider's bucket, kept through the storm it starts.

A 429 of a token limit that states what is left of its bucket (``remaining``) tells, with a
reading shortly before it, what the provider charged in between: whether it counted the cache
reads (``planner.cache_counting.throttle_window``, judged by ``tasks.plan_counting``). It can be
judged only once every call sent before it has been recorded. In a storm the next 429 comes
sooner than that, so the gateway keeps the storm's first 429 (``followed_by``): a 429 replaces
it only after a quiet ``STORM_GAP_S``. Owned here: that rule and the JSON form the gateway's
recorder writes into ``alias_observations.limits`` (``THROTTLE_READING_KEY``) and
``ledger.charges.throttled_bucket`` reads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from planner.cache_counting import STORM_GAP_S

__all__ = ["TOKEN_LIMIT_TYPES", "ThrottleReading", "numeric_entries"]

# the 429s whose stated remaining is a token bucket (the counted input or combined class)
TOKEN_LIMIT_TYPES = ("tokens", "input_tokens")


@dataclass(frozen=True)
class ThrottleReading:
    """The first token 429 of a storm: its limit type, stated limits and remaining (per limit
    type, per minute), when its attempt was sent, and when the storm's latest token 429's was."""

    limit_type: str
    limits: dict[str, float]
    remaining: dict[str, float]
    sent_at: datetime
    last_at: datetime
    # the gateway judged it at once (``gateway.send_log``): the provider counts the cache reads
    # its pacer did not charge, and the pacer counts them since
    gateway_counts: bool = False

    @classmethod
    def of_429(
        cls,
        limit_type: str,
        limits: dict[str, float],
        remaining: dict[str, float],
        sent_at: datetime,
        gateway_counts: bool = False,
    ) -> ThrottleReading | None:
        """A 429's own reading (None: not a token limit's, or it states no remaining)."""
        if limit_type not in TOKEN_LIMIT_TYPES or not remaining or not limits:
            return None
        return cls(limit_type, dict(limits), dict(remaining), sent_at, sent_at, gateway_counts)

    def followed_by(self, later: ThrottleReading | None) -> ThrottleReading:
        """The reading kept once ``later`` (a later token 429's, or None) is seen: the later one
        after a quiet ``STORM_GAP_S`` (a new storm), else this one, its storm extended (and
        judged by the gateway to say cache reads count where any of its 429s was)."""
        if later is None:
            return self
        if (later.sent_at - self.last_at).total_seconds() >= STORM_GAP_S:
            return later
        # the gateway's verdict on any 429 of the storm is the storm's
        return replace(
            self,
            last_at=max(self.last_at, later.sent_at),
            gateway_counts=self.gateway_counts or later.gateway_counts,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "limit_type": self.limit_type,
            "limits": self.limits,
            "remaining": self.remaining,
            "sent_at": self.sent_at.timestamp(),
            "last_at": self.last_at.timestamp(),
            "gateway_counts": self.gateway_counts,
        }

    @classmethod
    def from_json(cls, raw: object) -> ThrottleReading | None:
        """The stored reading (None: absent or not of this form)."""
        if not isinstance(raw, dict):
            return None
        limit_type = raw.get("limit_type")
        sent_at, last_at = _number(raw.get("sent_at")), _number(raw.get("last_at"))
        if not isinstance(limit_type, str) or sent_at is None or last_at is None:
            return None
        return cls(
            limit_type,
            numeric_entries(raw.get("limits")),
            numeric_entries(raw.get("remaining")),
            datetime.fromtimestamp(sent_at, tz=UTC),
            datetime.fromtimestamp(last_at, tz=UTC),
            raw.get("gateway_counts") is True,
        )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def numeric_entries(raw: object) -> dict[str, float]:
    """The numeric entries of a JSON object (anything else: none)."""
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, value in raw.items() if (v := _number(value)) is not None}
