"""The official openai and anthropic SDKs, pointed at the gateway with a run's gateway key."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types import TextBlock
from openai.types.chat import ChatCompletionMessageParam
from sqlalchemy import Row, select

from ledger.clock import as_utc
from ledger.models import ApiKey, LlmCall
from tests.gateway.gw_helpers import Stack, sim_profile


def _calls(
    stack: Stack, run_id: str, expected: int
) -> tuple[Sequence[Row[tuple[LlmCall]]], Row[tuple[ApiKey]]]:
    """The run's llm_calls rows and gateway key, once ``expected`` rows are written and no
    reservation is left (rows are written in batches off the hot path: poll, bounded)."""
    deadline = time.monotonic() + 3
    while True:
        with stack.engine.connect() as conn:
            rows = conn.execute(
                select(LlmCall).where(LlmCall.run_id == run_id).order_by(LlmCall.id)
            ).all()
            key = conn.execute(
                select(ApiKey).where(ApiKey.run_id == run_id, ApiKey.kind == "gateway")
            ).one()
        done = len(rows) >= expected and key.reserved_micro_usd == 0
        if done or time.monotonic() > deadline:
            return rows, key
        time.sleep(0.05)


def test_openai_sdk_non_streaming_and_streaming(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack()
    keys = stack.new_run()
    client = openai.OpenAI(
        api_key=keys.gateway_key.get_secret_value(),
        base_url=stack.url + "/v1",
        max_retries=0,
        default_headers={"x-evalfleet-instance": "django__django-1"},
    )
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "fix the bug " * 50}]
    reply = client.chat.completions.create(model="sim-openai", messages=messages, max_tokens=64)
    assert reply.choices[0].message.content
    assert reply.usage is not None
    assert 1 <= reply.usage.completion_tokens <= 64
    first_prompt = reply.usage.prompt_tokens
    messages += [
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": "and now the tests " * 20},
    ]
    stream = client.chat.completions.create(
        model="sim-openai", messages=messages, max_tokens=64, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text
    # The second call resent the first prompt: the provider reports it as cached.
    rows, key = _calls(stack, keys.run_id, 2)
    assert [r.status for r in rows] == [200, 200]
    assert rows[0].instance_id == "django__django-1"
    assert rows[1].cached_input_tokens == first_prompt
    assert rows[1].input_tokens > first_prompt
    assert all(r.output_tokens > 0 and r.cost_micro_usd > 0 for r in rows)
    assert key.reserved_micro_usd == 0
    assert key.spent_micro_usd == sum(r.cost_micro_usd for r in rows)


def test_anthropic_sdk_non_streaming_and_streaming(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack()
    keys = stack.new_run(alias="sim-anthropic")
    client = anthropic.Anthropic(
        api_key=keys.gateway_key.get_secret_value(), base_url=stack.url, max_retries=0
    )
    msg = client.messages.create(
        model="sim-anthropic",
        max_tokens=50,
        system="you are an agent",
        messages=[{"role": "user", "content": "hello " * 40}],
    )
    assert isinstance(msg.content[0], TextBlock)
    assert msg.content[0].text
    assert msg.usage.output_tokens <= 50
    with client.messages.stream(
        model="sim-anthropic",
        max_tokens=50,
        system="you are an agent",
        messages=[{"role": "user", "content": "hello " * 40}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert isinstance(final.content[0], TextBlock)
    assert text == final.content[0].text
    assert final.usage.cache_read_input_tokens is not None
    assert final.usage.cache_read_input_tokens > 0
    rows, key = _calls(stack, keys.run_id, 2)
    assert [r.status for r in rows] == [200, 200]
    assert rows[1].cached_input_tokens == final.usage.cache_read_input_tokens
    assert rows[1].output_tokens == final.usage.output_tokens
    assert key.reserved_micro_usd == 0
    assert key.spent_micro_usd == sum(r.cost_micro_usd for r in rows)


@pytest.mark.parametrize("flavour", ["openai", "anthropic"])
def test_sdk_retries_a_429_using_our_headers(
    make_stack: Callable[..., Stack], flavour: str
) -> None:
    # 60 requests per minute: after the bucket's minute of burst, a call gets a 429 with
    # retry-after 1 s. With the gateway's retry wait at 0 the 429 reaches the SDK, which waits
    # what our headers say (not its 0.5 s default backoff) and retries successfully.
    profile = sim_profile(
        openai={**sim_profile().openai.model_dump(), "rpm": 60.0},
        anthropic={**sim_profile().anthropic.model_dump(), "rpm": 60.0},
    )
    stack = make_stack(profile=profile, max_retry_wait_s=0.0)
    keys = stack.new_run(alias=f"sim-{flavour}")
    secret = keys.gateway_key.get_secret_value()
    instance = {"x-evalfleet-instance": "astropy-1"}
    create: Callable[..., Any]
    if flavour == "openai":
        openai_client = openai.OpenAI(
            api_key=secret, base_url=stack.url + "/v1", max_retries=3, default_headers=instance
        )
        create = openai_client.chat.completions.with_raw_response.create
    else:
        anthropic_client = anthropic.Anthropic(
            api_key=secret, base_url=stack.url, max_retries=3, default_headers=instance
        )
        create = anthropic_client.messages.with_raw_response.create
    calls = 0
    while True:
        started = time.monotonic()
        raw = create(
            model=f"sim-{flavour}", messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
        elapsed = time.monotonic() - started
        calls += 1
        if raw.retries_taken or calls > 70:
            break
    assert raw.retries_taken >= 1, "the rpm limit never produced a 429"
    assert raw.status_code == 200
    assert elapsed >= 0.9 * raw.retries_taken
    rows, _ = _calls(stack, keys.run_id, calls + raw.retries_taken)
    statuses = [r.status for r in rows]
    assert statuses.count(429) == raw.retries_taken and statuses.count(200) == calls
    assert {r.limit_type for r in rows if r.status == 429} == {"requests"}
    # the SDK resent the body the provider rejected: that attempt is a retry (its 429, had it
    # drawn one, no new evidence for the planner); the same body after a success is not
    assert [r.retry for r in rows] == [False] + [prev.status == 429 for prev in rows[:-1]]


def test_gateway_retries_429_within_its_bounded_wait(make_stack: Callable[..., Stack]) -> None:
    # tpm 9500 (~158 tokens/s): two calls of ~4,850 tokens; the second one is refused (tokens)
    # for ~1-2 s and retried by the gateway: the SDK (no retries of its own) never sees a 429.
    profile = sim_profile(openai={**sim_profile().openai.model_dump(), "tpm": 9500.0})
    stack = make_stack(profile=profile, max_retry_wait_s=5.0)
    keys = stack.new_run()
    client = openai.OpenAI(
        api_key=keys.gateway_key.get_secret_value(), base_url=stack.url + "/v1", max_retries=0
    )
    for i in range(2):
        client.chat.completions.create(
            model="sim-openai",
            messages=[{"role": "user", "content": f"{i} " + "x" * 19_000}],
            max_tokens=100,
        )
    rows, _ = _calls(stack, keys.run_id, 3)
    assert [r.status for r in rows] == [200, 429, 200]
    assert rows[1].limit_type == "tokens"
    assert [r.retry for r in rows] == [False, False, True]  # the gateway's own retry
    # each attempt records its own send (llm_calls.sent_at): the retry's is after the 429 came
    # back and its retry-after (at least 1 s) passed, though it shares the call's request
    assert rows[2].requested_at == rows[1].requested_at
    sent = [as_utc(r.sent_at).timestamp() for r in rows]
    for row, at in zip(rows, sent, strict=True):
        assert at >= as_utc(row.requested_at).timestamp() + row.pacer_wait_s - 1e-3
    assert sent[2] - sent[1] >= rows[1].latency_s + 1.0 - 1e-3
