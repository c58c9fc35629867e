"""The ``trace-replay`` harness: replays one real instance of a shipped trace through the gateway.

Every call of the chosen trace instance is sent at its recorded time (``t_request_s`` times
``time_scale``) with its recorded size: the conversation grows as a resent prefix (so prompt
caching can apply) up to the call's recorded input tokens, and ``max_tokens`` is the recorded
output. ``instance`` picks the trace instance; by default the run's instance id is used when it
is in the trace, otherwise a trace instance is chosen deterministically from it. The patch is a
marker: the trace holds numbers only, no text.
"""

from __future__ import annotations

import functools
import hashlib
import time

import pandas as pd
from pydantic import Field

from evalfleet.errors import ConfigError
from harnesses.base import AdapterOptions, HarnessContext, HarnessResult, parse_options
from harnesses.openai_calls import GatewayChat
from harnesses.simulated import filler
from sim.traces import DEFAULT_TRACE, load_calls


class TraceReplayOptions(AdapterOptions):
    trace: str = Field(default=DEFAULT_TRACE, min_length=1, max_length=200)
    instance: str | None = Field(default=None, min_length=1, max_length=256)
    time_scale: float = Field(default=1.0, ge=0.0, le=100.0)
    token_scale: float = Field(default=1.0, gt=0.0, le=10.0)
    call_timeout_s: float = Field(default=600.0, gt=0.0, le=3_600.0)


@functools.cache
def _calls_by_instance(trace: str) -> dict[str, pd.DataFrame]:
    calls = load_calls(trace).sort_values(["instance_id", "step"])
    return {str(k): v.reset_index(drop=True) for k, v in calls.groupby("instance_id")}


class TraceReplayHarness:
    """See the module docstring."""

    name = "trace-replay"

    def __init__(self, options: dict[str, object], source: str = "harness.options") -> None:
        self.options = parse_options(TraceReplayOptions, dict(options), source)
        by_instance = _calls_by_instance(self.options.trace)
        if self.options.instance is not None and self.options.instance not in by_instance:
            raise ConfigError(
                source,
                [f"instance: {self.options.instance!r} is not in trace {self.options.trace!r}"],
            )
        self._ids = sorted(by_instance)

    def trace_instance(self, instance_id: str) -> str:
        """The trace instance replayed for one run instance."""
        if self.options.instance is not None:
            return self.options.instance
        if instance_id in _calls_by_instance(self.options.trace):
            return instance_id
        digest = int(hashlib.sha256(instance_id.encode()).hexdigest()[:12], 16)
        return self._ids[digest % len(self._ids)]

    def run(self, ctx: HarnessContext) -> HarnessResult:
        o = self.options
        source_id = self.trace_instance(ctx.instance_id)
        calls = _calls_by_instance(o.trace)[source_id]
        gateway = GatewayChat(ctx, o.call_timeout_s)
        messages: list[dict[str, object]] = []
        prompt_tokens = 0
        totals = [0, 0, 0]
        start = time.monotonic()
        for row in calls.itertuples(index=False):
            wait = start + max(0.0, float(row.t_request_s)) * o.time_scale - time.monotonic()
            if wait > 0:
                gateway.pause(wait)
            target = max(1, round(int(row.input_tokens) * o.token_scale))
            if target > prompt_tokens:
                messages.append(
                    {"role": "user", "content": filler(target - prompt_tokens, f"{row.step}")}
                )
                prompt_tokens = target
            max_tokens = max(1, round(int(row.output_tokens) * o.token_scale))
            usage = gateway.send(messages, max_tokens)
            totals[0] += usage.input_tokens
            totals[1] += usage.cached_input_tokens
            totals[2] += usage.output_tokens
            messages.append({"role": "assistant", "content": usage.text or "ok"})
            prompt_tokens += max(1, len(usage.text or "ok") // 4)
        return HarnessResult(
            patch=f"# trace-replay of {source_id}: {len(calls)} calls\n",
            calls=len(calls),
            input_tokens=totals[0],
            cached_input_tokens=totals[1],
            output_tokens=totals[2],
        )
