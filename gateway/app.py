"""The gateway: an ASGI service, OpenAI- and Anthropic-compatible on the paths it proxies.

``POST /v1/chat/completions`` (OpenAI) and ``POST /v1/messages`` (Anthropic); the request's
``model`` names a gateway alias. Per call:

1. paused gateway pool (``pause_flags``, refreshed every second off the hot path) → 503 with
   ``retry-after``;
2. the gateway key (``Authorization: Bearer`` or ``x-api-key``) is hashed, and the call's
   worst-case cost reserved against the run's spend cap in one conditional UPDATE
   (``gateway.spend``): unknown/revoked/expired → 401, over the cap → 402 with a clear message
   and ``x-should-retry: false``; nothing is forwarded;
3. the alias's pacer admits it on an estimate (uncached input + ``max_tokens``; the cached part
   is estimated as the previous call's prompt of the same instance, since agents resend their
   history); a harness that hangs up meanwhile (its deadline, a crash) has its call dropped,
   never sent (``gateway.client_gone``);
4. it is forwarded with the run's provider key (from the ``ProviderKeyStore``, cached in
   memory) through an ``httpx.AsyncClient`` (tests give it a transport);
5. a 429/529/503 from the provider is recorded, classified (``planner.classify``) and retried
   after its ``retry-after`` while the bounded wait (``gateway_max_retry_wait_s``) allows;
   then the harness gets the provider's response with its headers, so its SDK's own retry
   logic reads them;
6. every attempt becomes an ``llm_calls`` row (run, instance, harness, task age, tokens by
   class, latency, pacer wait, status, limit type, cost, and whether it repeats a request the
   provider rejected: the gateway's own retry, or the harness resending the same body),
   written in batches;
7. the spend reservation is settled at the real cost and the pacer at the real tokens; the
   alias's latest rate-limit headers are kept (``alias_observations``) for the planner.

Harness headers: ``x-evalfleet-instance``, ``x-evalfleet-harness``,
``x-evalfleet-task-started-at`` (epoch seconds; else the gateway's first sight of the instance)
and ``x-evalfleet-task-timeout-s`` (the run's instance timeout: with an alias's
``pacer.urgent_share``, past that share of it the pacer puts the task's calls first,
``planner.pacer_order``).

This module is the call path; the flavours' wire formats (the upstream request, errors,
passed-through headers, usage) are ``gateway.wire``, a streamed response's relay is
``gateway.relay``, what is kept of each call (task age, the pacer's estimate, its
``llm_calls`` row and the alias's headers) is ``gateway.calls``, and what a provider's answer
teaches the pacer at once (cut, mirror, hold, recount) is ``gateway.feedback``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import SecretStr
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from evalfleet.errors import KeyRejected, SpendCapExceeded
from gateway.aliases import Aliases
from gateway.calls import Call, CallBook
from gateway.client_gone import ClientGone, while_connected
from gateway.feedback import ProviderFeedback
from gateway.keys import ProviderKeyStore, hash_secret
from gateway.pacing import Pacer, PacerUnavailable, Permit
from gateway.recorder import CallRecorder
from gateway.relay import RelayedStream, relay_events
from gateway.replica_sync import ReplicaSync
from gateway.replicas import ReplicaRegistry
from gateway.send_log import SendLog
from gateway.spend import Settler, SpendStore
from gateway.tokens import count_prompt_tokens, requested_max_tokens
from gateway.wire import (
    bad_request,
    error_response,
    passthrough_headers,
    presented_key,
    unauthorized,
    upstream_request,
    usage_from_body,
)
from ledger.db import session_factory
from ledger.models import CLIENT_CLOSED, SERVED_STATUSES
from ledger.pauses import is_paused
from planner.classify import LimitType, classify
from planner.pacer import CallUsage as PacerUsage

log = logging.getLogger(__name__)

RETRYABLE = (429, 503, 529)


class Gateway:
    """The gateway's state and its ASGI app (``Gateway.app``)."""

    def __init__(
        self,
        *,
        aliases: Aliases,
        engine: Engine,
        store: ProviderKeyStore,
        pacer: Pacer,
        max_retry_wait_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
        upstream_timeout_s: float = 600.0,
        pause_refresh_s: float = 1.0,
        pause_retry_after_s: int = 30,
        clock: Callable[[], float] = time.time,
        replicas: ReplicaRegistry | None = None,
        share_interval_s: float = 1.0,
        share_429s: bool = True,
    ) -> None:
        self.aliases = aliases
        self.engine = engine
        self.sessions: sessionmaker[Any] = session_factory(engine)
        self.store = store
        self.pacer = pacer
        self.max_retry_wait_s = max_retry_wait_s
        self.recorder = CallRecorder(self.sessions)
        self.book = CallBook(self.recorder, clock, vouches=self.alone)
        self.sends = SendLog()  # what went upstream: a token 429 judged at once (gateway.feedback)
        self.feedback = ProviderFeedback(pacer, self.sends, clock, alone=self.alone)
        self.spend = SpendStore(engine)
        self.settler = Settler(self.spend)
        self._transport = transport
        self._timeout = upstream_timeout_s
        self._pause_refresh_s = pause_refresh_s
        self._pause_retry_after_s = pause_retry_after_s
        self._clock = clock
        self._upstream: httpx.AsyncBaseTransport | None = None
        self._paused = False
        self._pause_task: asyncio.Task[None] | None = None
        self._provider_keys: dict[str, SecretStr] = {}
        self._settling: set[asyncio.Task[None]] = set()
        # with other replicas serving the same aliases, each paces at its share of the budgets
        self.replicas: ReplicaSync | None = None
        if replicas is not None:
            self.replicas = ReplicaSync(
                pacer, replicas, aliases.names(), interval_s=share_interval_s
            )
            if share_429s:  # a 429 one replica draws cuts and holds them all
                self.feedback.on_first_429 = self.replicas.report_429
                self.replicas.on_peer_429 = self.feedback.peer_rejected
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._openai, methods=["POST"]),
                Route("/v1/messages", self._anthropic, methods=["POST"]),
                Route("/health", self._health, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        # The transport itself, not an AsyncClient: a proxy needs no cookie jar, redirects or
        # auth flows, and skipping them saves CPU on every call (the timeout goes on each
        # request). Tests hand in their own transport.
        if self.replicas is not None:
            await self.replicas.start()  # first: without its share, nothing may be paced
        self._upstream = self._transport or httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200)
        )
        await self.pacer.start()
        self.recorder.start()
        self.settler.start()
        await self._refresh_pause()
        self._pause_task = asyncio.create_task(self._pause_loop(), name="evalfleet-pause-watch")

    async def stop(self) -> None:
        if self._pause_task is not None:
            self._pause_task.cancel()
            await asyncio.gather(self._pause_task, return_exceptions=True)
        if self.replicas is not None:
            await self.replicas.stop()
        await self.drain()
        await self.settler.close()
        await self.recorder.close()
        await self.pacer.close()
        if self._upstream is not None:
            await self._upstream.aclose()
        await self.spend.close()

    async def drain(self) -> None:
        """Wait for pending settlements, then write pending rows."""
        while self._settling:
            await asyncio.gather(*list(self._settling), return_exceptions=True)
        await self.settler.flush()
        await self.recorder.flush()

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    async def _pause_loop(self) -> None:
        while True:
            await asyncio.sleep(self._pause_refresh_s)
            await self._refresh_pause()

    async def _refresh_pause(self) -> None:
        def read() -> bool:
            with self.engine.connect() as conn:
                return is_paused(conn, pool="gateway")

        try:
            self._paused = await asyncio.to_thread(read)
        except SQLAlchemyError as exc:
            log.error("reading the gateway pause flag failed: %s", type(exc).__name__)

    def alone(self, alias: str) -> bool:
        """Whether this gateway is the alias's only one: what it sent is all the provider's
        buckets saw, and its calls in flight are all the alias's."""
        return self.pacer.share(alias) >= 1.0

    async def _health(self, _request: Request) -> Response:
        """Liveness, the pause flag, and this replica's share of each alias's budgets (1.0
        everywhere for a gateway that is its aliases' only one)."""
        shares = {name: self.pacer.share(name) for name in self.aliases.names()}
        replica = None if self.replicas is None else self.replicas.registry.replica_id
        return JSONResponse(
            {"ok": True, "paused": self._paused, "replica": replica, "shares": shares}
        )

    # ------------------------------------------------------------------ entry points

    async def _openai(self, request: Request) -> Response:
        return await self._handle(request, "openai")

    async def _anthropic(self, request: Request) -> Response:
        return await self._handle(request, "anthropic")

    async def _handle(self, request: Request, flavour: str) -> Response:
        requested_at = datetime.fromtimestamp(self._clock(), UTC)
        if self._paused:
            return error_response(
                flavour,
                503,
                "overloaded_error" if flavour == "anthropic" else "service_unavailable",
                "the evalfleet gateway is paused by an operator; retry later",
                headers={"retry-after": str(self._pause_retry_after_s)},
            )
        secret = presented_key(request)
        if secret is None:
            return unauthorized(flavour, "no gateway key: send Authorization: Bearer <key>")
        raw_body = await request.body()
        try:
            body = json.loads(raw_body)
        except ValueError:
            return bad_request(flavour, "request body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return bad_request(flavour, "model: required (the name of a gateway alias)")
        alias = self.aliases.find(body["model"])
        if alias is None:
            return error_response(
                flavour,
                404,
                "not_found_error" if flavour == "anthropic" else "invalid_request_error",
                f"model: unknown gateway alias {body['model']!r}; known: "
                + ", ".join(self.aliases.names()),
                code="model_not_found",
            )
        if alias.flavour != flavour:
            return bad_request(
                flavour, f"model: alias {alias.name!r} is served on {alias.path}, not here"
            )
        max_tokens = requested_max_tokens(body)
        if max_tokens is None:
            if flavour == "anthropic":
                return bad_request(flavour, "max_tokens: required (a positive integer)")
            max_tokens = alias.default_max_tokens
            body["max_tokens"] = max_tokens
        input_tokens = count_prompt_tokens(body)
        worst_case = alias.worst_case_cost(input_tokens, max_tokens)
        try:
            reservation = await self.spend.reserve(hash_secret(secret), worst_case, requested_at)
        except KeyRejected as exc:
            return unauthorized(flavour, f"{exc}: not forwarded")
        except SpendCapExceeded as exc:
            return error_response(
                flavour,
                402,
                "billing_error" if flavour == "anthropic" else "spend_cap_exceeded",
                str(exc),
                code="spend_cap_exceeded",
                headers={"x-should-retry": "false"},
            )
        instance = request.headers.get("x-evalfleet-instance")
        call = Call(
            alias=alias,
            flavour=flavour,
            reservation=reservation,
            instance=instance,
            harness=request.headers.get("x-evalfleet-harness"),
            task_age_s=self.book.task_age(request, reservation.run_id, instance),
            task_timeout_s=self.book.task_timeout(request),
            requested_at=requested_at,
            input_estimate=input_tokens,
            max_tokens=max_tokens,
            raw_body=raw_body,
        )
        self.book.check_resend(call)
        self.book.started(call)
        try:
            return await self._forward(request, body, call)
        except BaseException:
            self._settle_now(call, settled_cost=0)
            raise

    # ------------------------------------------------------------------ forwarding

    async def _forward(self, request: Request, body: dict[str, Any], call: Call) -> Response:
        provider_key = await self._provider_key(call.reservation.run_id)
        if provider_key is None:
            self._settle_now(call, settled_cost=0)
            return error_response(
                call.flavour,
                502,
                "api_error",
                f"run {call.reservation.run_id} has no provider key in the gateway's key store",
            )
        try:
            call.permit = await while_connected(
                request, self.pacer.acquire(call.alias.name, self.book.estimate(call))
            )
        except ClientGone as gone:
            # never sent: the spend reservation, and an admission that came as the client left,
            # go back (``gateway.client_gone``)
            if isinstance(gone.result, Permit):
                call.permit = gone.result
            self._settle_now(call, settled_cost=0)
            return Response(status_code=CLIENT_CLOSED)
        except PacerUnavailable as exc:
            self._settle_now(call, settled_cost=0)
            return error_response(
                call.flavour,
                503,
                "overloaded_error" if call.flavour == "anthropic" else "service_unavailable",
                f"alias {call.alias.name}: pacer unavailable: {exc}",
                headers={"retry-after": str(self._pause_retry_after_s)},
            )
        stream = bool(body.get("stream"))
        content, headers = upstream_request(
            call.flavour, body, request.headers, call.alias.model, provider_key
        )
        url = call.alias.base_url + call.alias.path
        deadline = time.monotonic() + self.max_retry_wait_s
        assert self._upstream is not None, "gateway not started"
        timeout = {"timeout": httpx.Timeout(self._timeout, connect=10.0).as_dict()}
        while True:
            started = time.monotonic()
            sent_at = self._clock()
            attempt = self.sends.sent(call.alias.name, sent_at, call.input_estimate)
            upstream = await self._upstream.handle_async_request(
                httpx.Request("POST", url, content=content, headers=headers, extensions=timeout)
            )
            if upstream.status_code == 200 and stream:
                return self._stream(upstream, call, started, attempt, sent_at)
            raw = await upstream.aread()
            await upstream.aclose()
            latency = time.monotonic() - started
            out_headers = passthrough_headers(upstream.headers)
            if upstream.status_code == 200:
                self.book.observe(call, upstream, LimitType.NONE, None, None, latency)
                self.feedback.served(call, upstream, sent_at)
                try:
                    usage_from_body(call.flavour, json.loads(raw), call.usage)
                except ValueError:
                    log.warning("alias %s: provider sent a 200 that is not JSON", call.alias.name)
                self.sends.answered(attempt, call.usage.uncached, call.usage.input_cached)
                cost = self.book.record(call, 200, latency, None, sent_at=sent_at)
                self.book.note_outcome(call, rejected=False)
                self._settle_later(call, cost)
                return Response(
                    raw, status_code=200, headers=out_headers, media_type="application/json"
                )
            verdict = classify(upstream.status_code, upstream.headers, raw, now_epoch=self._clock())
            if upstream.status_code == 429:
                self.sends.rejected(attempt)
            self.book.observe(
                call,
                upstream,
                verdict.limit_type,
                verdict.limits,
                verdict.remaining,
                latency,
                counted_cache_reads=self.feedback.judge_counting(call, verdict, sent_at),
            )
            self.feedback.rejected(call, verdict)
            limit = None if verdict.limit_type is LimitType.NONE else verdict.limit_type.value
            self.book.record(call, upstream.status_code, latency, limit, sent_at=sent_at)
            wait = verdict.retry_after_s if verdict.retry_after_s is not None else 1.0
            retryable = (
                upstream.status_code in RETRYABLE and verdict.limit_type is not LimitType.SPEND
            )
            if retryable and not verdict.too_large and time.monotonic() + wait <= deadline:
                await asyncio.sleep(max(0.0, wait))
                call.retry = True  # the next attempt's 429 would repeat this one's evidence
                continue
            self.book.note_outcome(call, rejected=upstream.status_code == 429)
            self._settle_now(call, settled_cost=0)
            return Response(
                raw,
                status_code=upstream.status_code,
                headers=out_headers,
                media_type=upstream.headers.get("content-type", "application/json"),
            )

    def _stream(
        self, upstream: httpx.Response, call: Call, started: float, attempt: int, sent_at: float
    ) -> Response:
        gateway = self

        def finish(status: int) -> None:
            # synchronous, and once (``_settle_now`` is idempotent): it runs first in the relay's
            # ``finally``, where a cancelled relay's next ``await`` may raise again
            if call.settled:
                return
            if status == 200:
                gateway.sends.answered(attempt, call.usage.uncached, call.usage.input_cached)
            cost = gateway.book.record(
                call, status, time.monotonic() - started, None, sent_at=sent_at
            )
            gateway._settle_now(call, settled_cost=cost if status in SERVED_STATUSES else 0)

        def abandoned() -> None:
            # the response ended without the relay's ``finally`` having run: the harness went
            # away before its first chunk (a generator never started runs no ``finally``)
            if call.settled:
                return
            finish(CLIENT_CLOSED)
            task = asyncio.get_running_loop().create_task(upstream.aclose())
            gateway._settling.add(task)
            task.add_done_callback(gateway._settling.discard)

        headers = passthrough_headers(upstream.headers)
        self.book.observe(call, upstream, LimitType.NONE, None, None, time.monotonic() - started)
        self.book.note_outcome(call, rejected=False)
        self.feedback.served(call, upstream, sent_at)
        return RelayedStream(
            relay_events(upstream, call.flavour, call.usage, finish),
            on_end=abandoned,
            status_code=200,
            headers=headers,
            media_type=upstream.headers.get("content-type", "text/event-stream"),
        )

    # ------------------------------------------------------------------ bookkeeping

    async def _provider_key(self, run_id: str) -> SecretStr | None:
        key = self._provider_keys.get(run_id)
        if key is None:
            key = await self.store.aget(run_id)
            if key is not None:
                self._provider_keys[run_id] = key
        return key

    def _settle_now(self, call: Call, settled_cost: int) -> None:
        """Settle pacer and spend for a call, once (in a tracked background task)."""
        self._settle_later(call, settled_cost)

    def _settle_later(self, call: Call, cost: int) -> None:
        if call.settled:
            return
        call.settled = True
        self.book.finished(call)
        task = asyncio.get_running_loop().create_task(self._settle(call, cost))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(self, call: Call, cost: int) -> None:
        if call.permit is not None:
            permit, call.permit = call.permit, None
            u = call.usage
            usage = (
                PacerUsage(input_uncached=u.uncached, input_cached=u.input_cached, output=u.output)
                if u.input_total > 0 or u.output > 0
                else None
            )
            await self.pacer.settle(permit, usage)
        self.settler.add(call.reservation, cost)


__all__ = ["Gateway", "error_response", "usage_from_body"]
