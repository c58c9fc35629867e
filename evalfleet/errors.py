"""evalfleet's exception hierarchy: every error a user can cause derives from ``EvalfleetError``.

The CLI turns an ``EvalfleetError`` into its message and exit code 2, never a traceback.
Messages never contain secrets.
"""

from __future__ import annotations


class EvalfleetError(Exception):
    """Base class of every error evalfleet raises on purpose."""

    exit_code = 2


class ConfigError(EvalfleetError):
    """A run config, scenario or profile file is invalid. ``problems`` lists 'path: message'."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


class IllegalTransition(EvalfleetError):
    """A state change that the run or instance state machine does not allow."""

    def __init__(self, kind: str, current: str, target: str) -> None:
        self.kind = kind
        self.current = current
        self.target = target
        super().__init__(f"illegal {kind} transition: {current} -> {target}")


class StaleLease(EvalfleetError):
    """A heartbeat or landing carried a lease token that is no longer the job's."""


class NotFound(EvalfleetError):
    """A run, instance, key or alias that the caller named does not exist."""
