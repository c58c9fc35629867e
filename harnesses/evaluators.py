"""The ``simulated`` evaluator: a configured duration and resolve rate, deterministic per instance.

Whether an instance resolves is fixed by (run, instance) and the rate, so a re-evaluation gives
the same verdict; an empty patch never resolves.
"""

from __future__ import annotations

import time

from pydantic import Field

from harnesses.base import AdapterOptions, Evaluation, parse_options
from harnesses.simulated import instance_rng


class SimulatedEvalOptions(AdapterOptions):
    duration_s: float = Field(default=1.0, ge=0.0, le=3_600.0)
    resolve_rate: float = Field(default=0.74, ge=0.0, le=1.0)


class SimulatedEvaluator:
    """See the module docstring."""

    name = "simulated"

    def __init__(self, options: dict[str, object], source: str = "evaluator.options") -> None:
        self.options = parse_options(SimulatedEvalOptions, dict(options), source)

    def evaluate(self, run_id: str, instance_id: str, patch: str | None) -> Evaluation:
        if self.options.duration_s:
            time.sleep(self.options.duration_s)
        if not patch:
            return Evaluation(resolved=False, detail="empty patch")
        draw = instance_rng(run_id, f"eval:{instance_id}").random()
        return Evaluation(resolved=draw < self.options.resolve_rate)
