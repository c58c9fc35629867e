"""A harness that goes away in the middle of a streamed answer: the call is still settled.

An agent killed by its timeout, or a harness process that dies, closes its connection while
the gateway relays the provider's stream. The call must still give back its pacer admission
(its in-flight tokens), settle its spend reservation at the tokens streamed until then, and
leave an ``llm_calls`` row that says the answer was cut short (499, not a 200 a curve refit
would take for a whole call), however early the harness hung up: a relay generator that never
started runs no ``finally``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from sqlalchemy import select
from starlette.requests import ClientDisconnect

from gateway.relay import RelayedStream
from ledger.models import CLIENT_CLOSED, ApiKey, LlmCall
from tests.gateway.gw_helpers import Stack, sim_profile


def _body(flavour: str) -> dict[str, object]:
    messages = [{"role": "user", "content": "fix the bug " * 50}]
    return {"model": f"sim-{flavour}", "messages": messages, "max_tokens": 64, "stream": True}


@pytest.mark.parametrize("flavour", ["openai", "anthropic"])
def test_a_stream_the_harness_abandons_is_settled(
    make_stack: Callable[..., Stack], flavour: str
) -> None:
    # 20 chunks over 4 s: the harness reads the first and hangs up
    stack = make_stack(profile=sim_profile(latency_s=4.0, stream_chunks=20))
    keys = stack.new_run(alias=f"sim-{flavour}")
    path = "/v1/chat/completions" if flavour == "openai" else "/v1/messages"
    headers = {"authorization": f"Bearer {keys.gateway_key.get_secret_value()}"}
    with (
        httpx.Client(base_url=stack.url, timeout=10.0) as client,
        client.stream("POST", path, json=_body(flavour), headers=headers) as reply,
    ):
        assert reply.status_code == 200
        next(reply.iter_raw())
    core = stack.gateway.pacer._pacer(f"sim-{flavour}").core  # type: ignore[attr-defined]
    deadline = time.monotonic() + 5.0
    while True:
        with stack.engine.connect() as conn:
            rows = conn.execute(select(LlmCall).where(LlmCall.run_id == keys.run_id)).all()
            key = conn.execute(
                select(ApiKey).where(ApiKey.run_id == keys.run_id, ApiKey.kind == "gateway")
            ).one()
        settled = rows and key.reserved_micro_usd == 0 and core.inflight_calls == 0
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert core.inflight_calls == 0 and core.inflight_tokens == 0
    assert key.reserved_micro_usd == 0
    assert [r.status for r in rows] == [CLIENT_CLOSED]
    assert key.spent_micro_usd == rows[0].cost_micro_usd


def test_a_stream_abandoned_before_its_first_chunk_still_ends() -> None:
    """A harness that hangs up while the response's headers are sent: the relay generator never
    starts, so its ``finally`` never runs; the response itself calls ``on_end``."""
    started: list[bool] = []
    ended: list[bool] = []

    async def body() -> AsyncIterator[bytes]:
        started.append(True)
        yield b"data: {}\n\n"

    async def receive() -> dict[str, object]:
        return {"type": "http.disconnect"}

    async def send(message: object) -> None:
        raise OSError("connection reset by peer")

    response = RelayedStream(body(), on_end=lambda: ended.append(True), status_code=200)
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}}
    with pytest.raises(ClientDisconnect):
        asyncio.run(response(scope, receive, send))
    assert ended == [True] and started == []
