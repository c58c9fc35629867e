"""Operator controls of an alias's pacer constants, audited like every control (``ledger.controls``).

* ``set_pacer`` — edit some of the five constants (calls/s, token budgets, in-flight tokens,
  burst seconds, cooldown seconds) within the bounds of the alias file (``PacerSeed``): the
  ``pacer_configs`` row (version + 1; created from the alias seed on first edit), one
  ``pacer_config_history`` row and one ``audit_log`` row (old -> new), in the caller's
  transaction. An edit changes the values in force, not the seed the planner grows from.
* ``rebase_pacer`` — re-base the seed and the budgets live with ``planner.budgets.rebase``
  semantics: budgets default to the new seed, limits the provider's headers stated (the
  alias's ``alias_observations``) stay hard caps, ``seed_source="operator"``, ``seeded_at=now``
  (the clock is an argument).
* ``show_pacer`` — the values in force, seed, version (the alias seed if never edited).

The planner reads the row (``tasks/plan.py``) and pushes it to the pacer's Prefect limits on its
next tick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from evalfleet.documents import format_validation_error
from evalfleet.errors import ConfigError
from gateway.aliases import Alias, PacerSeed
from gateway.pacer_local import token_class
from ledger import controls
from ledger.clock import as_utc
from ledger.models import AliasObservation, PacerConfig, PacerConfigHistory
from ledger.pacer_window import stated_limits
from planner.budgets import Budgets, initial_state, rebase
from planner.classify import LimitType

PACER_FIELDS = (
    "calls_per_s",
    "tokens_per_s",
    "output_tokens_per_s",
    "inflight_tokens",
    "burst_s",
    "cooldown_s",
)
BUDGET_FIELDS = ("calls_per_s", "tokens_per_s", "output_tokens_per_s", "inflight_tokens")
Change = controls.Change


def pacer_values(row: PacerConfig) -> dict[str, Any]:
    """The constants in force of a ``pacer_configs`` row, as plain data."""
    return {name: getattr(row, name) for name in PACER_FIELDS}


def _seed_values(alias: Alias) -> dict[str, Any]:
    # the constants the ledger versions (the gateway-local hold after a 429 is not one)
    return alias.pacer.model_dump(include=set(PACER_FIELDS))


def _validated(values: Mapping[str, Any], what: str) -> dict[str, Any]:
    unknown = sorted(set(values) - set(PACER_FIELDS))
    if unknown:
        raise ConfigError(what, [f"{name}: not a pacer constant" for name in unknown])
    problems = [
        f"{name}: must be a finite number"
        for name, v in values.items()
        if isinstance(v, float) and not math.isfinite(v)
    ]
    controls.raise_problems(what, problems)
    try:
        return PacerSeed.model_validate(dict(values)).model_dump(include=set(PACER_FIELDS))
    except ValidationError as exc:
        raise ConfigError(what, format_validation_error(exc)) from None


def _pacer_row(session: Session, alias: Alias, now: datetime) -> tuple[PacerConfig, bool]:
    row = session.execute(
        select(PacerConfig).where(PacerConfig.alias == alias.name).with_for_update()
    ).scalar_one_or_none()
    if row is not None:
        return row, False
    seed = _seed_values(alias)
    row = PacerConfig(
        alias=alias.name,
        version=0,
        cached_input_counts=alias.cached_input_counts,
        seed={k: seed[k] for k in BUDGET_FIELDS},
        seed_source="config",
        seeded_at=now,
        **seed,
    )
    session.add(row)
    return row, True


def _write_version(
    session: Session,
    row: PacerConfig,
    values: dict[str, Any],
    *,
    now: datetime,
    actor: str,
    reason: str,
    **extra: Any,
) -> None:
    row.version += 1
    for name, value in values.items():
        setattr(row, name, value)
    for name, value in extra.items():
        setattr(row, name, value)
    row.updated_at = now
    session.flush()
    session.execute(
        insert(PacerConfigHistory).values(
            alias=row.alias,
            version=row.version,
            values={**values, "seed": dict(row.seed), "seed_source": row.seed_source},
            actor=actor,
            reason=reason,
        )
    )


def set_pacer(
    session: Session,
    alias: Alias,
    changes: Mapping[str, Any],
    *,
    now: datetime,
    actor: str,
    reason: str,
) -> Change:
    """Edit some of an alias's pacer constants (a row is created from the alias seed first)."""
    problems: list[str] = []
    controls.check_who(actor, reason, problems)
    if not changes:
        problems.append("changes: name at least one constant to set")
    controls.raise_problems(f"pacer {alias.name}", problems)
    row, _created = _pacer_row(session, alias, now)
    old = pacer_values(row)
    new = _validated({**old, **changes}, f"pacer {alias.name}")
    if new == old:
        raise ConfigError(f"pacer {alias.name}", ["changes: every value is already in force"])
    _write_version(session, row, new, now=now, actor=actor, reason=reason)
    change = Change("pacer.set", f"alias:{alias.name}", old, new)
    controls.write_audit(session, change, actor, reason)
    return change


