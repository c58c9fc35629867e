"""Refitting a harness's usage curves from the ledger: the logic of ``refit_curves.ipynb`` and of
``evalfleet curves fit``.

``refit`` loads a time window of ``llm_calls`` (``ledger.curve_window.load_fit_window``), fits
it with the planner's own fitting code (``planner.fit.fit_curve``), finds the version in use
(``ledger.curves.latest_curve``: newest stored, else the shipped default) and compares both
curves with the observed rates per minute of task age (``planner.fit.check_curve``).
``write_refit`` stores the new curve as the next version, with its sample count and the fit
quality (in-sample figures, the window, and both curves' worst per-minute errors).
``observed_by_age`` and ``plot_refit`` draw the fit against the data: calls/s, input tokens/s
(with the cached share), output tokens/s and survival, by task age.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from sqlalchemy import Engine

from evalfleet.errors import ConfigError, EvalfleetError, NotFound
from ledger.curve_window import FitWindow, load_fit_window
from ledger.curves import StoredCurve, latest_curve, write_curve
from planner.curves import HarnessCurve
from planner.fit import FitResult, check_curve, fit_curve, interval_mass

DEFAULT_MIN_INSTANCES = 20
CHECK_MINUTES = 10
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}


def parse_when(text: str, now: datetime, *, option: str = "--since") -> datetime:
    """An instant given as ISO 8601 (naive = UTC) or as a duration before ``now`` (``90s``,
    ``30m``, ``6h``, ``2d``, ``1w``). Raises ``ConfigError`` naming ``option``."""
    match = _DURATION.match(text)
    if match:
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
        if seconds > 10 * 365 * 86_400:
            raise ConfigError(option, [f"{text!r}: a duration of at most 10 years"])
        return now - timedelta(seconds=seconds)
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            option,
            [f"{text!r}: give an ISO 8601 time (2026-01-05T12:00Z) or a duration (30m, 6h, 2d)"],
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@dataclass(frozen=True)
class Refit:
    """A fitted window with the curve in use and the per-minute comparison of both."""

    window: FitWindow
    fit: FitResult
    current: StoredCurve | None
    comparison: pd.DataFrame

    @property
    def curve(self) -> HarnessCurve:
        return self.fit.curve

    def worst_errors(self, which: str = "new") -> dict[str, float]:
        """Per quantity, the largest |predicted / observed - 1| over the compared minutes."""
        col = f"rel_error_{which}"
        if col not in self.comparison.columns:
            return {}
        return {
            str(q): _finite(float(g[col].abs().max()))
            for q, g in self.comparison.groupby("quantity")
        }

    def fit_quality(self) -> dict[str, Any]:
        """What ``write_refit`` stores as the row's fit quality (JSON-able, finite or None)."""
        return {
            **{k: _finite(v) for k, v in self.fit.quality.items()},
            "instances": self.fit.instance_count,
            "window": self.window.describe(),
            "check_minutes": CHECK_MINUTES,
            "max_abs_rel_error": self.worst_errors("new"),
            "replaces_version": self.current.version if self.current else None,
            "current_max_abs_rel_error": self.worst_errors("current"),
        }


def _finite(value: float) -> Any:
    return value if math.isfinite(value) else None


def compare(
    calls: pd.DataFrame,
    instances: pd.DataFrame,
    new: HarnessCurve,
    current: HarnessCurve | None,
    *,
    minutes: int = CHECK_MINUTES,
) -> pd.DataFrame:
    """Per minute of age and quantity: observed rate, both curves' predictions and errors."""
    base = check_curve(new, calls, instances, n_bins=minutes)
    base = base.rename(columns={"predicted": "predicted_new", "rel_error": "rel_error_new"})
    if current is None:
        return base
    cur = check_curve(current, calls, instances, n_bins=minutes)[
        ["bin_start_s", "quantity", "predicted", "rel_error"]
    ].rename(columns={"predicted": "predicted_current", "rel_error": "rel_error_current"})
    return base.merge(cur, on=["bin_start_s", "quantity"], how="left")


def refit(
    engine: Engine,
    harness: str,
    since: datetime | None = None,
    until: datetime | None = None,
    *,
    min_instances: int = DEFAULT_MIN_INSTANCES,
    **fit_options: Any,
) -> Refit:
    """Fit ``harness`` from the ledger window [since, until) and compare with the version in
    use. Raises ``ConfigError`` when fewer than ``min_instances`` finished instances ran in the
    window (a curve from a handful of tasks would mislead the planner)."""
    if min_instances < 1:
        raise ConfigError("--min-instances", [f"must be >= 1, got {min_instances}"])
    window = load_fit_window(engine, harness, since, until)
    if window.instance_count < min_instances:
        left_out = ", ".join(f"{k}={v}" for k, v in window.dropped.items() if v)
        raise ConfigError(
            f"harness {harness!r}",
            [
                f"only {window.instance_count} finished instance(s) with calls in the window; "
                f"need at least {min_instances} (--min-instances)"
                + (f"; left out: {left_out}" if left_out else "")
            ],
        )
    fitted = fit_curve(window.calls, harness, instances=window.instances, **fit_options)
    current: StoredCurve | None
    try:
        current = latest_curve(engine, harness)
    except NotFound:
        current = None
    comparison = compare(
        window.calls, window.instances, fitted.curve, current.curve if current else None
    )
    return Refit(window=window, fit=fitted, current=current, comparison=comparison)


