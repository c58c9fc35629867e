"""One chat-completion call through the gateway with the official ``openai`` SDK, classified.

Shared by the ``simulated`` and ``trace-replay`` harnesses. The SDK's own retries are off: the
gateway already retries 429/529 within its budget, so a 429, 5xx or connection failure that
reaches the harness is infrastructure (``InfrastructureFailure``: requeued, never scored). A
refused key (401/403, e.g. the run was closed) is infrastructure too. Any other 4xx means the
agent sent something the provider rejects, which is the agent's failure (``HarnessFailed``).
Error messages carry the status and the provider's short message, never the key.

``GatewayChat`` is one attempt's conversation with the gateway under the run's instance
deadline (``harnesses.base.Deadline``): each call's timeout and each pause between calls is cut
to what is left of it, and a call cut short by it is ``instance_timeout``, not a gateway failure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast

import openai

from evalfleet.errors import HarnessFailed, InfrastructureFailure
from harnesses.base import HarnessContext


@dataclass(frozen=True)
class CallUsage:
    """Usage of one call as the response reported it, and the assistant's text."""

    text: str
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int


def make_client(ctx: HarnessContext, timeout_s: float) -> openai.OpenAI:
    """An OpenAI client on the gateway's ``/v1`` with the run's gateway key."""
    headers = {"x-evalfleet-run": ctx.run_id, "x-evalfleet-instance": ctx.instance_id}
    if ctx.harness:
        headers["x-evalfleet-harness"] = ctx.harness
    if ctx.started_at is not None:
        headers["x-evalfleet-task-started-at"] = f"{ctx.started_at:.3f}"
    if ctx.deadline is not None:  # near it the pacer may put the task's calls first
        headers["x-evalfleet-task-timeout-s"] = f"{ctx.deadline.timeout_s:g}"
    return openai.OpenAI(
        base_url=ctx.gateway_url.rstrip("/") + "/v1",
        api_key=ctx.gateway_key.get_secret_value(),
        max_retries=0,
        timeout=timeout_s,
        http_client=cast(Any, ctx.http_client),  # the SDK accepts httpx and httpx2 clients
        default_headers=headers,
    )


def chat(
    client: openai.OpenAI, model: str, messages: list[dict[str, Any]], max_tokens: int
) -> CallUsage:
    """Make one call; classify failures (see module docstring)."""
    try:
        response = client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
        )
    except openai.RateLimitError as exc:
        raise InfrastructureFailure("rate_limited", _describe(exc)) from None
    except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
        raise InfrastructureFailure("gateway_refused_key", _describe(exc)) from None
    except openai.APIStatusError as exc:
        if exc.status_code >= 500 or exc.status_code in (402, 408, 409):
            raise InfrastructureFailure("provider_unavailable", _describe(exc)) from None
        raise HarnessFailed("provider_rejected_request", _describe(exc)) from None
    except (openai.APIConnectionError, openai.APITimeoutError) as exc:
        raise InfrastructureFailure("gateway_unreachable", type(exc).__name__) from None
    usage = response.usage
    cached = 0
    if usage is not None and usage.prompt_tokens_details is not None:
        cached = usage.prompt_tokens_details.cached_tokens or 0
    text = response.choices[0].message.content if response.choices else None
    return CallUsage(
        text=text or "",
        input_tokens=usage.prompt_tokens if usage else 0,
        cached_input_tokens=cached,
        output_tokens=usage.completion_tokens if usage else 0,
    )


def _describe(exc: openai.APIStatusError) -> str:
    message = ""
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            message = str(error.get("message", ""))[:200]
    return f"HTTP {exc.status_code} {message}".strip()


class GatewayChat:
    """One attempt's calls through the gateway, each bounded by the context's deadline."""

    def __init__(self, ctx: HarnessContext, call_timeout_s: float) -> None:
        self._client = make_client(ctx, call_timeout_s)
        self._model = ctx.alias
        self._call_timeout_s = call_timeout_s
        self._deadline = ctx.deadline
        self.calls = 0
        """Calls answered so far."""

    def send(self, messages: list[dict[str, Any]], max_tokens: int) -> CallUsage:
        """One call (``chat``), waiting at most what is left of the deadline."""
        deadline = self._deadline
        client = self._client
        if deadline is not None:
            deadline.check(self.calls)
            client = client.with_options(timeout=deadline.bound(self._call_timeout_s))
        try:
            usage = chat(client, self._model, messages, max_tokens)
        except InfrastructureFailure as exc:
            if deadline is not None and deadline.seconds_left() <= 0:
                raise deadline.expired(
                    self.calls, f"call {self.calls + 1} cut short ({exc.error_class})"
                ) from None
            raise
        self.calls += 1
        return usage

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` (the agent's tool time), at most until the deadline, past which
        ``instance_timeout`` is raised."""
        deadline = self._deadline
        if deadline is not None:
            seconds = deadline.bound(seconds)
        if seconds > 0:
            time.sleep(seconds)
        if deadline is not None:
            deadline.check(self.calls)
