"""Token counting shared by the gateway and the simulated provider.

The gateway must estimate a call's input tokens *before* forwarding it (to reserve worst-case
spend and to pace), and the simulated provider must count the same request when it answers.
Both use this one deterministic approximation (about four characters per token, plus a small
per-message overhead), so the gateway's estimate of a call against the simulated provider is
exact. Against a real provider it is an estimate that the settlement corrects afterwards.
"""

from __future__ import annotations

import json
from typing import Any

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4


def count_text_tokens(text: str) -> int:
    """Tokens of a piece of text: ceil(len / 4), at least 1 for non-empty text."""
    if not text:
        return 0
    return -(-len(text) // CHARS_PER_TOKEN)


def _content_text(content: Any) -> str:
    """The text of an OpenAI or Anthropic message content (a string or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif "content" in part:
                    parts.append(_content_text(part["content"]))
                elif "input" in part:
                    parts.append(json.dumps(part["input"], sort_keys=True))
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return json.dumps(content, sort_keys=True)


def message_tokens(message: Any) -> int:
    """Tokens of one chat message, overhead included."""
    if not isinstance(message, dict):
        return MESSAGE_OVERHEAD_TOKENS
    text = _content_text(message.get("content"))
    if message.get("tool_calls"):
        text += json.dumps(message["tool_calls"], sort_keys=True)
    return MESSAGE_OVERHEAD_TOKENS + count_text_tokens(text)


def prompt_messages(body: dict[str, Any]) -> list[Any]:
    """The request's messages in order, an Anthropic ``system`` prompt first as a message."""
    messages: list[Any] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": system})
    raw = body.get("messages")
    if isinstance(raw, list):
        messages.extend(raw)
    return messages


def tools_tokens(body: dict[str, Any]) -> int:
    """Tokens of the tool definitions a request carries (counted as their JSON)."""
    tools = body.get("tools")
    if not tools:
        return 0
    return count_text_tokens(json.dumps(tools, sort_keys=True))


def count_prompt_tokens(body: dict[str, Any]) -> int:
    """Input tokens of an OpenAI Chat Completions or Anthropic Messages request body."""
    return tools_tokens(body) + sum(message_tokens(m) for m in prompt_messages(body))


def requested_max_tokens(body: dict[str, Any]) -> int | None:
    """The request's output cap (``max_tokens`` or OpenAI's ``max_completion_tokens``)."""
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
