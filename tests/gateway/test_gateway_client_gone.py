"""A harness that hangs up while its call waits at the pacer (its instance deadline passed, or it
died): the gateway drops the call. It is never sent upstream nor recorded, its pacer wait is
cancelled, and its spend reservation goes back (``gateway.client_gone``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import func, select

from gateway.pacer_local import InProcessPacer
from gateway.pacing import CallEstimate, Permit
from ledger.models import ApiKey, LlmCall
from tests.gateway.gw_helpers import Stack

BODY = {"model": "sim-openai", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def test_a_call_whose_harness_hangs_up_at_the_pacer_is_dropped_not_sent(
    make_stack: Callable[..., Stack],
) -> None:
    held = threading.Event()
    cancelled = threading.Event()
    release_next = threading.Event()

    class HoldingPacer(InProcessPacer):
        """Holds the first call until it is cancelled; admits the rest at once."""

        async def acquire(self, alias: str, estimate: CallEstimate) -> Permit:
            if not release_next.is_set():
                release_next.set()
                held.set()
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cancelled.set()
                    raise
            return await super().acquire(alias, estimate)

    stack = make_stack(pacer=HoldingPacer)
    run = stack.new_run()
    secret = run.gateway_key.get_secret_value()
    headers = {"authorization": f"Bearer {secret}", "x-evalfleet-instance": "django-1"}
    url = stack.url + "/v1/chat/completions"
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, headers=headers, json=BODY, timeout=httpx.Timeout(5.0, read=1.0))
    assert held.is_set()
    assert cancelled.wait(10.0), "the pacer wait of a call nobody waits for was not cancelled"

    def reserved() -> int:
        with stack.engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.sum(ApiKey.reserved_micro_usd)).where(ApiKey.run_id == run.run_id)
                ).scalar_one()
                or 0
            )

    deadline = time.monotonic() + 10.0
    while reserved() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reserved() == 0
    # a call after it goes through, and is the only one the provider and the ledger saw
    ok = httpx.post(url, headers=headers, json=BODY, timeout=10.0)
    assert ok.status_code == 200
    deadline = time.monotonic() + 10.0  # rows are written in batches
    statuses: list[int] = []
    while not statuses and time.monotonic() < deadline:
        time.sleep(0.05)
        with stack.engine.connect() as conn:
            statuses = list(
                conn.execute(select(LlmCall.status).where(LlmCall.run_id == run.run_id)).scalars()
            )
    time.sleep(0.3)  # and no row of the dropped call comes after it
    with stack.engine.connect() as conn:
        statuses = list(
            conn.execute(select(LlmCall.status).where(LlmCall.run_id == run.run_id)).scalars()
        )
    assert statuses == [200]
