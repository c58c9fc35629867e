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


class ConfigSourceUnavailable(ConfigError):
    """A run config's source (a file, an S3 bucket or object) cannot be read: missing, access
    denied, or unreachable. ``retryable`` is True when trying again later may succeed (network,
    throttling), False when the source itself is wrong (no such bucket or key, access denied)."""

    def __init__(self, source: str, problems: list[str], *, retryable: bool) -> None:
        self.retryable = retryable
        super().__init__(source, problems)


class ServiceUnavailable(EvalfleetError):
    """A service a setting names (``setting``) cannot be reached when a part that depends on it
    starts, e.g. the Valkey through which gateway replicas share budgets."""

    def __init__(self, setting: str, detail: str) -> None:
        self.setting = setting
        self.detail = detail
        super().__init__(f"{setting}: {detail}")


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


class KeyManagementError(EvalfleetError):
    """Minting, storing or revoking a run's provider or gateway key failed (never shows a secret)."""


class KeyRejected(EvalfleetError):
    """A gateway key is unknown, revoked or expired (``reason``); the call is never forwarded."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"gateway key {reason}")


class SpendCapExceeded(EvalfleetError):
    """A call's worst-case cost could take the run past its spend cap; it was not forwarded."""

    def __init__(self, run_id: str, cap: int, spent: int, reserved: int, requested: int) -> None:
        self.run_id = run_id
        self.cap = cap
        self.spent = spent
        self.reserved = reserved
        self.requested = requested
        super().__init__(
            f"run {run_id}: spend cap reached: this call may cost up to {requested} micro-USD but "
            f"only {max(0, cap - spent - reserved)} of the cap {cap} remain "
            f"(spent {spent}, reserved by calls in flight {reserved})"
        )


class HarnessFailed(EvalfleetError):
    """The agent (or evaluator) itself failed on an instance: scored as ``error``, not retried.

    ``error_class`` is a short machine label (``harness_exit``, ``harness_no_result``, ...);
    ``detail`` holds what an operator needs (e.g. the tail of the program's stderr), never a key.
    """

    def __init__(self, error_class: str, detail: str) -> None:
        self.error_class = error_class
        self.detail = detail
        super().__init__(f"{error_class}: {detail}")


class InfrastructureFailure(EvalfleetError):
    """Not the agent's fault (429 after retries, provider or gateway down, lost worker): the
    instance goes back to the queue and is never scored for it."""

    def __init__(self, error_class: str, detail: str) -> None:
        self.error_class = error_class
        self.detail = detail
        super().__init__(f"{error_class}: {detail}")
