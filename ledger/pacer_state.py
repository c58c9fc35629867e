"""The budget controller's state in the ledger.

The planner loop advances ``planner.budgets`` once per tick and alias. Two things it needs
live here, so that ``tasks/plan.py`` stays a sequence of reads and writes:

* ``pacer_states`` rows: a ``BudgetState`` as JSON (``state_to_json`` / ``state_from_json``;
  -inf, "never", is stored as null because PostgreSQL's JSON has no infinities), the
  ``pacer_configs`` version it follows, the newest ``llm_calls`` id already observed, the
  tick time and the fleet's smoothed progress (pacer stretch), and the saturation controller's
  multiplier and warm-up start (``overdrive``, ``busy_since`` columns). ``load_state`` /
  ``save_state``: a restarted loop continues with the same budgets, cooldowns, 429 memory and
  overdrive instead of re-seeding.
* ``previous_decision``: the binding and saturating budget of the alias's latest
  ``planner_decisions`` row (whether the window since feeds the saturation controller).

What the gateway saw since the last tick (the ``llm_calls`` after the watermark, the provider's
stated limits) is read by ``ledger.pacer_window``.

A malformed stored state is a ``ConfigError`` naming the field, never a silent reset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.dialects import postgresql, sqlite

from evalfleet.errors import ConfigError
from ledger.clock import as_utc
from ledger.db import write_transaction
from ledger.models import PacerState, PlannerDecision
from planner.budgets import BudgetClass, Budgets, BudgetState, SeedSource, TokenClass

__all__ = [
    "PreviousDecision",
    "StoredState",
    "load_state",
    "previous_decision",
    "save_state",
    "state_from_json",
    "state_to_json",
]

_BUDGET_FIELDS = ("calls_per_s", "tokens_per_s", "output_tokens_per_s", "inflight_tokens")


@dataclass(frozen=True)
class StoredState:
    """One ``pacer_states`` row."""

    alias: str
    state: BudgetState
    config_version: int
    last_call_id: int
    tick_at: datetime
    progress: float = 1.0  # smoothed share of unthrottled speed (planner.sizing.FleetState)
    overdrive: float = 1.0  # the saturation controller's multiplier (planner.sizing.hold_overdrive)
    busy_since: datetime | None = None  # start of the alias's current busy period
    # the cache-counting evidence (``tasks.plan_counting.CountingEvidence`` as JSON)
    counting: dict[str, Any] | None = None


@dataclass(frozen=True)
class PreviousDecision:
    """What the alias's latest ``planner_decisions`` row says about its sizing."""

    tick_at: datetime
    binding: str
    saturating: str | None
    sized_by: str | None = None


def _budgets_json(b: Budgets) -> dict[str, float | None]:
    return {name: getattr(b, name) for name in _BUDGET_FIELDS}