def write_refit(engine: Engine, result: Refit) -> int:
    """Store the refit curve as the next version of its harness; returns the version."""
    since = result.window.since.isoformat() if result.window.since else "start"
    until = result.window.until.isoformat() if result.window.until else "now"
    return write_curve(
        engine,
        result.curve,
        sample_count=result.fit.sample_count,
        fit_quality=result.fit_quality(),
        source=f"ledger llm_calls {since} .. {until}",
    )


def observed_by_age(
    calls: pd.DataFrame, instances: pd.DataFrame, *, bin_s: float = 60.0
) -> pd.DataFrame:
    """Observed per-running-task rates per age bin (events / alive task-seconds) and survival.

    Columns: ``age_s`` (bin middle), ``exposure_task_s``, ``alive`` (instances alive at the
    bin start), ``calls_per_s``, ``input_tokens_per_s``, ``cached_input_tokens_per_s``,
    ``uncached_input_tokens_per_s``, ``output_tokens_per_s``, ``cached_share``, ``survival``.
    """
    if not bin_s > 0:
        raise ConfigError("observed_by_age", [f"bin_s: must be > 0, got {bin_s}"])
    if instances.empty:
        raise EvalfleetError("no instances to measure")
    wall = instances["wall_time_s"].to_numpy(dtype=np.float64)
    n_bins = max(1, math.ceil(float(wall.max()) / bin_s))
    edges = np.arange(n_bins + 1, dtype=np.float64) * bin_s
    zeros = np.zeros(wall.size)
    exposure = interval_mass(zeros, wall, np.ones_like(wall), edges)
    age = np.maximum(calls["t_request_s"].to_numpy(dtype=np.float64), 0.0)
    idx = np.minimum((age // bin_s).astype(np.intp), n_bins - 1)

    def per_s(weights: np.ndarray | None) -> np.ndarray:
        total = np.bincount(idx, weights=weights, minlength=n_bins).astype(np.float64)
        return np.divide(total, exposure, out=np.zeros(n_bins), where=exposure > 0)

    tokens_in = calls["input_tokens"].to_numpy(dtype=np.float64)
    cached = calls["cached_input_tokens"].to_numpy(dtype=np.float64)
    out = calls["output_tokens"].to_numpy(dtype=np.float64)
    input_rate = per_s(tokens_in)
    cached_rate = per_s(cached)
    alive = (wall[None, :] > edges[:-1, None]).sum(axis=1)
    return pd.DataFrame(
        {
            "age_s": (edges[:-1] + edges[1:]) / 2.0,
            "exposure_task_s": exposure,
            "alive": alive,
            "calls_per_s": per_s(None),
            "input_tokens_per_s": input_rate,
            "cached_input_tokens_per_s": cached_rate,
            "uncached_input_tokens_per_s": input_rate - cached_rate,
            "output_tokens_per_s": per_s(out),
            "cached_share": np.divide(
                cached_rate, input_rate, out=np.zeros(n_bins), where=input_rate > 0
            ),
            "survival": alive / wall.size,
        }
    )


AGE_LABEL = "task age (min)"


def plot_refit(result: Refit, *, max_age_s: float | None = None) -> Figure:
    """Four panels by task age: the observed rates (dots) against the new fit (solid) and the
    version in use (dashed): calls/s, input tokens/s with the uncached part, output tokens/s,
    and survival."""
    obs = observed_by_age(result.window.calls, result.window.instances)
    top = max_age_s or float(result.window.instances["wall_time_s"].quantile(0.95))
    obs = obs[obs["age_s"] <= top + 60.0]
    grid = np.linspace(0.0, top, 400)
    minutes = grid / 60.0
    new = result.curve
    cur = result.current.curve if result.current else None
    cur_label = f"in use (v{result.current.version})" if result.current else ""
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    axes = fig.subplots(2, 2, sharex=True)
    panels: list[tuple[Any, str, str, str]] = [
        (axes[0, 0], "calls_per_s", "calls/s per task", "LLM calls"),
        (axes[0, 1], "input_tokens_per_s", "input tokens/s per task", "input tokens"),
        (axes[1, 0], "output_tokens_per_s", "output tokens/s per task", "output tokens"),
    ]
    for ax, name, ylabel, title in panels:
        ax.plot(obs["age_s"] / 60.0, obs[name], "o", color="k", ms=4, label="observed")
        ax.plot(minutes, getattr(new, name)(grid), "-", color="C0", label="new fit")
        if cur is not None:
            ax.plot(minutes, getattr(cur, name)(grid), "--", color="C1", label=cur_label)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    ax_in = axes[0, 1]
    ax_in.plot(
        obs["age_s"] / 60.0, obs["uncached_input_tokens_per_s"], "s", color="C2", ms=3,
        label="observed uncached",
    )  # fmt: skip
    ax_in.plot(
        minutes, new.uncached_input_tokens_per_s(grid), "-", color="C2", label="fit uncached"
    )
    share = float(
        np.average(obs["cached_share"], weights=np.maximum(obs["exposure_task_s"], 1e-12))
    )
    ax_in.set_title(f"input tokens (cached share {share:.0%})")
    ax_s = axes[1, 1]
    ax_s.step(obs["age_s"] / 60.0 - 0.5, obs["survival"], where="post", color="k", label="observed")
    ax_s.plot(minutes, new.survival(grid), "-", color="C0", label="new fit")
    if cur is not None:
        ax_s.plot(minutes, cur.survival(grid), "--", color="C1", label=cur_label)
    ax_s.set_ylabel("share of tasks still running")
    ax_s.set_title("survival")
    ax_s.set_ylim(0, 1.05)
    for ax in axes.flat:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel(AGE_LABEL)
    fig.suptitle(
        f"{result.window.harness}: fit from {result.window.instance_count} instances, "
        f"{result.window.call_count} calls"
    )
    return fig
