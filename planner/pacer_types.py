"""The pacer's values: what a call is admitted on (``CallEstimate``) and settled with
(``CallUsage``), the answer to a request (``Admission``) and what was admitted over a window
(``PacerUsage``).

Kept apart from the admission core (``planner.pacer``) so the gateway's pacer interface and the
simulator can name the values without the core's queue and buckets; ``planner.pacer`` re-exports
them. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.budgets import BudgetClass

__all__ = ["Admission", "CallEstimate", "CallUsage", "PacerUsage"]


@dataclass(frozen=True)
class CallEstimate:
    """What a call is admitted on: its input (split by cache) and its ``max_tokens``; how long
    its task has been running (``task_age_s``, None when unknown), which orders the queue while
    the output budget holds it back; and its task's instance timeout (``task_timeout_s``, None
    when unknown), near which its calls may go first (``planner.pacer_order``)."""

    input_uncached: int
    input_cached: int = 0
    max_output: int = 0
    task_age_s: float | None = None
    task_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if min(self.input_uncached, self.input_cached, self.max_output) < 0:
            raise ValueError(f"token counts must be >= 0: {self}")
        if self.task_age_s is not None and not (
            math.isfinite(self.task_age_s) and self.task_age_s >= 0
        ):
            raise ValueError(f"task_age_s must be a finite number >= 0: {self}")
        if self.task_timeout_s is not None and not (
            math.isfinite(self.task_timeout_s) and self.task_timeout_s > 0
        ):
            raise ValueError(f"task_timeout_s must be a finite number > 0: {self}")


@dataclass(frozen=True)
class CallUsage:
    """What a finished call actually used, from the provider's response."""

    input_uncached: int
    input_cached: int = 0
    output: int = 0


@dataclass(frozen=True)
class Admission:
    """``admitted`` now, or not with ``wait_s``: a lower bound (``inf``: waits for a release)."""

    admitted: bool
    wait_s: float = 0.0


@dataclass(frozen=True)
class PacerUsage:
    """What the pacer admitted over a window: net charges (admission minus settlement refunds)
    per class, the peak in-flight tokens, and the budgets' share used (``utilisation``)."""

    start: float
    end: float
    calls: float
    tokens: float
    output_tokens: float
    peak_inflight: float
    utilisation: dict[BudgetClass, float]
