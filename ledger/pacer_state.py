"""The budget controller's state in the ledger, and what the gateway saw since the last tick.

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
* ``read_window``: the ``llm_calls`` of one alias after the watermark id — 429s by limit type,
  overloads, spend errors (and the runs they hit), the counted usage of each budget class — and
  ``fresh_header_limits``: the provider's latest stated limits when they were observed after the
  previous tick (an old observation must not keep a stale seed looking fresh).

The window is an id watermark, not a time range: the gateway's recorder writes calls in
batches, so a call requested before a tick can land after it, and a time range would miss it.
(An id taken by a batch that commits after a later id was read is missed; batches commit
within milliseconds, so that is rare and costs one observation, never a wrong cut.)

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
from ledger.models import (
    THROTTLE_LIMITS_KEY,
    AliasObservation,
    LlmCall,
    PacerState,
    PlannerDecision,
)
from planner.budgets import BudgetClass, Budgets, BudgetState, SeedSource, TokenClass
from planner.classify import LimitType

__all__ = [
    "PreviousDecision",
    "StoredState",
    "WindowCalls",
    "accepted_rates",
    "fresh_header_limits",
    "latest_call_id",
    "load_state",
    "previous_decision",
    "read_window",
    "save_state",
    "state_from_json",
    "state_to_json",
    "stated_limits",
]

_BUDGET_FIELDS = ("calls_per_s", "tokens_per_s", "output_tokens_per_s", "inflight_tokens")
_RATE_TYPES = {
    LimitType.REQUESTS.value,
    LimitType.TOKENS.value,
    LimitType.INPUT_TOKENS.value,
    LimitType.OUTPUT_TOKENS.value,
    LimitType.DAILY.value,  # the controller backs off on it, cutting nothing
    LimitType.UNKNOWN.value,
}
_OVERLOAD_STATUS = (503, 529)


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


@dataclass(frozen=True)
class WindowCalls:
    """What the gateway recorded for one alias after the watermark (``llm_calls`` rows)."""

    calls: int
    throttles: tuple[LimitType, ...]
    overloads: int
    spend_errors: int
    spend_runs: tuple[str, ...]
    usage: Mapping[BudgetClass, float]  # summed over the window (in-flight: token-seconds)
    last_call_id: int
    pacer_wait_s: float = 0.0  # summed over the window's calls

    def stretch_progress(self, mean_gap_s: float) -> float | None:
        """1 / (1 + pacer wait per call / a task's mean gap between calls); None: no calls."""
        if self.calls == 0 or mean_gap_s <= 0 or not math.isfinite(mean_gap_s):
            return None
        return 1.0 / (1.0 + (self.pacer_wait_s / self.calls) / mean_gap_s)

    def utilisation(self, budgets: Budgets, window_s: float) -> dict[BudgetClass, float]:
        """Share of each budget the window used (rates over ``window_s``)."""
        out: dict[BudgetClass, float] = {}
        for cls in budgets.classes():
            budget = budgets.get(cls)
            if budget is not None and budget > 0 and window_s > 0:
                out[cls] = self.usage.get(cls, 0.0) / window_s / budget
        return out


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
        "last_429_level": _classes(state.last_429_level),
        "last_429_at": _classes(state.last_429_at),
        "level_memory_s": _classes(state.level_memory_s),
        "last_cut_at": _classes(state.last_cut_at),
        "cuts_below_seed": {str(k): list(v) for k, v in state.cuts_below_seed.items()},
        "observed": _classes(state.observed),
        "observed_at": state.observed_at,
        "at_ceiling_since": _classes(state.at_ceiling_since),
        "share_rebased_at": _classes(state.share_rebased_at),
        "unknown_samples": [
            {"at": at, "rates": _classes(rates)} for at, rates in state.unknown_samples
        ],
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
            "last_429_level",
            "last_429_at",
            "last_cut_at",
            "observed",
            "at_ceiling_since",  # absent in states saved before rule 7: {}
            "share_rebased_at",  # absent in states saved before the share-loop check: {}
            "level_memory_s",  # absent in states saved before the doubling memory: {}
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
    observed_at = data.get("observed_at")
    if observed_at is not None and not isinstance(observed_at, int | float):
        problems.append("observed_at: must be a number or null")
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
        last_429_level={k: float(v) for k, v in maps["last_429_level"].items()},
        last_429_at={k: float(v) for k, v in maps["last_429_at"].items()},
        last_cut_at={k: float(v) for k, v in maps["last_cut_at"].items()},
        cuts_below_seed={k: tuple(float(x) for x in v) for k, v in cuts.items()},
        observed={k: float(v) for k, v in maps["observed"].items()},
        observed_at=None if observed_at is None else float(observed_at),
        at_ceiling_since={k: float(v) for k, v in maps["at_ceiling_since"].items()},
        unknown_samples=samples,
        share_rebased_at={k: float(v) for k, v in maps["share_rebased_at"].items()},
        level_memory_s={k: float(v) for k, v in maps["level_memory_s"].items()},
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


def latest_call_id(conn: Connection) -> int:
    """The newest ``llm_calls`` id (0 when there is none)."""
    return int(conn.execute(select(func.max(LlmCall.id))).scalar_one() or 0)


def _counted_tokens(token_class: TokenClass, cached_input_counts: bool) -> Any:
    """The SQL expression of a call's tokens in the alias's counted token class."""
    counted: Any = LlmCall.input_tokens - LlmCall.cached_input_tokens
    if cached_input_counts:
        counted = counted + LlmCall.cached_input_tokens
    if token_class == "combined":
        counted = counted + LlmCall.output_tokens
    return counted


def accepted_rates(
    conn: Connection,
    alias: str,
    since: datetime,
    until: datetime,
    *,
    token_class: TokenClass,
    cached_input_counts: bool,
) -> dict[BudgetClass, float]:
    """What the provider accepted for ``alias`` between ``since`` and ``until`` (successful
    calls requested then), per budget class, per second: the measurement a repeated 429 cut
    reads (``WindowObservation.delivered``)."""
    span = (until - since).total_seconds()
    if span <= 0:
        return {}
    zero = 0
    row = conn.execute(
        select(
            func.count(),
            func.coalesce(func.sum(_counted_tokens(token_class, cached_input_counts)), zero),
            func.coalesce(func.sum(LlmCall.output_tokens), zero),
        ).where(
            LlmCall.alias == alias,
            LlmCall.status == 200,
            LlmCall.requested_at >= since,
            LlmCall.requested_at <= until,
        )
    ).one()
    return {
        BudgetClass.REQUESTS: float(row[0]) / span,
        BudgetClass.TOKENS: float(row[1]) / span,
        BudgetClass.OUTPUT_TOKENS: float(row[2]) / span,
    }


def read_window(
    conn: Connection,
    alias: str,
    after_id: int,
    *,
    token_class: TokenClass,
    cached_input_counts: bool,
) -> WindowCalls:
    """Aggregate the alias's ``llm_calls`` with id > ``after_id``."""
    ok = LlmCall.status == 200
    counted = _counted_tokens(token_class, cached_input_counts)
    zero = 0

    def ok_sum(expr: Any) -> Any:
        return func.coalesce(func.sum(func.coalesce(expr, zero)).filter(ok), zero)

    base = (LlmCall.alias == alias, LlmCall.id > after_id)
    agg = conn.execute(
        select(
            func.count(),
            func.coalesce(func.max(LlmCall.id), after_id),
            ok_sum(counted),
            ok_sum(LlmCall.output_tokens),
            ok_sum((LlmCall.input_tokens + LlmCall.output_tokens) * LlmCall.latency_s),
            func.coalesce(func.sum(LlmCall.pacer_wait_s), 0.0),
        ).where(*base)
    ).one()
    errors = conn.execute(
        select(LlmCall.status, LlmCall.limit_type, LlmCall.run_id, func.count())
        .where(*base, LlmCall.status != 200)
        .group_by(LlmCall.status, LlmCall.limit_type, LlmCall.run_id)
    ).all()
    throttles: list[LimitType] = []
    overloads = spend = 0
    spend_runs: set[str] = set()
    for status, limit_type, run_id, n in errors:
        if limit_type == LimitType.SPEND.value:
            spend += int(n)
            if run_id:
                spend_runs.add(run_id)
        elif limit_type == LimitType.OVERLOAD.value or status in _OVERLOAD_STATUS:
            overloads += int(n)
        elif status == 429 and limit_type in _RATE_TYPES:
            throttles.extend([LimitType(limit_type)] * int(n))
        elif status == 429:
            throttles.extend([LimitType.UNKNOWN] * int(n))
    return WindowCalls(
        calls=int(agg[0]),
        throttles=tuple(throttles),
        overloads=overloads,
        spend_errors=spend,
        spend_runs=tuple(sorted(spend_runs)),
        usage={
            BudgetClass.REQUESTS: float(agg[0]),
            BudgetClass.TOKENS: float(agg[2]),
            BudgetClass.OUTPUT_TOKENS: float(agg[3]),
            BudgetClass.INFLIGHT: float(agg[4]),
        },
        last_call_id=int(agg[1]),
        pacer_wait_s=float(agg[5]),
    )


def fresh_header_limits(
    conn: Connection, alias: str, since: datetime | None
) -> dict[LimitType, float] | None:
    """The provider's stated limits (per minute) for ``alias`` when observed after ``since``:
    the latest response's headers, plus what a 429 since then stated that they do not (a limit
    only a 429's message names, as OpenAI's output-token limit, is in no success's headers)."""
    row = conn.execute(
        select(
            AliasObservation.observed_at,
            AliasObservation.limits,
            AliasObservation.last_limited_at,
        ).where(AliasObservation.alias == alias)
    ).first()
    if row is None or (since is not None and as_utc(row[0]) <= since):
        return None
    stored = row[1] if isinstance(row[1], dict) else {}
    limits = stated_limits(stored.get("limits"))
    limited_at = row[2]
    if limited_at is not None and (since is None or as_utc(limited_at) > since):
        for limit_type, value in stated_limits(stored.get(THROTTLE_LIMITS_KEY)).items():
            limits.setdefault(limit_type, value)
    return limits or None


def stated_limits(raw: Any) -> dict[LimitType, float]:
    """Positive numeric limits by known limit type (anything else in the JSON is ignored)."""
    return {k: v for k, v in _stated(raw).items() if v > 0}


def stated_remaining(raw: Any) -> dict[LimitType, float]:
    """Non-negative remaining values by known limit type (0 is a value: an empty bucket)."""
    return {k: v for k, v in _stated(raw).items() if v >= 0}


def _stated(raw: Any) -> dict[LimitType, float]:
    if not isinstance(raw, dict):
        return {}
    known = {t.value for t in LimitType}
    return {
        LimitType(k): float(v)
        for k, v in raw.items()
        if k in known and isinstance(v, int | float) and not isinstance(v, bool)
    }