def _time(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _classes(m: Mapping[BudgetClass, float]) -> dict[str, float]:
    return {str(k): float(v) for k, v in m.items()}


def state_to_json(state: BudgetState) -> dict[str, Any]:
    """A ``BudgetState`` as JSON-safe data (no infinities)."""
    return {
        "seed": _budgets_json(state.seed),
        "budgets": _budgets_json(state.budgets),
        "seeded_at": state.seeded_at,
        "seed_source": state.seed_source,
        "token_class": state.token_class,
        "cached_input_counts": state.cached_input_counts,
        "stale_after_s": state.stale_after_s,
        "cooldown_until": _time(state.cooldown_until),
        "backoff_until": _time(state.backoff_until),
        "hard_caps": _classes(state.hard_caps),
        "cap_stated_at": _classes(state.cap_stated_at),
        "last_429_level": _classes(state.last_429_level),
        "last_429_at": _classes(state.last_429_at),
        "level_memory_s": _classes(state.level_memory_s),
        "last_cut_at": _classes(state.last_cut_at),
        "cuts_below_seed": {str(k): list(v) for k, v in state.cuts_below_seed.items()},
        "observed": _classes(state.observed),
        "observed_at": state.observed_at,
        "last_stated": _classes(state.last_stated),
        "at_ceiling_since": _classes(state.at_ceiling_since),
        "at_ceiling_used_s": _classes(state.at_ceiling_used_s),
        "usage_carry": _classes(state.usage_carry),
        "share_rebased_at": _classes(state.share_rebased_at),
        "rebase_up_streak": _classes(state.rebase_up_streak),
        "proven_rate": _classes(state.proven_rate),
        "class_seeded_at": _classes(state.class_seeded_at),
        "unknown_samples": [
            {"at": at, "rates": _classes(rates)} for at, rates in state.unknown_samples
        ],
        "answered": state.answered,
        "throttled": state.throttled,
        "unsettled_reprobe": {
            str(k): {"at": at, "drawn": drawn, "kept": kept}
            for k, (at, drawn, kept) in state.unsettled_reprobe.items()
        },
    }


def _num(data: Mapping[str, Any], key: str, problems: list[str], *, none_is: float) -> float:
    value = data.get(key)
    if value is None:
        return none_is
    if isinstance(value, bool) or not isinstance(value, int | float):
        problems.append(f"{key}: must be a number, got {value!r}")
        return none_is
    return float(value)


def _class_map(data: Mapping[str, Any], key: str, problems: list[str]) -> dict[BudgetClass, Any]:
    raw = data.get(key) or {}
    if not isinstance(raw, dict):
        problems.append(f"{key}: must be an object")
        return {}
    out: dict[BudgetClass, Any] = {}
    for name, value in raw.items():
        try:
            out[BudgetClass(name)] = value
        except ValueError:
            problems.append(f"{key}.{name}: not a budget class")
    return out


def _budgets_from(data: Any, key: str, problems: list[str]) -> Budgets | None:
    if not isinstance(data, dict) or set(data) != set(_BUDGET_FIELDS):
        problems.append(f"{key}: must hold exactly {', '.join(_BUDGET_FIELDS)}")
        return None
    try:
        return Budgets(**data)
    except ConfigError as exc:
        problems.extend(f"{key}.{p}" for p in exc.problems)
    except TypeError as exc:
        problems.append(f"{key}: {exc}")
    return None


def _unsettled(
    data: Mapping[str, Any], problems: list[str]
) -> dict[BudgetClass, tuple[float, float, float]]:
    """``unsettled_reprobe``: absent in states saved before re-probes were settled ({})."""
    out: dict[BudgetClass, tuple[float, float, float]] = {}
    for cls, item in _class_map(data, "unsettled_reprobe", problems).items():
        fields = ("at", "drawn", "kept")
        values = [item.get(f) for f in fields] if isinstance(item, dict) else []
        numbers = [
            float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)
        ]
        if not isinstance(item, dict) or set(item) != set(fields) or len(numbers) != len(fields):
            problems.append(f"unsettled_reprobe.{cls}: must hold numbers at, drawn and kept")
            continue
        out[cls] = (numbers[0], numbers[1], numbers[2])
    return out


def _samples(
    data: Mapping[str, Any], problems: list[str]
) -> tuple[tuple[float, dict[BudgetClass, float]], ...]:
    """``unknown_samples``: absent in states saved before the steadiest-class blame (())."""
    raw = data.get("unknown_samples") or []
    out: list[tuple[float, dict[BudgetClass, float]]] = []
    if not isinstance(raw, list):
        problems.append("unknown_samples: must be a list")
        return ()
    for i, item in enumerate(raw):
        at = item.get("at") if isinstance(item, dict) else None
        where = f"unknown_samples[{i}].rates"
        rates = (
            _class_map({where: item.get("rates")}, where, problems)
            if isinstance(item, dict)
            else {}
        )
        good = isinstance(at, int | float) and not isinstance(at, bool)
        good = good and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in rates.values()
        )
        if not good or not isinstance(at, int | float) or set(item) != {"at", "rates"}:
            problems.append(
                f"unknown_samples[{i}]: must be {{at: number, rates: {{class: number}}}}"
            )
            continue
        out.append((float(at), {k: float(v) for k, v in rates.items()}))
    return tuple(out)


