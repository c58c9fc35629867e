"""The simulated provider's HTTP server (Starlette): both APIs, the admin key API, the limits.

* ``POST /v1/chat/completions`` (OpenAI) and ``POST /v1/messages`` (Anthropic), streaming or
  not. A call is authenticated (a key minted by the admin API; unknown, revoked or expired →
  401), refused when its key's spend cap is used up (OpenAI ``insufficient_quota`` 429,
  Anthropic billing error), answered 529/503 "overloaded" at the profile's rate, then admitted
  or rejected by the flavour's ``sim.limits.ProviderLimits`` (the simulator's limit model: one
  source of truth). Every response carries the provider's real rate-limit headers, rendered
  by ``sim.protocol``, as are the 429/529/spend error bodies.
* ``POST /admin/keys`` (``{"name", "spend_cap_micro_usd", "expires_at"}`` → 201
  ``{"id", "key"}``; the raw key is shown once, kept only as a hash), ``GET /admin/keys/{id}``
  and ``DELETE /admin/keys/{id}``; all need ``Authorization: Bearer <admin key>``.

Time: ``clock`` (epoch seconds) is injected; limits run on it. Latency is simulated with
``asyncio.sleep`` from the profile.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import random
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import gateway.provider_sim.wire as wire
from gateway.keys import hash_secret
from gateway.provider_sim import completions as fake
from gateway.provider_sim.profile import SimProfile
from gateway.tokens import requested_max_tokens
from sim.limits import CallCharge, ProviderLimits


@dataclass
class SimKey:
    """A provider key of the simulated provider (hash only)."""

    id: str
    name: str
    key_hash: str
    spend_cap_micro_usd: int
    expires_at: datetime | None
    spent_micro_usd: int = 0
    state: str = "active"
    calls: int = 0

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "spend_cap_micro_usd": self.spend_cap_micro_usd,
            "spent_micro_usd": self.spent_micro_usd,
            "calls": self.calls,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
        }


class ProviderSim:
    """State of the simulated provider and its ASGI app (``ProviderSim.app``)."""

    def __init__(
        self,
        profile: SimProfile,
        admin_key: SecretStr,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.profile = profile
        self._admin_hash = hash_secret(admin_key.get_secret_value())
        self._clock = clock
        self.keys: dict[str, SimKey] = {}
        self._by_hash: dict[str, SimKey] = {}
        start = clock()
        self.limits = {
            "openai": ProviderLimits(profile.openai.limit_spec(), start_s=start),
            "anthropic": ProviderLimits(profile.anthropic.limit_spec(), start_s=start),
        }
        self.cache = {f: fake.PrefixCache(profile.cache_prefixes) for f in ("openai", "anthropic")}
        self._overload_rng = random.Random(profile.seed)
        self.stats: dict[str, int] = {"ok": 0, "rate_limited": 0, "overloaded": 0, "refused": 0}
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._openai, methods=["POST"]),
                Route("/v1/messages", self._anthropic, methods=["POST"]),
                Route("/admin/keys", self._create_key, methods=["POST"]),
                Route("/admin/keys/{key_id}", self._get_key, methods=["GET"]),
                Route("/admin/keys/{key_id}", self._revoke_key, methods=["DELETE"]),
                Route("/health", self._health, methods=["GET"]),
            ]
        )

    # ------------------------------------------------------------------ admin API

    def _is_admin(self, request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        presented = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        return bool(presented) and hmac.compare_digest(hash_secret(presented), self._admin_hash)

    def mint(self, name: str, spend_cap_micro_usd: int, expires_at: datetime | None) -> str:
        """Mint a key in-process; returns the raw secret (tests, benchmarks)."""
        raw = "sk-sim-" + secrets.token_urlsafe(32)
        key = SimKey(
            id="key_" + uuid.uuid4().hex[:20],
            name=name,
            key_hash=hash_secret(raw),
            spend_cap_micro_usd=spend_cap_micro_usd,
            expires_at=expires_at,
        )
        self.keys[key.id] = key
        self._by_hash[key.key_hash] = key
        return raw

    async def _create_key(self, request: Request) -> Response:
        if not self._is_admin(request):
            return _admin_error(401, "admin key required")
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _admin_error(400, "body is not JSON")
        problems = []
        cap = body.get("spend_cap_micro_usd") if isinstance(body, dict) else None
        if not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0:
            problems.append("spend_cap_micro_usd: must be a positive integer")
        name = body.get("name", "key") if isinstance(body, dict) else "key"
        if not isinstance(name, str) or not 0 < len(name) <= 128:
            problems.append("name: must be a string of 1-128 characters")
        expires_at = None
        raw_exp = body.get("expires_at") if isinstance(body, dict) else None
        if raw_exp is not None:
            try:
                expires_at = datetime.fromisoformat(str(raw_exp))
                if expires_at.tzinfo is None:
                    raise ValueError
            except ValueError:
                problems.append("expires_at: must be an ISO 8601 time with a timezone")
        if problems:
            return _admin_error(400, "; ".join(problems))
        assert isinstance(cap, int) and isinstance(name, str)
        raw = self.mint(name, cap, expires_at)
        key = self._by_hash[hash_secret(raw)]
        return JSONResponse({**key.public(), "key": raw}, status_code=201)

    async def _get_key(self, request: Request) -> Response:
        if not self._is_admin(request):
            return _admin_error(401, "admin key required")
        key = self.keys.get(request.path_params["key_id"])
        if key is None:
            return _admin_error(404, "no such key")
        return JSONResponse(key.public())

    async def _revoke_key(self, request: Request) -> Response:
        if not self._is_admin(request):
            return _admin_error(401, "admin key required")
        key = self.keys.get(request.path_params["key_id"])
        if key is None:
            return _admin_error(404, "no such key")
        key.state = "revoked"
        return JSONResponse(key.public())

    async def _health(self, _request: Request) -> Response:
        return JSONResponse({"ok": True, **self.stats})

    # ------------------------------------------------------------------ the APIs

    async def _openai(self, request: Request) -> Response:
        return await self._complete(request, "openai")

    async def _anthropic(self, request: Request) -> Response:
        return await self._complete(request, "anthropic")

    def _authenticate(self, request: Request, flavour: str) -> SimKey | None:
        if flavour == "openai":
            auth = request.headers.get("authorization", "")
            raw = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        else:
            raw = request.headers.get("x-api-key", "").strip()
        key = self._by_hash.get(hash_secret(raw)) if raw else None
        if key is None or key.state != "active":
            return None
        if key.expires_at is not None and key.expires_at <= datetime.now(UTC):
            return None
        return key

    def _style(self, flavour: str) -> str:
        """What the rate-limit headers and 429s look like: the flavour's, or none at all."""
        return flavour if self.profile.rate_limit_headers else "none"

    async def _complete(self, request: Request, flavour: str) -> Response:
        now = self._clock()
        key = self._authenticate(request, flavour)
        if key is None:
            self.stats["refused"] += 1
            return wire.auth_error(flavour)
        try:
            body = json.loads(await request.body())
        except ValueError:
            return wire.invalid_request(flavour, "body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return wire.invalid_request(flavour, "messages: required (a list)")
        max_tokens = requested_max_tokens(body)
        if max_tokens is None:
            if flavour == "anthropic":
                return wire.invalid_request(flavour, "max_tokens: Field required")
            max_tokens = 4096
        limits = self.limits[flavour]
        if key.spent_micro_usd >= key.spend_cap_micro_usd:
            self.stats["refused"] += 1
            return wire.spend_error(flavour, limits.snapshot(now), now)
        if (
            self.profile.overload_rate > 0
            and self._overload_rng.random() < self.profile.overload_rate
        ):
            self.stats["overloaded"] += 1
            return wire.overloaded(flavour)
        cache = self.cache[flavour]
        total, cached, prefixes = cache.lookup(body)
        charge = CallCharge(
            input_uncached=total - cached, input_cached=cached, max_output=max_tokens
        )
        admission = limits.admit(now, charge)
        if not admission.admitted:
            self.stats["rate_limited"] += 1
            return wire.rate_limited(self._style(flavour), admission, limits.snapshot(now), now)
        cache.add(prefixes)
        out = fake.output_tokens(self.profile, body, max_tokens)
        usage = fake.Usage(input_total=total, input_cached=cached, output=out)
        prices = (
            self.profile.openai.prices if flavour == "openai" else self.profile.anthropic.prices
        )
        key.spent_micro_usd += prices.cost_micro_usd(usage.input_uncached, cached, out)
        key.calls += 1
        self.stats["ok"] += 1
        assert admission.ticket is not None
        limits.settle(now, admission.ticket, out)
        headers = wire.rate_limit_headers(self._style(flavour), limits.snapshot(now), now)
        delay = self.profile.latency_s + self.profile.latency_per_output_token_s * out
        model = str(body.get("model", "sim"))
        if body.get("stream"):
            if flavour == "openai":
                opts = body.get("stream_options")
                include = isinstance(opts, dict) and bool(opts.get("include_usage"))
                events = fake.openai_stream(
                    model, usage, max_tokens, int(now), self.profile.stream_chunks, include
                )
            else:
                events = fake.anthropic_stream(model, usage, max_tokens, self.profile.stream_chunks)
            return StreamingResponse(
                _paced(events, delay), headers=headers, media_type="text/event-stream"
            )
        if delay > 0:
            await asyncio.sleep(delay)
        payload = (
            fake.openai_body(model, usage, max_tokens, int(now))
            if flavour == "openai"
            else fake.anthropic_body(model, usage, max_tokens)
        )
        return JSONResponse(payload, headers=headers)


async def _paced(events: Iterator[bytes], delay: float) -> AsyncIterator[bytes]:
    items = list(events)
    step = delay / max(1, len(items))
    for item in items:
        if step > 0:
            await asyncio.sleep(step)
        yield item


def _admin_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": "admin_error", "message": message}}, status_code=status)
