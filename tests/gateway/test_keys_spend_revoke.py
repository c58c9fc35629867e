"""Spend cap under concurrency, revocation of both keys, and the secrets canary."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from sqlalchemy import Row, Table, select, text

from gateway.keys import hash_secret, revoke_run_keys
from ledger.db import session_factory
from ledger.models import ApiKey, Base, LlmCall
from tests.gateway.gw_helpers import ADMIN_KEY, Stack, sim_profile


def _gateway_key_row(stack: Stack, run_id: str) -> Row[tuple[ApiKey]]:
    with stack.engine.connect() as conn:
        return conn.execute(
            select(ApiKey).where(ApiKey.run_id == run_id, ApiKey.kind == "gateway")
        ).one()


def _wait_settled(stack: Stack, run_id: str, bound_s: float = 3.0) -> Row[tuple[ApiKey]]:
    deadline = time.monotonic() + bound_s
    while True:
        row = _gateway_key_row(stack, run_id)
        if row.reserved_micro_usd == 0 or time.monotonic() > deadline:
            return row
        time.sleep(0.05)


def test_spend_cap_admits_exactly_what_fits_under_concurrency(
    make_stack: Callable[..., Stack],
) -> None:
    # Every call costs the same, and its worst case equals its real cost: all input uncached
    # (distinct prompts), output == max_tokens. The cap admits exactly 10 of 50 concurrent calls.
    stack = make_stack(profile=sim_profile(output_fraction_min=1.0, output_fraction_max=1.0))
    alias = stack.gateway.aliases.get("sim-openai")
    prompts = [f"{i:04d} " + "x" * 395 for i in range(50)]
    from gateway.tokens import count_prompt_tokens

    costs = {
        alias.worst_case_cost(
            count_prompt_tokens({"messages": [{"role": "user", "content": p}]}), 50
        )
        for p in prompts
    }
    assert len(costs) == 1
    cost = costs.pop()
    keys = stack.new_run(spend_cap_micro_usd=10 * cost)
    headers = {"authorization": f"Bearer {keys.gateway_key.get_secret_value()}"}

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        "/v1/chat/completions",
                        headers=headers,
                        json={
                            "model": "sim-openai",
                            "messages": [{"role": "user", "content": p}],
                            "max_tokens": 50,
                        },
                    )
                    for p in prompts
                )
            )

    responses = asyncio.run(fire())
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 10
    assert statuses.count(402) == 40
    refusal = next(r for r in responses if r.status_code == 402)
    message = refusal.json()["error"]["message"]
    assert "spend cap" in message and keys.run_id in message
    assert refusal.headers["x-should-retry"] == "false"
    row = _wait_settled(stack, keys.run_id)
    assert row.reserved_micro_usd == 0
    assert row.spent_micro_usd == 10 * cost <= row.spend_cap_micro_usd
    # The provider charged its key the same.
    [provider_key] = [k for k in stack.sim.keys.values() if keys.run_id in k.name]
    assert provider_key.spent_micro_usd == 10 * cost


def test_revoke_refuses_both_keys_at_gateway_and_provider(
    make_stack: Callable[..., Stack],
) -> None:
    stack = make_stack()
    keys = stack.new_run()
    stored = asyncio.run(stack.store.aget(keys.run_id))
    assert stored is not None
    provider_secret = stored.get_secret_value()
    gw_headers = {"authorization": f"Bearer {keys.gateway_key.get_secret_value()}"}
    body = {"model": "sim-openai", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    assert (
        httpx.post(
            stack.url + "/v1/chat/completions", headers=gw_headers, json=body, timeout=5
        ).status_code
        == 200
    )
    direct = {"authorization": f"Bearer {provider_secret}"}
    assert (
        httpx.post(
            stack.sim_url + "/v1/chat/completions", headers=direct, json=body, timeout=5
        ).status_code
        == 200
    )

    revoked = revoke_run_keys(
        session_factory(stack.engine),
        keys.run_id,
        minter=stack.minter,
        store=stack.store,
        now=datetime.now(UTC),
    )
    assert len(revoked) == 2
    deadline = time.monotonic() + 2.0
    while True:
        g = httpx.post(stack.url + "/v1/chat/completions", headers=gw_headers, json=body, timeout=5)
        p = httpx.post(stack.sim_url + "/v1/chat/completions", headers=direct, json=body, timeout=5)
        if (g.status_code, p.status_code) == (401, 401):
            break
        assert time.monotonic() < deadline, (
            f"still accepted after 2 s: {g.status_code}, {p.status_code}"
        )
        time.sleep(0.05)
    assert "revoked" in g.json()["error"]["message"]
    with stack.engine.connect() as conn:
        states = conn.execute(
            select(ApiKey.kind, ApiKey.state).where(ApiKey.run_id == keys.run_id)
        ).all()
    assert sorted(states) == [("gateway", "revoked"), ("provider", "revoked")]
    # Idempotent.
    assert (
        revoke_run_keys(
            session_factory(stack.engine),
            keys.run_id,
            minter=stack.minter,
            store=stack.store,
            now=datetime.now(UTC),
        )
        == []
    )


def test_unknown_and_expired_gateway_keys_are_refused_and_not_forwarded(
    make_stack: Callable[..., Stack],
) -> None:
    stack = make_stack()
    keys = stack.new_run()
    with session_factory(stack.engine).begin() as s:
        s.execute(
            cast(Table, ApiKey.__table__)
            .update()
            .where(ApiKey.id == keys.gateway_key_id)
            .values(expires_at=datetime(2000, 1, 1, tzinfo=UTC))
        )
    body = {"model": "sim-openai", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    before = stack.sim.stats["ok"] + stack.sim.stats["refused"]
    for secret, reason in (
        (keys.gateway_key.get_secret_value(), "expired"),
        ("efg_nope", "unknown"),
    ):
        r = httpx.post(
            stack.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {secret}"},
            json=body,
            timeout=5,
        )
        assert r.status_code == 401 and reason in r.json()["error"]["message"]
    assert stack.sim.stats["ok"] + stack.sim.stats["refused"] == before


def test_canary_no_raw_secret_in_logs_ledger_or_errors(
    make_stack: Callable[..., Stack],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    profile = sim_profile(openai={**sim_profile().openai.model_dump(), "rpm": 2.0})
    stack = make_stack(profile=profile, max_retry_wait_s=0.0)
    keys = stack.new_run(spend_cap_micro_usd=2_000)
    stored = asyncio.run(stack.store.aget(keys.run_id))
    assert stored is not None
    provider_secret = stored.get_secret_value()
    gateway_secret = keys.gateway_key.get_secret_value()
    client = openai.OpenAI(api_key=gateway_secret, base_url=stack.url + "/v1", max_retries=0)
    errors: list[str] = [repr(keys), str(keys)]
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    for _ in range(2):  # successes (2 requests per minute)
        client.chat.completions.create(model="sim-openai", messages=msgs, max_tokens=5)
    refused: tuple[dict[str, Any], ...] = (
        {"max_tokens": 5},  # rpm exhausted → 429 from the provider
        {"max_tokens": 100_000},  # worst case over the spend cap → 402
    )
    for kwargs in refused:
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="sim-openai", messages=msgs, **kwargs)
        errors += [str(info.value), repr(info.value), info.value.response.text]
    statuses = {e.split(" ")[2] for e in errors[2::3]}
    assert {"429", "402"} <= statuses
    revoke_run_keys(
        session_factory(stack.engine),
        keys.run_id,
        minter=stack.minter,
        store=stack.store,
        now=datetime.now(UTC),
    )
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(model="sim-openai", messages=msgs, max_tokens=5)
    errors += [str(info.value), info.value.response.text]
    asyncio.run(asyncio.sleep(0.5))  # let the batch writer flush
    dump: list[str] = []
    with stack.engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            dump += [
                repr(tuple(row)) for row in conn.execute(text(f'SELECT * FROM "{table.name}"'))
            ]
        calls = conn.execute(select(LlmCall).where(LlmCall.run_id == keys.run_id)).all()
    assert {c.status for c in calls} >= {200, 429}
    out, err = capfd.readouterr()
    haystacks = {
        "logs": caplog.text + out + err,
        "ledger": "\n".join(dump),
        "errors": "\n".join(errors),
    }
    assert hash_secret(gateway_secret) in haystacks["ledger"]  # the dump is real: hashes are there
    for secret in (gateway_secret, provider_secret, ADMIN_KEY.get_secret_value()):
        for where, text_ in haystacks.items():
            assert secret not in text_, f"a raw secret leaked into {where}"
            assert secret[4:20] not in text_, f"part of a raw secret leaked into {where}"
