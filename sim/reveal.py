"""What the simulated provider reveals to its clients, per the scenario's header style.

A 429 is turned into the classification a client (our gateway) would read from the real
response: with ``anthropic`` or ``openai`` headers the limit type named by the provider, the
stated limits/remaining/resets and the retry-after; with ``none`` nothing — an unknown limit
type and no retry-after (the client waits the default 15 s). ``headers_now`` gives the rate-limit
headers the latest successful response carried (None for style ``none``).
"""

from __future__ import annotations

import math

from planner.classify import Classification, LimitType
from sim.limits import ProviderAdmission, ProviderLimits

# What each style's headers describe: OpenAI has requests and one token class.
_STYLE_CLASSES = {
    "anthropic": (
        LimitType.REQUESTS,
        LimitType.TOKENS,
        LimitType.INPUT_TOKENS,
        LimitType.OUTPUT_TOKENS,
    ),
    "openai": (LimitType.REQUESTS, LimitType.TOKENS),
}


def _view(style: str, provider: ProviderLimits, now: float) -> Classification:
    snap = provider.snapshot(now)
    classes = _STYLE_CLASSES.get(style, ())
    limits, remaining, resets = {}, {}, {}
    for cls, cs in snap.classes.items():
        shown = cls if cls in classes else None
        if shown is None and style == "openai" and cls is LimitType.INPUT_TOKENS:
            shown = LimitType.TOKENS
        if shown is None:
            continue
        limits[shown] = cs.limit
        remaining[shown] = cs.remaining
        resets[shown] = cs.reset_s
    return Classification(
        status=200,
        limit_type=LimitType.NONE,
        provider=style,
        limits=limits,
        remaining=remaining,
        resets_s=resets,
    )


def headers_now(style: str, provider: ProviderLimits, now: float) -> Classification | None:
    """The rate-limit view a successful response carries now (None when nothing is revealed)."""
    if style == "none":
        return None
    return _view(style, provider, now)


def retry_after(style: str, adm: ProviderAdmission) -> float | None:
    """The retry-after a 429 states (whole seconds, >= 1), or None when it states none."""
    if style == "none":
        return None
    return float(max(1, math.ceil(adm.retry_after_s)))


def describe_429(
    style: str, provider: ProviderLimits, now: float, adm: ProviderAdmission
) -> Classification:
    """The classification a client reads from the 429 (limit type, headers, retry-after)."""
    if style == "none":
        return Classification(status=429, limit_type=LimitType.UNKNOWN, provider="none")
    view = _view(style, provider, now)
    hit = adm.limit if adm.limit is not None else LimitType.UNKNOWN
    if style == "openai" and hit is LimitType.INPUT_TOKENS:
        hit = LimitType.TOKENS
    return Classification(
        status=429,
        limit_type=hit,
        provider=style,
        limits=view.limits,
        remaining=view.remaining,
        resets_s=view.resets_s,
        retry_after_s=retry_after(style, adm),
        too_large=adm.too_large,
    )
