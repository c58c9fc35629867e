"""Operator-control operations shared by the CLI (``evalfleet cap|override|abort|pacer``) and the
control flows (``flows/controls.py``, runnable from the Prefect UI).

Each runs one audited ledger control (``ledger.controls`` / ``ledger.pacer_controls``) in its
own transaction on the process's ledger, after checking that a named alias exists. ``abort``
then does what the ledger cannot: it revokes the keys of runs now ``aborted`` and asks Prefect
to cancel the flow runs of instances it aborted (``live="cancel"``). Those follow-ups are tried
for every run; failures are collected and raised together as ``ControlFollowUpFailed`` (the
ledger change stays committed, and the supervisor's key recovery revokes any key left active
on an aborted run).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from evalfleet.errors import EvalfleetError
from evalfleet.settings import get_settings
from gateway.aliases import Alias, load_aliases
from ledger import controls, pacer_controls
from tasks.ledger_io import engine


class ControlFollowUpFailed(EvalfleetError):
    """The control is recorded, but revoking keys or cancelling flow runs failed for some."""


@dataclass(frozen=True)
class AbortOutcome:
    result: controls.AbortResult
    revoked_keys: int
    cancelled_flow_runs: int


def alias(name: str) -> Alias:
    """The configured gateway alias ``name`` (NotFound names the known ones)."""
    settings = get_settings()
    return load_aliases(settings.aliases_file, provider_sim_url=settings.provider_sim_url).get(name)


def cap_run(run_id: str, cap: int | None, *, actor: str, reason: str) -> controls.Change:
    with controls.control_session(engine()) as session:
        return controls.set_task_cap(session, run_id, cap, actor=actor, reason=reason)


def override(
    scope: str, target: str, value: int | None, *, actor: str, reason: str
) -> controls.Change:
    if scope == "alias":
        alias(target)
    with controls.control_session(engine()) as session:
        return controls.set_ceiling_override(
            session,
            scope,  # type: ignore[arg-type]  # validated by the control
            target,
            value,
            actor=actor,
            reason=reason,
        )


def abort(scope: str, target: str | None, *, live: str, actor: str, reason: str) -> AbortOutcome:
    with controls.control_session(engine()) as session:
        result = controls.abort(
            session,
            scope,  # type: ignore[arg-type]  # validated by the control
            target,
            live=live,  # type: ignore[arg-type]
            actor=actor,
            reason=reason,
        )
    problems: list[str] = []
    revoked = 0
    for run_id in result.revoke_keys:
        try:
            from tasks.keys import revoke_keys

            revoked += len(revoke_keys(run_id))
        except Exception as exc:  # noqa: BLE001 - every run is tried; all failures are raised
            problems.append(f"run {run_id}: revoking keys failed: {type(exc).__name__}: {exc}")
    cancelled = _cancel(result.cancel_flow_runs, reason, problems)
    if problems:
        raise ControlFollowUpFailed(
            f"abort recorded, but {len(problems)} follow-up(s) failed: " + "; ".join(problems)
        )
    return AbortOutcome(result, revoked, cancelled)


def _cancel(flow_run_ids: tuple[str, ...], reason: str, problems: list[str]) -> int:
    if not flow_run_ids:
        return 0
    from prefect import get_client
    from prefect.states import Cancelling

    done = 0
    with get_client(sync_client=True) as client:
        for fid in flow_run_ids:
            try:
                flow_run = client.read_flow_run(uuid.UUID(fid))
                if flow_run.state is not None and not flow_run.state.is_final():
                    client.set_flow_run_state(
                        uuid.UUID(fid), Cancelling(message=f"aborted by operator: {reason[:200]}")
                    )
                    done += 1
            except Exception as exc:  # noqa: BLE001 - collected and raised by the caller
                problems.append(f"flow run {fid}: cancel failed: {type(exc).__name__}: {exc}")
    return done


def pacer_show(name: str) -> dict[str, Any]:
    with controls.control_session(engine()) as session:
        return pacer_controls.show_pacer(session, alias(name))


def pacer_set(name: str, changes: Mapping[str, Any], *, actor: str, reason: str) -> controls.Change:
    config = alias(name)
    with controls.control_session(engine()) as session:
        return pacer_controls.set_pacer(
            session, config, changes, now=datetime.now(UTC), actor=actor, reason=reason
        )


def pacer_rebase(name: str, seed: Mapping[str, Any], *, actor: str, reason: str) -> controls.Change:
    config = alias(name)
    with controls.control_session(engine()) as session:
        return pacer_controls.rebase_pacer(
            session, config, seed, now=datetime.now(UTC), actor=actor, reason=reason
        )
