"""The request the gateway sends upstream in place of the harness's: the alias's model, the
run's provider key in the flavour's own header (never in the body), Anthropic's version and
beta headers as the harness sent them, and usage asked for on every OpenAI stream."""

from __future__ import annotations

import json

from pydantic import SecretStr
from starlette.datastructures import Headers

from gateway.wire import DEFAULT_ANTHROPIC_VERSION, upstream_request

KEY = SecretStr("sk-provider-raw-key")


def test_openai_request_carries_the_alias_model_and_the_provider_key_in_its_header() -> None:
    body = {"model": "cheap", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
    content, headers = upstream_request("openai", body, Headers({}), "gpt-4.1-mini", KEY)
    sent = json.loads(content)
    assert sent["model"] == "gpt-4.1-mini"
    assert sent["messages"] == body["messages"]
    assert "stream_options" not in sent  # not a stream: nothing added
    assert headers["authorization"] == "Bearer sk-provider-raw-key"
    assert "x-api-key" not in headers
    assert b"sk-provider-raw-key" not in content
    assert body["model"] == "cheap"  # the harness's body is left as it was


def test_openai_stream_asks_for_usage_and_keeps_the_harness_stream_options() -> None:
    body = {"model": "cheap", "stream": True, "stream_options": {"include_obfuscation": False}}
    content, _ = upstream_request("openai", body, Headers({}), "gpt-4.1-mini", KEY)
    assert json.loads(content)["stream_options"] == {
        "include_obfuscation": False,
        "include_usage": True,
    }


def test_anthropic_request_uses_x_api_key_and_passes_version_and_beta() -> None:
    body = {"model": "sonnet", "max_tokens": 64, "stream": True}
    harness = Headers({"anthropic-version": "2024-01-01", "anthropic-beta": "prompt-caching"})
    content, headers = upstream_request("anthropic", body, harness, "claude-sonnet-4-5", KEY)
    assert json.loads(content) == {"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": True}
    assert headers["x-api-key"] == "sk-provider-raw-key"
    assert "authorization" not in headers
    assert headers["anthropic-version"] == "2024-01-01"
    assert headers["anthropic-beta"] == "prompt-caching"


def test_anthropic_request_without_a_version_gets_the_default_and_no_beta() -> None:
    _, headers = upstream_request("anthropic", {"model": "s"}, Headers({}), "claude", KEY)
    assert headers["anthropic-version"] == DEFAULT_ANTHROPIC_VERSION
    assert "anthropic-beta" not in headers
