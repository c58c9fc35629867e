"""Operator-control flows, so an operator can run each control from the Prefect UI.

Thin wrappers over ``tasks.controls`` (the same operations as the CLI): every one needs a
``reason`` and records one audit row with ``actor`` (default ``prefect-ui``: OSS Prefect does
not say who started a run). A bad value fails the flow run with the ConfigError's message.
Parameters never carry secrets.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow

from tasks import controls

UI_ACTOR = "prefect-ui"


@flow(name="control-task-cap", persist_result=False)
def set_task_cap(
    run_id: str, cap: int | None, reason: str, actor: str = UI_ACTOR
) -> dict[str, Any]:
    """Set (or clear, with no value) a run's task cap."""
    change = controls.cap_run(run_id, cap, actor=actor, reason=reason)
    return {"old": change.old, "new": change.new}


@flow(name="control-ceiling-override", persist_result=False)
def set_ceiling_override(
    scope: Literal["run", "alias"],
    target: str,
    value: int | None,
    reason: str,
    actor: str = UI_ACTOR,
) -> dict[str, Any]:
    """Set (or clear) the operator ceiling of a run or an alias (0 holds launches)."""
    change = controls.override(scope, target, value, actor=actor, reason=reason)
    return {"old": change.old, "new": change.new}


@flow(name="control-abort", persist_result=False)
def abort(
    scope: Literal["run", "alias", "all"],
    reason: str,
    target: str | None = None,
    live: Literal["finish", "cancel"] = "finish",
    actor: str = UI_ACTOR,
) -> dict[str, Any]:
    """Abort a run, an alias's runs or all runs; live instances finish or are cancelled."""
    outcome = controls.abort(scope, target, live=live, actor=actor, reason=reason)
    return {
        "runs": outcome.result.change.new,
        "revoked_keys": outcome.revoked_keys,
        "cancelled_flow_runs": outcome.cancelled_flow_runs,
    }


@flow(name="control-pacer-set", persist_result=False)
def set_pacer(
    alias: str,
    reason: str,
    calls_per_s: float | None = None,
    tokens_per_s: float | None = None,
    output_tokens_per_s: float | None = None,
    inflight_tokens: float | None = None,
    burst_s: float | None = None,
    cooldown_s: float | None = None,
    actor: str = UI_ACTOR,
) -> dict[str, Any]:
    """Edit the given pacer constants of an alias (the others keep their values)."""
    given = {
        "calls_per_s": calls_per_s,
        "tokens_per_s": tokens_per_s,
        "output_tokens_per_s": output_tokens_per_s,
        "inflight_tokens": inflight_tokens,
        "burst_s": burst_s,
        "cooldown_s": cooldown_s,
    }
    changes = {k: v for k, v in given.items() if v is not None}
    change = controls.pacer_set(alias, changes, actor=actor, reason=reason)
    return {"old": change.old, "new": change.new}


@flow(name="control-pacer-rebase", persist_result=False)
def rebase_pacer(
    alias: str,
    reason: str,
    calls_per_s: float | None = None,
    tokens_per_s: float | None = None,
    output_tokens_per_s: float | None = None,
    inflight_tokens: float | None = None,
    actor: str = UI_ACTOR,
) -> dict[str, Any]:
    """Re-base an alias's seed (and budgets, to the new seed) for the given budget classes."""
    given = {
        "calls_per_s": calls_per_s,
        "tokens_per_s": tokens_per_s,
        "output_tokens_per_s": output_tokens_per_s,
        "inflight_tokens": inflight_tokens,
    }
    seed = {k: v for k, v in given.items() if v is not None}
    change = controls.pacer_rebase(alias, seed, actor=actor, reason=reason)
    return {"old": change.old, "new": change.new}
