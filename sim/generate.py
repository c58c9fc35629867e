"""Random scenarios of the public format, for the planner's robustness test.

Owns one function, ``random_scenario(seed)``: a valid ``Scenario`` drawn from the space the
benchmark may be run on — trace or parametric harness, header style (anthropic, openai, none),
combined or split token limits, cache reads counted or not, a binding token, output-token or
request limit (output on seeds 2 and 5 mod 8, requests on 3 mod 4), sometimes a limit drop
mid-run (harness, header style and binding limit cycle with the seed), an alias seed that is
off (0.6-1.4x of the truth), sometimes stale, sometimes a task cap. The limits are set from the drawn workload so that the run is
limit-bound, not tail-bound: the physical lower bound is ``bound_factor`` x the longest
instance (the planner's 1.20 target is not meant for tail-dominated runs, see
docs/bench-planner.md). Deterministic for a seed; nothing here is tuned to the planner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.metrics import class_totals, largest_calls
from sim.scenario import Scenario, parse_scenario
from sim.workload import Workload, build_workload

TRACE = "minisweagent-gemini3pro-verified"


def _parametric(rng: np.random.Generator) -> dict[str, Any]:
    calls = float(rng.uniform(25, 90))
    out = float(rng.uniform(120, 400))
    gap = float(rng.uniform(2.0, 8.0))
    return {
        "calls": {"median": round(calls), "p90": round(calls * rng.uniform(1.2, 1.8))},
        "first_input_tokens": int(rng.integers(3000, 12000)),
        "input_growth_per_call": int(rng.integers(100, 700)),
        "output_tokens": {"median": round(out), "p90": round(out * rng.uniform(1.5, 3.0))},
        "cached_share": round(float(rng.uniform(0.0, 0.9)), 2),
        "gap_s": {"median": round(gap, 1), "p90": round(gap * rng.uniform(1.5, 3.5), 1)},
    }


def placeholder_draft(
    name: str,
    seed: int,
    instances: int,
    harness: dict[str, Any],
    *,
    style: str,
    cached_input_counts: bool,
    combined: bool,
) -> dict[str, Any]:
    """A scenario draft whose limits and alias seed are placeholders (1): the workload it
    builds sets them (``sim.generate_wide`` draws its scenarios the same way)."""
    return {
        "name": name,
        "seed": seed,
        "instances": instances,
        "harness": harness,
        "provider": {
            "headers": style,
            "cached_input_counts": cached_input_counts,
            "rpm": 1,
            "output_tpm": 1,
            **({"tpm": 1} if combined else {"input_tpm": 1}),
        },
        "alias_config": {"calls_per_s": 1.0, "tokens_per_s": 1.0, "inflight_tokens": 1.0},
    }


@dataclass(frozen=True)
class DraftSizing:
    """What a placeholder draft's workload asks of each limit key (``rpm``, ``tok``, ``out``):
    ``need``, the limit per minute at which the class would take ``target_s`` (``bound_factor``
    x the longest instance), and ``fits``, the largest single call (every limit must hold one,
    after a drop too: a call larger than a per-minute limit is never admitted, and the trace
    holds calls of 65,536 output tokens)."""

    workload: Workload
    need: dict[str, float]
    fits: dict[str, int]
    longest_s: float
    target_s: float


def size_draft(draft: dict[str, Any], bound_factor: float, *, combined: bool) -> DraftSizing:
    """Size the limits of a ``placeholder_draft`` from the workload it builds."""
    placeholder = parse_scenario(draft, draft["name"])
    workload = build_workload(placeholder)
    totals = {k.value: v for k, v in class_totals(placeholder, workload).items()}
    biggest = {k.value: math.ceil(v) for k, v in largest_calls(placeholder, workload).items()}
    token_key = "tokens" if combined else "input_tokens"
    longest = float(workload.durations().max())
    target_s = bound_factor * longest
    return DraftSizing(
        workload=workload,
        need={
            "rpm": totals["requests"] / target_s * 60.0,
            "tok": totals[token_key] / target_s * 60.0,
            "out": totals["output_tokens"] / target_s * 60.0,
        },
        fits={"rpm": 1, "out": biggest["output_tokens"], "tok": biggest[token_key]},
        longest_s=longest,
        target_s=target_s,
    )


def random_scenario(seed: int, *, bound_factor: float = 3.5) -> Scenario:
    """One random scenario (see the module docstring)."""
    rng = np.random.default_rng(seed)
    instances = int(rng.integers(200, 501))
    boot_hi = float(rng.uniform(20, 120))
    harness: dict[str, Any] = {"boot_s": {"min": round(boot_hi / 4), "max": round(boot_hi)}}
    # the discrete choices cycle with the seed, so a handful of seeds covers them all
    if seed % 2 == 0:
        harness["trace"] = TRACE
    else:
        harness["parametric"] = _parametric(rng)
        harness["latency_s"] = {"base": 1.0, "per_output_token": 0.01}
    style = ("anthropic", "openai", "none")[seed % 3]
    combined = style == "openai" or (style == "none" and rng.random() < 0.5)
    counts = bool(rng.random() < 0.5)
    binding = "requests" if seed % 4 == 3 else ("output" if seed % 8 in (2, 5) else "tokens")
    draft = placeholder_draft(
        f"random-{seed}",
        int(rng.integers(0, 2**31)),
        instances,
        harness,
        style=style,
        cached_input_counts=counts,
        combined=combined,
    )
    provider: dict[str, Any] = draft["provider"]
    # per-minute limits at which each class would take target_s; the binding one exactly,
    # the others with room (1.5-3x)
    sizing = size_draft(draft, bound_factor, combined=combined)
    need, fits, target_s = sizing.need, sizing.fits, sizing.target_s
    if binding == "output" and need["out"] < 2.0 * fits["out"]:
        # an output limit that binds at 3.5x the longest instance would hold fewer than two
        # of the largest calls (the trace's run to 65,536 output tokens): each of them would
        # need the provider's whole bucket, which no pacing can share. The tokens bind instead
        binding = "tokens"
    bound_key = {"requests": "rpm", "output": "out"}.get(binding, "tok")
    slack = {k: float(rng.uniform(1.5, 3.0)) for k in need}
    slack[bound_key] = 1.0
    limits = {k: max(1, int(v * slack[k])) for k, v in need.items()}
    provider["rpm"] = limits["rpm"]
    # an output limit with room is at least 20,000 per minute; a binding one is what it needs
    provider["output_tpm"] = max(limits["out"], fits["out"], 1 if bound_key == "out" else 20_000)
    provider["tpm" if combined else "input_tpm"] = max(limits["tok"], fits["tok"])
    if rng.random() < 0.3:
        # the binding limit drops to 60-80% a third of the way in; the bound stays >= target
        key = {"rpm": "rpm", "out": "output_tpm"}.get(bound_key, "tpm" if combined else "input_tpm")
        drop = float(rng.uniform(0.6, 0.8))
        dropped = max(int(provider[key] * drop), fits[bound_key])
        provider["changes"] = [{"at_s": round(target_s / 3), key: dropped}]
    off = float(rng.uniform(0.6, 1.4))
    tokens_s = limits["tok"] / 60.0 * off
    draft["alias_config"] = {
        "calls_per_s": round(limits["rpm"] / 60.0 * float(rng.uniform(0.6, 1.4)), 3),
        "tokens_per_s": round(tokens_s, 1),
        # the output seed is the truth unless the output limit binds (then it is off too)
        "output_tokens_per_s": round(
            provider["output_tpm"] / 60.0 * (off if bound_key == "out" else 1.0), 1
        ),
        "inflight_tokens": round(tokens_s * 120.0, 0),
        "cached_input_counts": counts,
        "seeded_hours_ago": 10.0 if rng.random() < 0.2 else 1.0,
    }
    if rng.random() < 0.3:
        draft["caps"] = {"static": int(rng.integers(40, 200)), "run": None, "override": None}
    draft["description"] = (
        f"random: {style} headers, {'combined' if combined else 'split'} tokens, cache reads "
        f"{'counted' if counts else 'not counted'}, {binding} binding"
    )
    return parse_scenario(draft, f"random-{seed}")