def state_from_json(data: Any, *, source: str) -> BudgetState:
    """The ``BudgetState`` stored by ``state_to_json``; ``ConfigError`` naming what is wrong."""
    if not isinstance(data, dict):
        raise ConfigError(source, ["state: must be an object"])
    problems: list[str] = []
    seed = _budgets_from(data.get("seed"), "seed", problems)
    budgets = _budgets_from(data.get("budgets"), "budgets", problems)
    token_class = data.get("token_class")
    if token_class not in ("input", "combined"):
        problems.append(f"token_class: must be input or combined, got {token_class!r}")
    seed_source = data.get("seed_source")
    if seed_source not in ("config", "headers", "operator", "controller"):
        problems.append(f"seed_source: unknown source {seed_source!r}")
    if not isinstance(data.get("cached_input_counts"), bool):
        problems.append("cached_input_counts: must be true or false")
    seeded_at = _num(data, "seeded_at", problems, none_is=math.nan)
    if math.isnan(seeded_at):
        problems.append("seeded_at: required")
    maps = {
        k: _class_map(data, k, problems)
        for k in (
            "hard_caps",
            "cap_stated_at",  # absent in states saved before caps lapsed: {} (never lapse)
            "last_429_level",
            "last_429_at",
            "last_cut_at",
            "observed",
            "last_stated",  # absent in states saved before it was kept: {} (observed stands in)
            "at_ceiling_since",  # absent in states saved before rule 7: {}
            "at_ceiling_used_s",  # absent in states saved before rule 7's proof: {}
            "usage_carry",  # absent in states saved before a window's excess carried: {}
            "share_rebased_at",  # absent in states saved before the share-loop check: {}
            "level_memory_s",  # absent in states saved before the doubling memory: {}
            "rebase_up_streak",  # absent in states saved before the re-base speed-up: {}
            "proven_rate",  # absent in states saved before rule 7 kept what it proved: {}
            "class_seeded_at",  # absent in states saved before seeds were measured per class: {}
        )
    }
    cuts = _class_map(data, "cuts_below_seed", problems)
    for name, values in [*maps.items(), ("cuts_below_seed", cuts)]:
        for cls, v in values.items():
            items = v if name == "cuts_below_seed" else [v]
            if not isinstance(items, list) or not all(
                isinstance(x, int | float) and not isinstance(x, bool) for x in items
            ):
                problems.append(f"{name}.{cls}: must be numbers")
    samples = _samples(data, problems)
    unsettled = _unsettled(data, problems)
    observed_at = data.get("observed_at")
    if observed_at is not None and not isinstance(observed_at, int | float):
        problems.append("observed_at: must be a number or null")
    # absent in states saved before the launch ramp: an alias already running, no ramp
    flags = {k: data.get(k, True) for k in ("answered", "throttled")}
    for k, v in flags.items():
        if not isinstance(v, bool):
            problems.append(f"{k}: must be true or false")
    stale_after_s = _num(data, "stale_after_s", problems, none_is=6 * 3600.0)
    cooldown_until = _num(data, "cooldown_until", problems, none_is=-math.inf)
    backoff_until = _num(data, "backoff_until", problems, none_is=-math.inf)
    if problems or seed is None or budgets is None:
        raise ConfigError(source, problems)
    return BudgetState(
        seed=seed,
        budgets=budgets,
        seeded_at=seeded_at,
        seed_source=cast(SeedSource, seed_source),
        token_class=cast(TokenClass, token_class),
        cached_input_counts=bool(data["cached_input_counts"]),
        stale_after_s=stale_after_s,
        cooldown_until=cooldown_until,
        backoff_until=backoff_until,
        hard_caps={k: float(v) for k, v in maps["hard_caps"].items()},
        cap_stated_at={k: float(v) for k, v in maps["cap_stated_at"].items()},
        last_429_level={k: float(v) for k, v in maps["last_429_level"].items()},
        last_429_at={k: float(v) for k, v in maps["last_429_at"].items()},
        last_cut_at={k: float(v) for k, v in maps["last_cut_at"].items()},
        cuts_below_seed={k: tuple(float(x) for x in v) for k, v in cuts.items()},
        observed={k: float(v) for k, v in maps["observed"].items()},
        observed_at=None if observed_at is None else float(observed_at),
        last_stated={k: float(v) for k, v in maps["last_stated"].items()},
        at_ceiling_since={k: float(v) for k, v in maps["at_ceiling_since"].items()},
        at_ceiling_used_s={k: float(v) for k, v in maps["at_ceiling_used_s"].items()},
        usage_carry={k: float(v) for k, v in maps["usage_carry"].items()},
        unknown_samples=samples,
        share_rebased_at={k: float(v) for k, v in maps["share_rebased_at"].items()},
        level_memory_s={k: float(v) for k, v in maps["level_memory_s"].items()},
        rebase_up_streak={k: int(v) for k, v in maps["rebase_up_streak"].items()},
        proven_rate={k: float(v) for k, v in maps["proven_rate"].items()},
        class_seeded_at={k: float(v) for k, v in maps["class_seeded_at"].items()},
        answered=bool(flags["answered"]),
        throttled=bool(flags["throttled"]),
        unsettled_reprobe=unsettled,
    )


