"""Fitting a ``HarnessCurve`` from a table of LLM calls, and checking one against held-out calls.

Input: one row per LLM call (``instance_id``, ``t_request_s`` = seconds since the instance's
container started, ``input_tokens`` (cached included), ``cached_input_tokens``,
``output_tokens``) and, optionally, one row per instance with ``wall_time_s`` (container start to
end). Without instances, a task is taken to end when its last call's response arrives.

Method (exposure-based, so every rate is per *running* task):
1. Each instance is alive on ``[0, wall_time_s]``; the exposure of an age bin is the sum of
   alive task-seconds in it. Rate in a bin = events in the bin / exposure of the bin.
2. Bins with little exposure (few tasks live to high ages) are pooled with their neighbours
   until each pooled bin has at least ``min_exposure_s`` task-seconds; its node sits at the
   exposure-weighted mean age. The curve interpolates linearly between nodes, flat outside.
3. In flight: the traces hold request times, not latencies, so a call is assumed in flight for
   ``latency_base_s + latency_per_output_token_s * output_tokens`` seconds, cut at the next
   request of the same instance (or the instance's end). In-flight tokens of a bin = the
   integral over the bin of (input + output) tokens of the calls in flight / exposure.
4. Survival: the empirical share of instances alive, on a ``survival_step_s`` grid, up to the
   age where only ``tail_min_alive`` instances remain; beyond it an exponential tail whose mean
   is those instances' mean residual life.

``check_curve`` compares a curve with observed calls per age bin (exposure-weighted, so the
comparison is fair whatever the survival of the held-out set) and reports relative errors.
Pure computation: pandas and numpy only; errors in the data raise ``ConfigError``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from evalfleet.errors import ConfigError
from planner.curve_smoothing import averaging_matrix, cv_penalty, roughness_matrix, solve_nodes
from planner.curves import HarnessCurve

FloatArray = npt.NDArray[np.float64]

CALL_COLUMNS = (
    "instance_id",
    "t_request_s",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
)
CHECKED_QUANTITIES = (
    "calls_per_s",
    "input_tokens_per_s",
    "uncached_input_tokens_per_s",
    "cached_input_tokens_per_s",
    "output_tokens_per_s",
)


@dataclass(frozen=True)
class FitResult:
    """A fitted curve with the size of the sample it came from and in-sample quality figures."""

    curve: HarnessCurve
    sample_count: int
    instance_count: int
    quality: dict[str, float]


@dataclass(frozen=True)
class _Prepared:
    instance_ids: npt.NDArray[np.object_]
    durations: FloatArray  # per instance, aligned with instance_ids
    call_instance: npt.NDArray[np.intp]  # index into instance_ids, per call
    age: FloatArray
    cached: FloatArray
    uncached: FloatArray
    output: FloatArray
    latency: FloatArray  # per call, after cutting at the next request / the end


def _numeric(df: pd.DataFrame, column: str, source: str, problems: list[str]) -> FloatArray:
    values = np.asarray(pd.to_numeric(df[column], errors="coerce"), dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        problems.append(f"{source}.{column}: {int(bad.sum())} missing or non-numeric values")
    return values


def _binsum(idx: npt.NDArray[np.intp], weights: FloatArray | None, n_bins: int) -> FloatArray:
    return np.asarray(np.bincount(idx, weights=weights, minlength=n_bins), dtype=np.float64)


def _prepare(
    calls: pd.DataFrame,
    instances: pd.DataFrame | None,
    latency_base_s: float,
    latency_per_output_token_s: float,
) -> _Prepared:
    problems: list[str] = []
    missing = [c for c in CALL_COLUMNS if c not in calls.columns]
    if missing:
        raise ConfigError("calls", [f"missing columns: {', '.join(missing)}"])
    if calls.empty:
        raise ConfigError("calls", ["no calls to fit"])
    t = _numeric(calls, "t_request_s", "calls", problems)
    tokens_in = _numeric(calls, "input_tokens", "calls", problems)
    cached = _numeric(calls, "cached_input_tokens", "calls", problems)
    out = _numeric(calls, "output_tokens", "calls", problems)
    if problems:
        raise ConfigError("calls", problems)
    for name, arr in (("input_tokens", tokens_in), ("cached_input_tokens", cached)):
        if (arr < 0).any():
            problems.append(f"calls.{name}: {int((arr < 0).sum())} negative values")
    if (out < 0).any():
        problems.append(f"calls.output_tokens: {int((out < 0).sum())} negative values")
    if (cached > tokens_in).any():
        problems.append(
            f"calls.cached_input_tokens: {int((cached > tokens_in).sum())} rows exceed input_tokens"
        )
    if problems:
        raise ConfigError("calls", problems)

    ids = calls["instance_id"].astype(str).to_numpy()
    age = np.maximum(t, 0.0)  # requests can be logged slightly before the container start
    order = np.lexsort((age, ids))
    ids, age, tokens_in, cached, out = (
        ids[order],
        age[order],
        tokens_in[order],
        cached[order],
        out[order],
    )
    uniq, call_instance = np.unique(ids, return_inverse=True)
    last_request = np.zeros(uniq.size)
    np.maximum.at(last_request, call_instance, age)

    nominal = latency_base_s + latency_per_output_token_s * out
    if instances is not None:
        for col in ("instance_id", "wall_time_s"):
            if col not in instances.columns:
                raise ConfigError("instances", [f"missing column: {col}"])
        wall = _numeric(instances, "wall_time_s", "instances", problems)
        if problems:
            raise ConfigError("instances", problems)
        if (wall <= 0).any():
            raise ConfigError("instances", ["wall_time_s: must be > 0 for every instance"])
        by_id = pd.Series(wall, index=instances["instance_id"].astype(str).to_numpy())
        if by_id.index.has_duplicates:
            raise ConfigError("instances", ["instance_id: duplicate instance ids"])
        absent = [i for i in uniq if i not in by_id.index]
        if absent:
            raise ConfigError(
                "instances",
                [f"{len(absent)} instance(s) with calls have no row, e.g. {absent[0]!r}"],
            )
        # Instances without calls still count: they were alive and asked nothing.
        extra = np.setdiff1d(by_id.index.to_numpy().astype(str), uniq)
        all_ids = np.concatenate([uniq, extra]).astype(object)
        durations = by_id.reindex(all_ids).to_numpy(dtype=np.float64, copy=True)
        # A call cannot outlive its instance: keep the instance alive until its last request.
        durations[: uniq.size] = np.maximum(durations[: uniq.size], last_request)
    else:
        all_ids = uniq.astype(object)
        last_latency = np.zeros(uniq.size)
        np.maximum.at(
            last_latency, call_instance, np.where(age == last_request[call_instance], nominal, 0)
        )
        durations = last_request + np.maximum(last_latency, 1e-3)

    # Next request of the same instance (calls are sorted by instance, then age).
    next_age = np.empty_like(age)
    next_age[:-1] = age[1:]
    same = np.zeros(age.size, dtype=bool)
    same[:-1] = call_instance[1:] == call_instance[:-1]
    end = np.where(same, next_age, durations[call_instance])
    latency = np.clip(np.minimum(nominal, end - age), 0.0, None)
    return _Prepared(
        instance_ids=all_ids,
        durations=durations,
        call_instance=call_instance,
        age=age,
        cached=cached,
        uncached=tokens_in - cached,
        output=out,
        latency=latency,
    )


def interval_mass(
    starts: FloatArray, ends: FloatArray, weights: FloatArray, edges: FloatArray
) -> FloatArray:
    """Per bin of ``edges``: sum over intervals of weight x length of [start, end] in the bin.

    O(n log n) with sorting and cumulative sums; intervals may span any number of bins.
    """

    def mass(points: FloatArray, w: FloatArray, x: FloatArray) -> FloatArray:
        order = np.argsort(points)
        p, ww = points[order], w[order]
        cw = np.concatenate([[0.0], np.cumsum(ww)])
        cwp = np.concatenate([[0.0], np.cumsum(ww * p)])
        k = np.searchsorted(p, x, side="left")
        return np.asarray(x * cw[k] - cwp[k], dtype=np.float64)  # sum_{p_i<x} w_i (x - p_i)

    total = mass(starts, weights, edges) - mass(ends, weights, edges)
    # differences of large cumulative sums: a bin no interval reaches can come out -1e-9, and a
    # negative exposure's square root (the fit's bin weights) is NaN; no mass is below zero
    return np.maximum(np.diff(total), 0.0)


def _pool(exposure: FloatArray, min_exposure_s: float) -> list[npt.NDArray[np.intp]]:
    """Group consecutive bins so each group has at least ``min_exposure_s`` of exposure."""
    groups: list[list[int]] = []
    current: list[int] = []
    acc = 0.0
    for i, e in enumerate(exposure):
        current.append(i)
        acc += float(e)
        if acc >= min_exposure_s:
            groups.append(current)
            current, acc = [], 0.0
    if current:
        if groups:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return [np.asarray(g, dtype=np.intp) for g in groups]


def _bin_events(
    p: _Prepared, edges: FloatArray, instance_mask: npt.NDArray[np.bool_] | None
) -> tuple[FloatArray, dict[str, FloatArray]]:
    """Exposure (alive task-seconds) and event sums per bin, for the instances in the mask."""
    n_bins = edges.size - 1
    durations = p.durations if instance_mask is None else p.durations[instance_mask]
    zeros = np.zeros(durations.size)
    exposure = interval_mass(zeros, durations, np.ones_like(zeros), edges)
    sel = (
        np.ones(p.age.size, dtype=bool) if instance_mask is None else instance_mask[p.call_instance]
    )
    age, cached, uncached, out = p.age[sel], p.cached[sel], p.uncached[sel], p.output[sel]
    idx = np.minimum((age // (edges[1] - edges[0])).astype(np.intp), n_bins - 1)
    flight_end = age + p.latency[sel]
    events = {
        "calls_per_s": _binsum(idx, None, n_bins),
        "cached_input_tokens_per_s": _binsum(idx, cached, n_bins),
        "uncached_input_tokens_per_s": _binsum(idx, uncached, n_bins),
        "output_tokens_per_s": _binsum(idx, out, n_bins),
        "inflight_tokens": interval_mass(age, flight_end, cached + uncached + out, edges),
        "inflight_calls": interval_mass(age, flight_end, np.ones_like(age), edges),
    }
    return exposure, events


def _fold_events(
    p: _Prepared, edges: FloatArray, groups: list[npt.NDArray[np.intp]], k: int
) -> tuple[FloatArray, dict[str, FloatArray]]:
    """Per instance fold (deterministic: sorted ids dealt round-robin), pooled-bin sums."""
    k = max(2, min(k, p.durations.size))
    fold_of = np.arange(p.durations.size) % k
    fold_exposure = np.zeros((k, len(groups)))
    fold_events: dict[str, FloatArray] = {}
    for f in range(k):
        exposure, events = _bin_events(p, edges, fold_of == f)
        fold_exposure[f] = [exposure[g].sum() for g in groups]
        for name, ev in events.items():
            fold_events.setdefault(name, np.zeros((k, len(groups))))[f] = [
                ev[g].sum() for g in groups
            ]
    return fold_exposure, fold_events


def _survival(
    durations: FloatArray, step_s: float, tail_min_alive: int
) -> tuple[FloatArray, FloatArray, float]:
    d = np.sort(durations)
    n = d.size
    if n <= tail_min_alive:
        return np.array([0.0]), np.array([1.0]), max(float(d.mean()), 1.0)
    tail_start = float(d[n - tail_min_alive - 1])
    grid = np.arange(0.0, tail_start, step_s)
    grid = np.append(grid, tail_start) if grid[-1] < tail_start else grid
    alive = n - np.searchsorted(d, grid, side="right")
    values = alive / n
    values[0] = 1.0  # every instance runs at age 0 (durations are > 0)
    residual = d[d > tail_start] - tail_start
    tail_s = max(float(residual.mean()), 1.0) if residual.size else max(step_s, 1.0)
    return grid, values.astype(np.float64), tail_s


def fit_curve(
    calls: pd.DataFrame,
    harness: str,
    *,
    instances: pd.DataFrame | None = None,
    bin_s: float = 60.0,
    min_exposure_s: float | None = None,
    survival_step_s: float = 10.0,
    tail_min_alive: int = 20,
    latency_base_s: float = 1.0,
    latency_per_output_token_s: float = 0.01,
    mean_preserving: bool = True,
    smooth: bool = True,
    cv_folds: int = 5,
    fit_info: dict[str, Any] | None = None,
    max_nodes: int = 240,
) -> FitResult:
    """Fit a ``HarnessCurve`` for ``harness`` from a table of calls (see the module docstring).

    ``min_exposure_s`` (default: 20 running tasks for a whole bin, ``20 * bin_s``) is the
    smallest exposure of a pooled bin; ``tail_min_alive`` is where survival switches to its
    exponential tail. ``latency_*`` is the assumed LLM latency model for in-flight figures.
    With ``mean_preserving`` (the default) node values are solved so that the interpolated
    curve's exposure-weighted mean over each pooled bin equals the observed rate there (plain
    bin rates at the nodes would bias bins where the rate bends, e.g. the first minute).
    With ``smooth`` a roughness penalty regularises the sparsely observed tail; its weight is
    chosen per quantity by ``cv_folds``-fold cross-validation over instances (see
    ``planner.curve_smoothing``). Where pooling leaves more than ``max_nodes`` bins, the
    smallest exposure of one is raised until it does not: the solves grow faster than the
    square of the nodes, and tasks of many hours at 60 s bins gave 512 nodes and a fit of
    80 s (a parametric harness of ``sim.generate_wide``), or one of hours.
    """
    problems = []
    if not (math.isfinite(bin_s) and bin_s > 0):
        problems.append(f"bin_s: must be > 0, got {bin_s}")
    if not (math.isfinite(survival_step_s) and survival_step_s > 0):
        problems.append(f"survival_step_s: must be > 0, got {survival_step_s}")
    if tail_min_alive < 1:
        problems.append(f"tail_min_alive: must be >= 1, got {tail_min_alive}")
    if max_nodes < 2:
        problems.append(f"max_nodes: must be >= 2, got {max_nodes}")
    if latency_base_s < 0 or latency_per_output_token_s < 0:
        problems.append("latency_base_s, latency_per_output_token_s: must be >= 0")
    if problems:
        raise ConfigError("fit_curve", problems)
    min_exp = 20.0 * bin_s if min_exposure_s is None else float(min_exposure_s)
    p = _prepare(calls, instances, latency_base_s, latency_per_output_token_s)

    n_bins = max(1, math.ceil(float(p.durations.max()) / bin_s))
    edges = np.arange(n_bins + 1, dtype=np.float64) * bin_s
    exposure, events = _bin_events(p, edges, None)
    centers = (edges[:-1] + edges[1:]) / 2.0
    groups = [g for g in _pool(exposure, min_exp) if exposure[g].sum() > 0]
    while len(groups) > max_nodes:
        min_exp *= len(groups) / max_nodes
        groups = [g for g in _pool(exposure, min_exp) if exposure[g].sum() > 0]
    node_age = np.array([np.average(centers[g], weights=exposure[g]) for g in groups])
    group_exposure = np.array([exposure[g].sum() for g in groups])
    values = {
        name: np.array([ev[g].sum() for g in groups]) / group_exposure
        for name, ev in events.items()
    }
    smoothing: dict[str, float] = {}
    if mean_preserving and len(groups) > 1:
        averaging = averaging_matrix(node_age, groups, edges, p.durations)
        rough = roughness_matrix(node_age) if smooth else np.zeros((0, node_age.size))
        folds = _fold_events(p, edges, groups, cv_folds) if smooth and rough.size else None
        for name in list(values):
            lam = 0.0
            if folds is not None:
                fold_exposure, fold_events = folds
                lam = cv_penalty(averaging, rough, fold_exposure, fold_events[name])
            smoothing[name] = lam
            values[name] = solve_nodes(averaging, rough, values[name], group_exposure, lam)
    surv_age, surv, tail_s = _survival(p.durations, survival_step_s, tail_min_alive)

    curve = HarnessCurve(
        harness=harness,
        rate_age_s=tuple(float(x) for x in node_age),
        calls_per_s_at=tuple(float(x) for x in values["calls_per_s"]),
        cached_input_tokens_per_s_at=tuple(float(x) for x in values["cached_input_tokens_per_s"]),
        uncached_input_tokens_per_s_at=tuple(
            float(x) for x in values["uncached_input_tokens_per_s"]
        ),
        output_tokens_per_s_at=tuple(float(x) for x in values["output_tokens_per_s"]),
        inflight_tokens_at=tuple(float(x) for x in values["inflight_tokens"]),
        inflight_calls_at=tuple(float(x) for x in values["inflight_calls"]),
        survival_age_s=tuple(float(x) for x in surv_age),
        survival_at=tuple(float(x) for x in surv),
        survival_tail_s=float(tail_s),
        latency_base_s=float(latency_base_s),
        latency_per_output_token_s=float(latency_per_output_token_s),
        fit_info=tuple(sorted((fit_info or {}).items())),
    )
    quality = {
        "bins": float(n_bins),
        "nodes": float(len(groups)),
        "exposure_task_s": float(exposure.sum()),
        "max_age_s": float(p.durations.max()),
        "survival_tail_start_s": float(surv_age[-1]),
        "mean_duration_s_observed": float(p.durations.mean()),
        "mean_duration_s_curve": curve.mean_duration_s(),
        **{f"penalty_{name}": lam for name, lam in smoothing.items()},
    }
    return FitResult(
        curve=curve,
        sample_count=int(p.age.size),
        instance_count=int(p.durations.size),
        quality=quality,
    )


def check_curve(
    curve: HarnessCurve,
    calls: pd.DataFrame,
    instances: pd.DataFrame | None = None,
    *,
    bin_s: float = 60.0,
    n_bins: int = 8,
    resolution_s: float = 1.0,
    bootstrap: int = 0,
    seed: int = 0,
) -> pd.DataFrame:
    """Compare ``curve`` with observed calls, per age bin, per running task.

    One row per (bin, quantity): ``bin_start_s``, ``quantity``, ``observed`` (events /
    exposure of the given instances), ``predicted`` (the curve's rate averaged over the bin,
    weighted by how many of these instances are alive at each age), ``rel_error``
    (``predicted / observed - 1``; NaN-free: bins without exposure are dropped),
    ``exposure_task_s`` and ``alive`` (instances alive at the bin's start). With ``bootstrap``
    > 0, also ``observed_lo`` / ``observed_hi``: the 95% percentile interval of ``observed``
    over that many resamples of the instances (with replacement, seeded): how precisely these
    instances measure the rate. Few instances or rare heavy events (a cache miss resends a
    whole context) make it wide; events absent from the sample cannot appear in it.
    """
    p = _prepare(calls, instances, curve.latency_base_s, curve.latency_per_output_token_s)
    edges = np.arange(n_bins + 1, dtype=np.float64) * bin_s
    # Per instance and bin: exposure and event sums (the bootstrap resamples these rows).
    inst_exposure = np.clip(np.minimum(p.durations[:, None], edges[1:]) - edges[:-1], 0.0, None)
    exposure = inst_exposure.sum(axis=0)
    inside = p.age < edges[-1]
    cell = (p.call_instance[inside], (p.age[inside] // bin_s).astype(np.intp))
    per_inst: dict[str, FloatArray] = {}
    for name, weights in (
        ("calls_per_s", np.ones(p.age.size)),
        ("cached_input_tokens_per_s", p.cached),
        ("uncached_input_tokens_per_s", p.uncached),
        ("output_tokens_per_s", p.output),
    ):
        per_inst[name] = np.zeros((p.durations.size, n_bins))
        np.add.at(per_inst[name], cell, weights[inside])
    per_inst["input_tokens_per_s"] = (
        per_inst["cached_input_tokens_per_s"] + per_inst["uncached_input_tokens_per_s"]
    )
    observed = {name: m.sum(axis=0) for name, m in per_inst.items()}
    interval: dict[str, tuple[FloatArray, FloatArray]] = {}
    if bootstrap > 0:
        rng = np.random.default_rng(seed)
        n = p.durations.size
        counts = np.zeros((bootstrap, n))
        np.add.at(counts, (np.arange(bootstrap)[:, None], rng.integers(0, n, (bootstrap, n))), 1)
        boot_exposure = counts @ inst_exposure
        for name, m in per_inst.items():
            rates = np.divide(
                counts @ m,
                boot_exposure,
                out=np.full_like(boot_exposure, np.nan),
                where=boot_exposure > 0,
            )
            lo, hi = np.nanpercentile(rates, [2.5, 97.5], axis=0)
            interval[name] = (lo, hi)
    grid = np.arange(0.0, edges[-1], resolution_s) + resolution_s / 2.0
    sorted_d = np.sort(p.durations)
    alive = (sorted_d.size - np.searchsorted(sorted_d, grid, side="right")).astype(np.float64)
    grid_bin = (grid // bin_s).astype(np.intp)
    alive_per_bin = _binsum(grid_bin, alive, n_bins)
    rows: list[dict[str, Any]] = []
    for name in CHECKED_QUANTITIES:
        rate = getattr(curve, name)(grid)
        predicted_sum = _binsum(grid_bin, rate * alive, n_bins)
        for b in range(n_bins):
            if exposure[b] <= 0 or alive_per_bin[b] <= 0:
                continue
            obs = float(observed[name][b] / exposure[b])
            pred = float(predicted_sum[b] / alive_per_bin[b])
            row = {
                "bin_start_s": float(edges[b]),
                "quantity": name,
                "observed": obs,
                "predicted": pred,
                "rel_error": (pred / obs - 1.0) if obs > 0 else (0.0 if pred == 0 else math.inf),
                "exposure_task_s": float(exposure[b]),
                "alive": int((p.durations > edges[b]).sum()),
            }
            if name in interval:
                row["observed_lo"] = float(interval[name][0][b])
                row["observed_hi"] = float(interval[name][1][b])
            rows.append(row)
    return pd.DataFrame(rows)
