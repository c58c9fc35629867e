"""Harness and evaluator adapters, by the name a run config gives them.

``make_harness`` / ``make_evaluator`` validate an adapter's options at once (launch time), so a
bad option is a ``ConfigError`` naming ``harness.options.<field>`` before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from evalfleet.errors import ConfigError
from harnesses.base import Evaluator, Harness


def _harnesses() -> Mapping[str, Callable[[dict[str, Any], str], Harness]]:
    from harnesses.command import CommandHarness
    from harnesses.simulated import SimulatedHarness
    from harnesses.trace_replay import TraceReplayHarness

    return {
        "simulated": SimulatedHarness,
        "trace-replay": TraceReplayHarness,
        "command": CommandHarness,
    }


def _evaluators() -> Mapping[str, Callable[[dict[str, Any], str], Evaluator]]:
    from harnesses.command import CommandEvaluator
    from harnesses.evaluators import SimulatedEvaluator

    return {"simulated": SimulatedEvaluator, "command": CommandEvaluator}


def make_harness(name: str, options: Mapping[str, Any]) -> Harness:
    """The harness adapter ``name`` with validated options, or ConfigError."""
    known = _harnesses()
    if name not in known:
        raise ConfigError("harness.name", [f"unknown harness {name!r} (known: {', '.join(known)})"])
    return known[name](dict(options), "harness.options")


def make_evaluator(name: str, options: Mapping[str, Any]) -> Evaluator:
    """The evaluator adapter ``name`` with validated options, or ConfigError."""
    known = _evaluators()
    if name not in known:
        raise ConfigError(
            "evaluator.name", [f"unknown evaluator {name!r} (known: {', '.join(known)})"]
        )
    return known[name](dict(options), "evaluator.options")
