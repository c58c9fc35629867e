"""The ``simulated`` harness's calls, generated offline: the table its usage curve is fitted from.

``offline_calls`` plays instances of ``harnesses.simulated`` step by step without a network:
the conversation is the harness's own (``SimulatedHarness.conversation``, ``planned_calls``,
``think_s``), and each call is answered by the simulated provider's own models — input tokens
counted by ``gateway.tokens``, cached tokens from a ``PrefixCache`` of the prompts served so far,
the output length drawn by ``completions.output_tokens`` (seeded by the prompt, so the same as
the provider would answer) and the latency ``latency_s + latency_per_output_token_s x output``
of the profile, plus ``call_overhead_s`` for the gateway and HTTP hops. Task age 0 is the start
of the harness stage (what the gateway's ``x-evalfleet-task-started-at`` is); an instance ends
when its last response arrives.

The result has the ``planner.fit.fit_curve`` columns (calls: ``instance_id``, ``t_request_s``,
``input_tokens``, ``cached_input_tokens``, ``output_tokens``; instances: ``instance_id``,
``wall_time_s``). Deterministic: the same options, profile, run id and instance count give the
same tables. No pacing, no 429s: a curve is a task's unthrottled demand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from gateway.provider_sim.completions import PrefixCache, fake_text, output_tokens
from gateway.provider_sim.profile import SimProfile
from harnesses.simulated import SimulatedHarness

#: The run id the offline instances are drawn under (``planned_calls`` depends on it).
OFFLINE_RUN_ID = "simulated-curve"


def offline_calls(
    options: Mapping[str, Any],
    profile: SimProfile,
    instances: int,
    *,
    run_id: str = OFFLINE_RUN_ID,
    call_overhead_s: float = 0.0,
    model: str = "sim-openai",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(calls, instances) tables of ``instances`` simulated instances with ``options``.

    Instances are played one after the other against one provider cache (as concurrent
    instances share the provider's cache: the common system prompt is a cache hit for all but
    the first). See the module docstring for the timing and token models.
    """
    if instances < 1:
        raise ValueError("instances must be >= 1")
    if call_overhead_s < 0:
        raise ValueError("call_overhead_s must be >= 0")
    harness = SimulatedHarness(dict(options), source="curve options")
    o = harness.options
    cache = PrefixCache(profile.cache_prefixes)
    calls: list[tuple[str, float, int, int, int]] = []
    ends: list[tuple[str, float]] = []
    for index in range(instances):
        instance_id = f"offline__instance-{index:05d}"
        conversation = harness.conversation(instance_id)
        steps = harness.planned_calls(run_id, instance_id)
        age = 0.0
        for step in range(1, steps + 1):
            body: dict[str, Any] = {
                "model": model,
                "messages": conversation.messages,
                "max_tokens": o.max_tokens,
            }
            total, cached, prefixes = cache.lookup(body)
            cache.add(prefixes)
            out = output_tokens(profile, body, o.max_tokens)
            calls.append((instance_id, age, total, cached, out))
            age += profile.latency_s + profile.latency_per_output_token_s * out + call_overhead_s
            if step == steps:
                break
            conversation.add_turn(step, fake_text(out))
            age += o.think_s
        ends.append((instance_id, age))
    return (
        pd.DataFrame(
            calls,
            columns=[
                "instance_id",
                "t_request_s",
                "input_tokens",
                "cached_input_tokens",
                "output_tokens",
            ],
        ),
        pd.DataFrame(ends, columns=["instance_id", "wall_time_s"]),
    )