def rebase_pacer(
    session: Session,
    alias: Alias,
    seed: Mapping[str, Any],
    *,
    budgets: Mapping[str, Any] | None = None,
    now: datetime,
    actor: str,
    reason: str,
) -> Change:
    """Re-base an alias's seed (and budgets, default the new seed) with an audit reason."""
    problems: list[str] = []
    controls.check_who(actor, reason, problems)
    for name, values in (("seed", seed), ("budgets", budgets or {})):
        problems += [f"{name}.{k}: not a budget" for k in values if k not in BUDGET_FIELDS]
    if not seed:
        problems.append("seed: name at least one budget to re-base")
    controls.raise_problems(f"pacer {alias.name}", problems)
    row, _created = _pacer_row(session, alias, now)
    old_values = pacer_values(row)
    old = {**old_values, "seed": dict(row.seed), "seed_source": row.seed_source}
    new_seed = _budgets({**row.seed, **seed}, f"pacer {alias.name} seed")
    new_budgets = (
        _budgets({**new_seed.__dict__, **budgets}, f"pacer {alias.name} budgets")
        if budgets
        else None
    )
    state = initial_state(
        _budgets(dict(row.seed), f"pacer {alias.name} current seed"),
        now.timestamp(),
        observed_limits=_observed_limits(session, alias.name),
        cached_input_counts=row.cached_input_counts,
        token_class=token_class(alias),
    )
    state = rebase(state, new_seed, now.timestamp(), budgets=new_budgets)
    in_force = {**old_values, **{k: getattr(state.budgets, k) for k in BUDGET_FIELDS}}
    values = _validated(in_force, f"pacer {alias.name}")
    seed_json = {k: getattr(state.seed, k) for k in BUDGET_FIELDS}
    _write_version(
        session,
        row,
        values,
        now=now,
        actor=actor,
        reason=reason,
        seed=seed_json,
        seed_source=state.seed_source,
        seeded_at=now,
    )
    change = Change(
        "pacer.rebase",
        f"alias:{alias.name}",
        old,
        {**values, "seed": seed_json, "seed_source": state.seed_source},
    )
    controls.write_audit(session, change, actor, reason)
    return change


def _budgets(values: Mapping[str, Any], what: str) -> Budgets:
    try:
        return Budgets(
            calls_per_s=values.get("calls_per_s"),  # type: ignore[arg-type]
            tokens_per_s=values.get("tokens_per_s"),  # type: ignore[arg-type]
            output_tokens_per_s=values.get("output_tokens_per_s"),
            inflight_tokens=values.get("inflight_tokens"),  # type: ignore[arg-type]
        )
    except ConfigError as exc:
        raise ConfigError(what, exc.problems) from None
    except TypeError as exc:
        raise ConfigError(what, [str(exc)]) from None


def _observed_limits(session: Session, alias: str) -> dict[LimitType, float] | None:
    row = session.execute(
        select(AliasObservation.limits).where(AliasObservation.alias == alias)
    ).scalar_one_or_none()
    if not row:
        return None
    return stated_limits(row.get("limits") if isinstance(row, dict) else None)


def show_pacer(session: Session, alias: Alias) -> dict[str, Any]:
    """The alias's pacer constants in force, seed and version (the alias seed if never edited)."""
    row = session.execute(
        select(PacerConfig).where(PacerConfig.alias == alias.name)
    ).scalar_one_or_none()
    if row is None:
        seed = _seed_values(alias)
        return {
            **seed,
            "version": 0,
            "seed": {k: seed[k] for k in BUDGET_FIELDS},
            "seed_source": "config",
            "seeded_at": None,
        }
    return {
        **pacer_values(row),
        "version": row.version,
        "seed": dict(row.seed),
        "seed_source": row.seed_source,
        "seeded_at": as_utc(row.seeded_at).isoformat(),
    }
