"""The ``simulated`` harness: an agent loop through the gateway with the real traces' token growth.

Each step sends the whole conversation again (as mini-swe-agent does), then appends the
assistant's reply and a tool observation, so input tokens per call grow with the step the way
the shipped traces do: ~1,650 tokens at step 1 and ~550 more per step (7.8 k at step 10, 23 k at
step 40 in sim/traces/README.md). Between calls the agent "runs a tool" for ``think_s`` seconds
(the traces' median gap is 4 s). The number of calls per instance is drawn deterministically
from (run, instance), log-normal around ``calls_median`` (traces: median 36, p90 66), so a rerun
of an instance makes the same calls. ``token_scale`` and ``think_s`` shrink an instance for demos
and tests without changing the shape. Text is made of fixed words; the simulated provider and the
gateway count ~4 characters per token.

The conversation model (``Conversation``: the messages of each step; ``planned_calls``; the
think time) is shared with ``harnesses.simulated_calls``, which replays it offline against the
simulated provider's token, caching and latency model to fit the harness's shipped usage curve
(``evalfleet curves fit-simulated``), so the curve and the harness cannot drift apart.
"""

from __future__ import annotations

import hashlib
import math
import random

from pydantic import Field

from harnesses.base import AdapterOptions, HarnessContext, HarnessResult, parse_options
from harnesses.openai_calls import GatewayChat

FIRST_PROMPT_TOKENS = 1_650
OBSERVATION_TOKENS = 450
CHARS_PER_TOKEN = 4
_WORDS = [
    "the",
    "quick",
    "agent",
    "reads",
    "a",
    "file",
    "runs",
    "the",
    "tests",
    "and",
    "edits",
    "one",
    "function",
    "again",
]


class SimulatedOptions(AdapterOptions):
    calls_median: int = Field(default=36, ge=1, le=1_000)
    calls_sigma: float = Field(default=0.5, ge=0.0, le=3.0)
    calls_max: int = Field(default=250, ge=1, le=10_000)
    think_s: float = Field(default=4.0, ge=0.0, le=600.0)
    token_scale: float = Field(default=1.0, gt=0.0, le=10.0)
    max_tokens: int = Field(default=256, ge=1, le=65_536)
    call_timeout_s: float = Field(default=600.0, gt=0.0, le=3_600.0)


def filler(tokens: int, salt: str) -> str:
    """About ``tokens`` tokens of text (4 characters each), varied by ``salt``."""
    start = int(hashlib.sha256(salt.encode()).hexdigest()[:8], 16) % len(_WORDS)
    words: list[str] = []
    length = 0
    i = start
    while length < tokens * CHARS_PER_TOKEN:
        word = _WORDS[i % len(_WORDS)]
        words.append(word)
        length += len(word) + 1
        i += 1
    return " ".join(words)[: max(1, tokens * CHARS_PER_TOKEN)]


def instance_rng(run_id: str, instance_id: str) -> random.Random:
    """A random stream fixed by (run, instance): reruns of an instance behave the same."""
    digest = hashlib.sha256(f"{run_id}:{instance_id}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


class Conversation:
    """The messages one instance sends: a system prompt and the task, then after every step the
    assistant's reply and a tool observation (the whole history is resent each step)."""

    def __init__(self, options: SimulatedOptions, instance_id: str) -> None:
        first = max(1, round(FIRST_PROMPT_TOKENS * options.token_scale))
        self._observation = max(1, round(OBSERVATION_TOKENS * options.token_scale))
        self._instance_id = instance_id
        self.messages: list[dict[str, object]] = [
            {"role": "system", "content": filler(first // 3, "system")},
            {"role": "user", "content": filler(first - first // 3, instance_id)},
        ]

    def add_turn(self, step: int, reply: str) -> None:
        """Append step ``step``'s reply and the observation of the tool the agent ran."""
        self.messages.append({"role": "assistant", "content": reply or "ok"})
        self.messages.append(
            {"role": "user", "content": filler(self._observation, f"{self._instance_id}:{step}")}
        )


class SimulatedHarness:
    """See the module docstring."""

    name = "simulated"

    def __init__(self, options: dict[str, object], source: str = "harness.options") -> None:
        self.options = parse_options(SimulatedOptions, dict(options), source)

    def planned_calls(self, run_id: str, instance_id: str) -> int:
        o = self.options
        draw = instance_rng(run_id, instance_id).gauss(0.0, 1.0)
        return max(1, min(o.calls_max, round(o.calls_median * math.exp(o.calls_sigma * draw))))

    def conversation(self, instance_id: str) -> Conversation:
        """The instance's conversation at its first step."""
        return Conversation(self.options, instance_id)

    def run(self, ctx: HarnessContext) -> HarnessResult:
        o = self.options
        gateway = GatewayChat(ctx, o.call_timeout_s)
        steps = self.planned_calls(ctx.run_id, ctx.instance_id)
        conversation = self.conversation(ctx.instance_id)
        totals = [0, 0, 0]
        for step in range(1, steps + 1):
            usage = gateway.send(conversation.messages, o.max_tokens)
            totals[0] += usage.input_tokens
            totals[1] += usage.cached_input_tokens
            totals[2] += usage.output_tokens
            if step == steps:
                break
            conversation.add_turn(step, usage.text)
            if o.think_s:
                gateway.pause(o.think_s)
        patch = (
            f"diff --git a/{ctx.instance_id}.py b/{ctx.instance_id}.py\n"
            f"+# simulated fix after {steps} calls\n"
        )
        return HarnessResult(
            patch=patch,
            calls=steps,
            input_tokens=totals[0],
            cached_input_tokens=totals[1],
            output_tokens=totals[2],
        )