def load_state(conn: Connection, alias: str) -> StoredState | None:
    """The alias's persisted controller state, or None before its first tick."""
    r = conn.execute(
        select(
            PacerState.alias,
            PacerState.state,
            PacerState.config_version,
            PacerState.last_call_id,
            PacerState.tick_at,
            PacerState.overdrive,
            PacerState.busy_since,
        ).where(PacerState.alias == alias)
    ).first()
    if r is None:
        return None
    source = f"pacer_states {alias!r}"
    progress = r.state.get("progress", 1.0) if isinstance(r.state, dict) else 1.0
    if isinstance(progress, bool) or not isinstance(progress, int | float) or not 0 < progress <= 1:
        raise ConfigError(source, [f"progress: must be in (0, 1], got {progress!r}"])
    if not (math.isfinite(r.overdrive) and 0.5 <= r.overdrive <= 10.0):
        raise ConfigError(source, [f"overdrive: must be within [0.5, 10], got {r.overdrive!r}"])
    return StoredState(
        alias=r.alias,
        state=state_from_json(r.state, source=source),
        config_version=int(r.config_version),
        last_call_id=int(r.last_call_id),
        tick_at=as_utc(r.tick_at),
        progress=float(progress),
        overdrive=float(r.overdrive),
        busy_since=None if r.busy_since is None else as_utc(r.busy_since),
        counting=r.state.get("counting") if isinstance(r.state, dict) else None,
    )


def save_state(engine: Engine, stored: StoredState) -> None:
    """Insert or replace the alias's row (one transaction)."""
    values = {
        "alias": stored.alias,
        "state": state_to_json(stored.state)
        | {"progress": stored.progress}
        | ({} if stored.counting is None else {"counting": stored.counting}),
        "config_version": stored.config_version,
        "last_call_id": stored.last_call_id,
        "tick_at": stored.tick_at,
        "overdrive": stored.overdrive,
        "busy_since": stored.busy_since,
    }
    with write_transaction(engine) as conn:
        ins = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(PacerState)
        stmt = ins.values(**values)
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=[PacerState.alias],
                set_={k: stmt.excluded[k] for k in values if k != "alias"}
                | {"updated_at": func.now()},
            )
        )


def previous_decision(conn: Connection, alias: str) -> PreviousDecision | None:
    """The alias's latest ``planner_decisions`` row (None before its first)."""
    r = conn.execute(
        select(
            PlannerDecision.tick_at,
            PlannerDecision.binding,
            PlannerDecision.saturating,
            PlannerDecision.sized_by,
        )
        .where(PlannerDecision.alias == alias)
        .order_by(PlannerDecision.id.desc())
        .limit(1)
    ).first()
    if r is None:
        return None
    return PreviousDecision(
        tick_at=as_utc(r.tick_at),
        binding=r.binding,
        saturating=r.saturating,
        sized_by=r.sized_by,
    )
