"""What the simulated provider reveals to its clients, per the scenario's header style.

The responses are rendered with ``sim.protocol`` (the same wire format the simulated provider
HTTP server sends) and read back with ``planner.classify`` (the gateway's reader), so the
planner policy sees exactly what a real gateway would: with ``anthropic``/``openai`` headers the
stated limits/remaining/resets, the limit type a 429 names and its retry-after; with ``none``
nothing — an unknown limit and no retry-after (the client waits the default 15 s).

Rendering costs a few tens of microseconds, so the engine only asks for it when a policy reads
headers (the planner); the baselines only need ``retry_after``.
"""

from __future__ import annotations

import math

from planner.classify import Classification, classify
from sim.limits import ProviderAdmission, ProviderLimits
from sim.protocol import rate_limit_headers, render_rejection

# Simulated time 0 as a wall-clock epoch (for RFC 3339 resets); any fixed value will do.
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def retry_after(style: str, adm: ProviderAdmission) -> float | None:
    """The retry-after a 429 states (whole seconds, >= 1, as rendered), or None for ``none``."""
    if style == "none":
        return None
    return float(max(1, math.ceil(adm.retry_after_s)))


def headers_now(style: str, provider: ProviderLimits, now: float) -> Classification | None:
    """The rate-limit view a successful response carries now (None when nothing is revealed)."""
    if style == "none":
        return None
    headers = rate_limit_headers(style, provider.snapshot(now), EPOCH + now)
    return classify(200, headers, None, now_epoch=EPOCH + now)


def describe_429(
    style: str, provider: ProviderLimits, now: float, adm: ProviderAdmission
) -> Classification:
    """The classification the gateway reads from the rendered 429."""
    response = render_rejection(style, adm, provider.snapshot(now), EPOCH + now)
    return classify(response.status, response.headers, response.body, now_epoch=EPOCH + now)
