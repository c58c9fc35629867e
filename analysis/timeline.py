"""A run's timeline from the ledger: the logic of ``run_timeline.ipynb``.

``load_timeline`` reads one run (default: the newest) and what happened around it: its calls
(``llm_calls``), instances (``instance_results``), the planner's decisions for its alias
(``planner_decisions``), the pools' capacity snapshots and the audit log over the run's time
span, and the provider limits the alias's latest headers stated (``alias_observations``).
``timeline_figures`` draws four figures, all on "minutes since run start":

- ``fleet``: live, booting and ceiling (planner decisions; capacity snapshots when there are
  none), the binding constraint as a coloured band, operator actions as markers;
- ``rates``: calls/s and tokens/s (input, uncached input, output) per minute against the
  alias's budgets (step lines from the decisions) and the header limits (per minute / 60);
- ``throttles``: 429s per minute, stacked by limit type;
- ``instances``: distributions of instance duration and cost.

``save_figures`` writes them as PNG and returns a manifest (file, pixel size, axes labels read
from the Figure before saving) for CI to check.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from sqlalchemy import Engine, select

from evalfleet.errors import ConfigError, NotFound
from ledger.clock import as_utc
from ledger.db import readonly
from ledger.models import (
    AliasObservation,
    AuditLog,
    CapacitySnapshot,
    InstanceResult,
    LlmCall,
    PlannerDecision,
    Run,
)

TIME_LABEL = "minutes since run start"
BINDING_COLOURS = {
    "paced": "#2ca02c",
    "arrival_budget": "#1f77b4",
    "qps_budget": "#17becf",
    "inflight_budget": "#9467bd",
    "cooldown": "#d62728",
    "at_capacity": "#7f7f7f",
    "run_cap": "#8c564b",
    "ceiling_override": "#e377c2",
    "paused": "#000000",
    "stale_config": "#ff7f0e",
    "no_work": "#bcbd22",
    "launch_ramp": "#aec7e8",
}


@dataclass(frozen=True)
class Timeline:
    """One run and the ledger rows around it; times as minutes since ``start``."""

    run_id: str
    alias: str
    harness: str
    state: str
    start: datetime
    end: datetime
    calls: pd.DataFrame
    instances: pd.DataFrame
    decisions: pd.DataFrame
    snapshots: pd.DataFrame
    audit: pd.DataFrame
    header_limits: Mapping[str, float]

    @property
    def duration_min(self) -> float:
        return (self.end - self.start).total_seconds() / 60.0


def _frame(rows: Any, columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame([tuple(r) for r in rows], columns=columns)


def _minutes(values: pd.Series, start: datetime) -> np.ndarray:
    origin = start.timestamp()
    return np.array(
        [(as_utc(v).timestamp() - origin) / 60.0 if v is not None else np.nan for v in values],
        dtype=np.float64,
    )


def load_timeline(engine: Engine, run_id: str | None = None) -> Timeline:
    """Read run ``run_id`` (default: the most recently created run) and its surroundings.

    Raises ``NotFound`` for an unknown run or an empty ledger.
    """
    if run_id is not None and (not run_id or len(run_id) > 36):
        raise ConfigError("run id", [f"must be 1-36 characters, got {run_id!r}"])
    with readonly(engine).connect() as conn:
        query = select(Run.id, Run.alias, Run.harness, Run.state, Run.created_at, Run.closed_at)
        query = (
            query.where(Run.id == run_id)
            if run_id
            else query.order_by(Run.created_at.desc(), Run.id).limit(1)
        )
        run = conn.execute(query).one_or_none()
        if run is None:
            raise NotFound(f"run {run_id} does not exist" if run_id else "the ledger has no runs")
        rid, alias, harness, state, created_at, closed_at = run
        calls = _frame(
            conn.execute(
                select(
                    LlmCall.instance_id,
                    LlmCall.requested_at,
                    LlmCall.input_tokens,
                    LlmCall.cached_input_tokens,
                    LlmCall.output_tokens,
                    LlmCall.status,
                    LlmCall.limit_type,
                    LlmCall.pacer_wait_s,
                    LlmCall.cost_micro_usd,
                ).where(LlmCall.run_id == rid)
            ).all(),
            [
                "instance_id",
                "requested_at",
                "input_tokens",
                "cached_input_tokens",
                "output_tokens",
                "status",
                "limit_type",
                "pacer_wait_s",
                "cost_micro_usd",
            ],
        )
        instances = _frame(
            conn.execute(
                select(
                    InstanceResult.instance_id,
                    InstanceResult.state,
                    InstanceResult.started_at,
                    InstanceResult.claimed_at,
                    InstanceResult.running_at,
                    InstanceResult.finished_at,
                    InstanceResult.calls,
                    InstanceResult.cost_micro_usd,
                ).where(InstanceResult.run_id == rid)
            ).all(),
            [
                "instance_id",
                "state",
                "started_at",
                "claimed_at",
                "running_at",
                "finished_at",
                "calls",
                "cost_micro_usd",
            ],
        )
        start = as_utc(created_at)
        candidates = [start]
        for frame, col in ((calls, "requested_at"), (instances, "finished_at")):
            values = [as_utc(v) for v in frame[col] if v is not None]
            if values:
                candidates.append(max(values))
        end = as_utc(closed_at) if closed_at is not None else max(candidates)
        end = max(end, start + timedelta(seconds=1))
        decisions = _frame(
            conn.execute(
                select(
                    PlannerDecision.tick_at,
                    PlannerDecision.live,
                    PlannerDecision.booting,
                    PlannerDecision.queued,
                    PlannerDecision.ceiling,
                    PlannerDecision.binding,
                    PlannerDecision.budgets,
                )
                .where(
                    PlannerDecision.alias == alias,
                    PlannerDecision.tick_at >= start,
                    PlannerDecision.tick_at <= end,
                )
                .order_by(PlannerDecision.tick_at)
            ).all(),
            ["tick_at", "live", "booting", "queued", "ceiling", "binding", "budgets"],
        )
        snapshots = _frame(
            conn.execute(
                select(
                    CapacitySnapshot.pool,
                    CapacitySnapshot.taken_at,
                    CapacitySnapshot.running,
                    CapacitySnapshot.booting,
                    CapacitySnapshot.queued,
                    CapacitySnapshot.ceiling,
                )
                .where(CapacitySnapshot.taken_at >= start, CapacitySnapshot.taken_at <= end)
                .order_by(CapacitySnapshot.taken_at)
            ).all(),
            ["pool", "taken_at", "running", "booting", "queued", "ceiling"],
        )
        audit = _frame(
            conn.execute(
                select(AuditLog.at, AuditLog.actor, AuditLog.action, AuditLog.target)
                .where(AuditLog.at >= start, AuditLog.at <= end)
                .order_by(AuditLog.at, AuditLog.id)
            ).all(),
            ["at", "actor", "action", "target"],
        )
        observed = conn.execute(
            select(AliasObservation.limits).where(AliasObservation.alias == alias)
        ).scalar_one_or_none()
    calls["t_min"] = _minutes(calls["requested_at"], start)
    instances["start_min"] = _minutes(instances["started_at"], start)
    instances["end_min"] = _minutes(instances["finished_at"], start)
    # the last attempt's boot: its claim to its harness's start (NaN where either is unknown)
    instances["boot_s"] = 60.0 * (
        _minutes(instances["running_at"], start) - _minutes(instances["claimed_at"], start)
    )
    decisions["t_min"] = _minutes(decisions["tick_at"], start)
    snapshots["t_min"] = _minutes(snapshots["taken_at"], start)
    audit["t_min"] = _minutes(audit["at"], start)
    limits = (observed or {}).get("limits", {}) if isinstance(observed, dict) else {}
    return Timeline(
        run_id=rid,
        alias=alias,
        harness=harness,
        state=state,
        start=start,
        end=end,
        calls=calls,
        instances=instances,
        decisions=decisions,
        snapshots=snapshots,
        audit=audit,
        header_limits={str(k): float(v) for k, v in limits.items() if v is not None},
    )


def per_minute(tl: Timeline, bin_min: float = 1.0) -> pd.DataFrame:
    """Per ``bin_min`` minutes: calls/s and tokens/s of answered calls (status 200), and the
    number of 429s per limit type (columns ``429:<type>``)."""
    if not bin_min > 0:
        raise ConfigError("per_minute", [f"bin_min: must be > 0, got {bin_min}"])
    n_bins = max(1, int(np.ceil(tl.duration_min / bin_min)))
    edges = np.arange(n_bins + 1) * bin_min
    c = tl.calls
    idx = np.clip((c["t_min"].to_numpy() // bin_min).astype(np.intp), 0, n_bins - 1)
    ok = c["status"].to_numpy() == 200
    seconds = bin_min * 60.0

    def rate(weights: np.ndarray | None, mask: np.ndarray) -> np.ndarray:
        w = None if weights is None else weights[mask]
        return np.bincount(idx[mask], weights=w, minlength=n_bins) / seconds

    tokens_in = c["input_tokens"].to_numpy(dtype=np.float64)
    cached = c["cached_input_tokens"].to_numpy(dtype=np.float64)
    out = pd.DataFrame(
        {
            "t_min": edges[:-1],
            "calls_per_s": rate(None, ok),
            "input_tokens_per_s": rate(tokens_in, ok),
            "uncached_input_tokens_per_s": rate(tokens_in - cached, ok),
            "output_tokens_per_s": rate(c["output_tokens"].to_numpy(dtype=np.float64), ok),
        }
    )
    status = c["status"].to_numpy()
    types = c["limit_type"].fillna("unknown").to_numpy()
    for kind in sorted(set(types[status == 429])):
        mask = (status == 429) & (types == kind)
        out[f"429:{kind}"] = np.bincount(idx[mask], minlength=n_bins)
    return out


def _operator_markers(ax: Axes, tl: Timeline, *, label: bool) -> None:
    for row in tl.audit.itertuples(index=False):
        ax.axvline(row.t_min, color="#444444", linestyle=":", linewidth=1)
        if label:
            ax.annotate(
                row.action,
                (row.t_min, 1.0),
                xycoords=("data", "axes fraction"),
                rotation=90,
                fontsize=7,
                va="top",
                ha="right",
            )


def _binding_band(ax: Axes, decisions: pd.DataFrame, end_min: float) -> list[str]:
    """Shade the time axis by the binding constraint; returns the constraints shown."""
    if decisions.empty:
        return []
    t = decisions["t_min"].to_numpy()
    kinds = decisions["binding"].astype(str).to_numpy()
    shown: list[str] = []
    start = 0
    for i in range(1, t.size + 1):
        if i == t.size or kinds[i] != kinds[start]:
            right = t[i] if i < t.size else end_min
            kind = kinds[start]
            ax.axvspan(
                t[start],
                right,
                ymin=0.0,
                ymax=0.06,
                color=BINDING_COLOURS.get(kind, "#cccccc"),
                alpha=0.9,
                label=None if kind in shown else f"binding: {kind}",
                linewidth=0,
            )
            if kind not in shown:
                shown.append(kind)
            start = i
    return shown


def _budget_series(decisions: pd.DataFrame, key: str) -> np.ndarray:
    return np.array(
        [
            float(b.get(key, np.nan)) if isinstance(b, dict) and b.get(key) is not None else np.nan
            for b in decisions["budgets"]
        ]
    )


def fleet_figure(tl: Timeline) -> Figure:
    """Live, booting and ceiling over time, binding constraint band, operator markers."""
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    ax = fig.add_subplot()
    if not tl.decisions.empty:
        d = tl.decisions
        ax.step(d["t_min"], d["live"], where="post", label="live (running)")
        ax.step(d["t_min"], d["booting"], where="post", label="booting")
        ax.step(d["t_min"], d["ceiling"], where="post", linestyle="--", label="ceiling")
        source = "planner decisions"
    elif not tl.snapshots.empty:
        s = tl.snapshots
        ax.step(s["t_min"], s["running"], where="post", label="running")
        ax.step(s["t_min"], s["booting"], where="post", label="booting")
        ax.step(s["t_min"], s["ceiling"], where="post", linestyle="--", label="ceiling")
        source = "capacity snapshots"
    else:
        source = "no planner decisions or capacity snapshots in the run's span"
    _binding_band(ax, tl.decisions, tl.duration_min)
    _operator_markers(ax, tl, label=True)
    ax.set_xlim(0, tl.duration_min)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(TIME_LABEL)
    ax.set_ylabel("tasks")
    ax.set_title(f"fleet of run {tl.run_id[:8]} on {tl.alias} ({source})")
    ax.legend(fontsize=7, loc="upper right", ncols=2)
    ax.grid(alpha=0.3)
    return fig


def rates_figure(tl: Timeline, rates: pd.DataFrame | None = None) -> Figure:
    """Calls/s and tokens/s per minute against budgets (decisions) and header limits."""
    r = per_minute(tl) if rates is None else rates
    fig = Figure(figsize=(11, 7), layout="constrained")
    ax_calls, ax_tokens = fig.subplots(2, 1, sharex=True)
    ax_calls.step(r["t_min"], r["calls_per_s"], where="post", label="calls/s (answered)")
    ax_tokens.step(r["t_min"], r["input_tokens_per_s"], where="post", label="input tokens/s")
    ax_tokens.step(
        r["t_min"], r["uncached_input_tokens_per_s"], where="post", label="uncached input tokens/s"
    )
    ax_tokens.step(r["t_min"], r["output_tokens_per_s"], where="post", label="output tokens/s")
    d = tl.decisions
    if not d.empty:
        for ax, key, label in (
            (ax_calls, "calls_per_s", "budget calls/s"),
            (ax_tokens, "tokens_per_s", "budget tokens/s"),
            (ax_tokens, "output_tokens_per_s", "budget output tokens/s"),
        ):
            values = _budget_series(d, key)
            if np.isfinite(values).any():
                ax.step(d["t_min"], values, where="post", linestyle="--", label=label)
    limits = tl.header_limits
    if "requests" in limits:
        ax_calls.axhline(limits["requests"] / 60.0, color="r", lw=1, label="header limit requests")
    for key in ("tokens", "input_tokens", "output_tokens"):
        if key in limits:
            ax_tokens.axhline(limits[key] / 60.0, color="r", lw=1, ls="-.", label=f"header {key}")
    for ax in (ax_calls, ax_tokens):
        _operator_markers(ax, tl, label=ax is ax_calls)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_calls.set_ylabel("calls/s")
    ax_tokens.set_ylabel("tokens/s")
    ax_tokens.set_xlabel(TIME_LABEL)
    ax_tokens.set_xlim(0, tl.duration_min)
    ax_calls.set_title(f"rates of run {tl.run_id[:8]} against budgets and header limits")
    return fig


def throttles_figure(tl: Timeline, rates: pd.DataFrame | None = None) -> Figure:
    """429s per minute, stacked by the limit type the provider named."""
    r = per_minute(tl) if rates is None else rates
    fig = Figure(figsize=(11, 3.5), layout="constrained")
    ax = fig.add_subplot()
    bottom = np.zeros(r.shape[0])
    kinds = [c for c in r.columns if c.startswith("429:")]
    for col in kinds:
        ax.bar(r["t_min"], r[col], width=1.0, align="edge", bottom=bottom, label=col[4:])
        bottom = bottom + r[col].to_numpy()
    if not kinds:
        ax.text(0.5, 0.5, "no 429s", transform=ax.transAxes, ha="center")
    _operator_markers(ax, tl, label=False)
    ax.set_xlim(0, tl.duration_min)
    ax.set_xlabel(TIME_LABEL)
    ax.set_ylabel("429s per minute")
    ax.set_title(f"429s by limit type ({int(bottom.sum())} in all)")
    if kinds:
        ax.legend(fontsize=7, title="limit type")
    ax.grid(alpha=0.3)
    return fig


def instances_figure(tl: Timeline) -> Figure:
    """Distributions of instance duration (first claim to landing), boot delay (the last
    attempt's claim to its harness's start: what ``EVALFLEET_PLANNER_BOOT_S`` should be near)
    and cost."""
    inst = tl.instances
    done = inst[np.isfinite(inst["end_min"]) & np.isfinite(inst["start_min"])]
    fig = Figure(figsize=(15, 3.8), layout="constrained")
    ax_d, ax_b, ax_c = fig.subplots(1, 3)
    durations = (done["end_min"] - done["start_min"]).to_numpy()
    boots = inst["boot_s"].to_numpy(dtype=np.float64)
    boots = boots[np.isfinite(boots)]
    cost = inst["cost_micro_usd"].to_numpy(dtype=np.float64) / 1e6
    ax_d.hist(durations, bins=30, color="C0")
    ax_b.hist(boots, bins=30, color="C2")
    ax_c.hist(cost, bins=30, color="C1")
    for ax, values in ((ax_d, durations), (ax_b, boots), (ax_c, cost)):
        if values.size:
            ax.axvline(float(np.median(values)), color="k", ls="--", lw=1, label="median")
            ax.axvline(float(np.quantile(values, 0.9)), color="k", ls=":", lw=1, label="p90")
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        ax.set_ylabel("instances")
    ax_d.set_xlabel("duration (min)")
    ax_b.set_xlabel("boot (s)")
    ax_c.set_xlabel("cost (USD)")
    ax_d.set_title(f"instance duration ({durations.size} finished)")
    ax_b.set_title(f"boot, claim to harness start ({boots.size} attempts)")
    ax_c.set_title(f"instance cost (total {cost.sum():.2f} USD)")
    return fig


def timeline_figures(tl: Timeline) -> dict[str, Figure]:
    """The four figures of the timeline notebook, by name."""
    rates = per_minute(tl)
    return {
        "fleet": fleet_figure(tl),
        "rates": rates_figure(tl, rates),
        "throttles": throttles_figure(tl, rates),
        "instances": instances_figure(tl),
    }


def axes_labels(fig: Figure) -> list[dict[str, str]]:
    """Per axes of ``fig``: its x label, y label and title."""
    return [
        {"xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(), "title": ax.get_title()}
        for ax in fig.axes
    ]


def png_size(path: Path) -> tuple[int, int]:
    """Pixel (width, height) of a PNG file, read from its header; ConfigError if not a PNG."""
    with path.open("rb") as fh:
        head = fh.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ConfigError(str(path), ["not a PNG file"])
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def save_figures(
    figures: Mapping[str, Figure], out_dir: Path, *, dpi: int = 80
) -> list[dict[str, Any]]:
    """Write each figure as ``<out_dir>/<name>.png`` and a ``figures.json`` manifest beside
    them: per figure its file, pixel width/height and axes labels (read before saving)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = []
    for name, fig in figures.items():
        labels = axes_labels(fig)
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=dpi)
        width, height = png_size(path)
        manifest.append(
            {"name": name, "file": path.name, "width": width, "height": height, "axes": labels}
        )
    (out_dir / "figures.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest
