"""Deterministic fake completions of the simulated provider, in both providers' wire shapes.

Token counts follow the request: input from the prompt (``gateway.tokens``), output a share of
``max_tokens`` drawn from the profile's range with a generator seeded by the prompt (same
request → same answer), cached input = the longest prompt prefix (whole messages) seen before
by this provider (a bounded LRU of prefix hashes), as with prompt caching of a resent history.
Bodies and SSE events follow what the official SDKs parse: OpenAI ``usage.prompt_tokens``
includes ``prompt_tokens_details.cached_tokens``; Anthropic ``usage.input_tokens`` excludes
``cache_read_input_tokens``.
"""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gateway.provider_sim.profile import SimProfile
from gateway.tokens import message_tokens, prompt_messages, tools_tokens


@dataclass(frozen=True)
class Usage:
    """Tokens of one call by class."""

    input_total: int
    input_cached: int
    output: int

    @property
    def input_uncached(self) -> int:
        return self.input_total - self.input_cached


class PrefixCache:
    """Hashes of prompt prefixes seen (bounded, least recently used dropped first)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._seen: OrderedDict[str, None] = OrderedDict()

    @staticmethod
    def prefixes(body: dict[str, Any]) -> list[tuple[str, int]]:
        """(hash, tokens) of each whole-message prefix of the prompt, shortest first."""
        digest = hashlib.sha256(json.dumps(body.get("tools"), sort_keys=True).encode())
        tokens = tools_tokens(body)
        out = []
        for message in prompt_messages(body):
            digest.update(json.dumps(message, sort_keys=True).encode())
            tokens += message_tokens(message)
            out.append((digest.copy().hexdigest(), tokens))
        return out

    def lookup(self, body: dict[str, Any]) -> tuple[int, int, list[tuple[str, int]]]:
        """(total input tokens, cached tokens, prefixes) of the prompt; remembers nothing."""
        prefixes = self.prefixes(body)
        total = prefixes[-1][1] if prefixes else tools_tokens(body)
        cached = 0
        for key, tokens in reversed(prefixes):
            if key in self._seen:
                cached = tokens
                break
        return total, cached, prefixes

    def add(self, prefixes: list[tuple[str, int]]) -> None:
        """Remember the prefixes of a served prompt (least recently used dropped first)."""
        if self._capacity <= 0:
            return
        for key, _ in prefixes:
            self._seen[key] = None
            self._seen.move_to_end(key)
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)


def output_tokens(profile: SimProfile, body: dict[str, Any], max_tokens: int) -> int:
    """Deterministic output length for this request: a share of ``max_tokens``."""
    seed = hashlib.sha256(
        f"{profile.seed}:{json.dumps(body.get('messages'), sort_keys=True)}".encode()
    ).digest()
    rng = random.Random(seed)
    share = rng.uniform(profile.output_fraction_min, profile.output_fraction_max)
    return max(1, min(max_tokens, round(share * max_tokens)))


def fake_text(tokens: int) -> str:
    """Text of exactly ``tokens`` tokens under the shared 4-characters-per-token count."""
    return ("sim " * tokens)[: tokens * 4]


def _split(text: str, parts: int) -> list[str]:
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# ---------------------------------------------------------------------------- OpenAI


def openai_body(model: str, usage: Usage, max_tokens: int, created: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-sim-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": fake_text(usage.output)},
                "finish_reason": "length" if usage.output >= max_tokens else "stop",
                "logprobs": None,
            }
        ],
        "usage": _openai_usage(usage),
    }


def _openai_usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_total,
        "completion_tokens": usage.output,
        "total_tokens": usage.input_total + usage.output,
        "prompt_tokens_details": {"cached_tokens": usage.input_cached},
    }


def openai_stream(
    model: str, usage: Usage, max_tokens: int, created: int, chunks: int, include_usage: bool
) -> Iterator[bytes]:
    cid = f"chatcmpl-sim-{uuid.uuid4().hex[:24]}"

    def event(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
        data: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
        }
        if extra:
            data.update(extra)
        return f"data: {json.dumps(data)}\n\n".encode()

    yield event(
        [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
    )
    for piece in _split(fake_text(usage.output), chunks):
        yield event([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
    finish = "length" if usage.output >= max_tokens else "stop"
    yield event([{"index": 0, "delta": {}, "finish_reason": finish}])
    if include_usage:
        yield event([], {"usage": _openai_usage(usage)})
    yield b"data: [DONE]\n\n"


# ---------------------------------------------------------------------------- Anthropic


def _anthropic_usage(usage: Usage, output: int) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_uncached,
        "cache_read_input_tokens": usage.input_cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": output,
    }


def anthropic_body(model: str, usage: Usage, max_tokens: int) -> dict[str, Any]:
    return {
        "id": f"msg_sim{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": fake_text(usage.output)}],
        "stop_reason": "max_tokens" if usage.output >= max_tokens else "end_turn",
        "stop_sequence": None,
        "usage": _anthropic_usage(usage, usage.output),
    }


def anthropic_stream(model: str, usage: Usage, max_tokens: int, chunks: int) -> Iterator[bytes]:
    def event(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    message = anthropic_body(model, usage, max_tokens)
    start = {**message, "content": [], "stop_reason": None, "usage": _anthropic_usage(usage, 1)}
    yield event("message_start", {"type": "message_start", "message": start})
    yield event(
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    )
    for piece in _split(fake_text(usage.output), chunks):
        yield event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": piece},
            },
        )
    yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage.output},
        },
    )
    yield event("message_stop", {"type": "message_stop"})
