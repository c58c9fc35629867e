"""Node values of a usage curve from binned rates: mean-preserving, non-negative, smoothed.

A ``HarnessCurve`` interpolates linearly between node ages. Given observed rates per (pooled)
age bin, ``solve_nodes`` finds node values >= 0 such that the curve's exposure-weighted mean over
each bin matches the observed rate (``averaging_matrix`` maps node values to those bin means),
with a roughness penalty on second differences (``roughness_matrix``). Bins are weighted by their
exposure, since a bin's rate has variance ~ 1 / exposure: young, well-observed bins are matched
closely, and the tail, where few tasks live, is smoothed.

``cv_penalty`` picks the penalty weight by K-fold cross-validation over *instances* (the folds'
binned sums): the weight that best predicts the binned rates of instances left out, which is
what a curve is for. Pure numpy/scipy; no I/O.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def averaging_matrix(
    node_age: FloatArray,
    groups: list[npt.NDArray[np.intp]],
    edges: FloatArray,
    durations: FloatArray,
    points_per_bin: int = 30,
) -> FloatArray:
    """``A[g, j]``: exposure-weighted mean over pooled bin ``g`` of the ``j``-th hat function.

    ``groups`` lists the bin indices (bins of ``edges``) of each pooled bin; ``durations`` are
    the instances' lifetimes, which weight each age by how many instances are alive at it.
    """
    bin_s = float(edges[1] - edges[0])
    step = bin_s / points_per_bin
    grid = np.arange(0.0, float(edges[-1]), step) + step / 2.0
    sorted_d = np.sort(durations)
    alive = (sorted_d.size - np.searchsorted(sorted_d, grid, side="right")).astype(np.float64)
    group_of_bin = np.zeros(edges.size - 1, dtype=np.intp)
    for gi, g in enumerate(groups):
        group_of_bin[g] = gi
    grid_group = group_of_bin[np.minimum((grid // bin_s).astype(np.intp), edges.size - 2)]
    n = node_age.size
    identity = np.eye(n)
    averaging = np.zeros((len(groups), n))
    for j in range(n):
        hat = np.interp(grid, node_age, identity[j])
        averaging[:, j] = np.bincount(grid_group, weights=alive * hat, minlength=len(groups))
    totals = np.bincount(grid_group, weights=alive, minlength=len(groups))
    return np.asarray(averaging / np.maximum(totals, 1e-12)[:, None], dtype=np.float64)


def roughness_matrix(node_age: FloatArray) -> FloatArray:
    """Second divided differences of node values, scaled to the median node spacing."""
    n = node_age.size
    if n < 3:
        return np.zeros((0, n))
    h = np.diff(node_age)
    scale = float(np.median(h))
    rough = np.zeros((n - 2, n))
    for k in range(n - 2):
        rough[k, k] = scale / h[k]
        rough[k, k + 1] = -scale / h[k] - scale / h[k + 1]
        rough[k, k + 2] = scale / h[k + 1]
    return rough


def solve_nodes(
    averaging: FloatArray,
    rough: FloatArray,
    bin_means: FloatArray,
    exposure: FloatArray,
    penalty: float,
) -> FloatArray:
    """Node values >= 0 minimising the exposure-weighted misfit of bin means plus the penalty.

    With ``penalty = 0`` and a non-negative exact solution the bin means are matched exactly.
    """
    # imported here, not at the top: scipy.optimize takes ~0.5 s to import, and only a fit
    # needs it (the simulator and the planner loop import this module without fitting)
    import scipy.optimize

    weights = np.sqrt(exposure / max(float(exposure.max()), 1e-300))
    lhs = np.vstack([averaging * weights[:, None], np.sqrt(penalty) * rough])
    rhs = np.concatenate([bin_means * weights, np.zeros(rough.shape[0])])
    solution, _ = scipy.optimize.nnls(lhs, rhs, maxiter=50 * lhs.shape[1])
    return np.asarray(solution, dtype=np.float64)


def cv_penalty(
    averaging: FloatArray,
    rough: FloatArray,
    fold_exposure: FloatArray,
    fold_events: FloatArray,
    candidates: int = 25,
) -> float:
    """Penalty weight (0 included) that best predicts held-out folds' binned rates.

    ``fold_exposure`` and ``fold_events`` are (folds x bins) sums. For each candidate weight and
    fold, the nodes are fitted on the other folds and scored by the fold's exposure-weighted
    squared error of bin rates; the weight with the lowest total wins (the smoother on ties).
    """
    if rough.size == 0:
        return 0.0
    total_e = fold_exposure.sum(axis=0)
    total_ev = fold_events.sum(axis=0)
    w = total_e / max(float(total_e.max()), 1e-300)
    ata = averaging.T @ (w[:, None] * averaging)
    dtd = rough.T @ rough
    base = float(np.trace(ata) / max(float(np.trace(dtd)), 1e-300))
    grid = np.concatenate([[0.0], base * np.logspace(-5, 2, candidates)])
    best, best_score = 0.0, np.inf
    for penalty in grid:
        score = 0.0
        for f in range(fold_exposure.shape[0]):
            train_e = total_e - fold_exposure[f]
            train_rate = np.divide(
                total_ev - fold_events[f], train_e, out=np.zeros_like(train_e), where=train_e > 0
            )
            nodes = solve_nodes(averaging, rough, train_rate, train_e, float(penalty))
            test_e = fold_exposure[f]
            test_rate = np.divide(
                fold_events[f], test_e, out=np.zeros_like(test_e), where=test_e > 0
            )
            score += float(np.sum(test_e * (averaging @ nodes - test_rate) ** 2))
        if score <= best_score * (1 + 1e-9):
            best, best_score = float(penalty), min(score, best_score)
    return best
