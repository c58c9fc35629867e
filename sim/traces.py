"""The shipped agent traces as DataFrames, their deterministic train/test split, and synthetic calls.

- ``load_calls`` / ``load_instances`` read ``sim/traces/<name>.{calls,instances}.csv.gz`` (see
  ``sim/traces/README.md`` for the columns) through ``importlib.resources``.
- ``split_instances`` splits instance ids 80/20 (by default) deterministically: instances are
  ordered by a SHA-256 of ``salt:instance_id`` and the first share goes to the test set, so the
  split never depends on row order, pandas version or a random seed.
- ``synthesize_calls`` samples instances and their calls from a ``HarnessCurve``: duration from
  its survival, calls as a non-homogeneous Poisson process with the curve's calls/s, and call
  sizes with the curve's mean tokens per call at that age (gamma-distributed around it). It is
  how the fitting code is checked to recover a known curve.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

import numpy as np
import pandas as pd

from evalfleet.errors import ConfigError, NotFound
from planner.curves import HarnessCurve

DEFAULT_TRACE = "minisweagent-gemini3pro-verified"
# The harness that produced each shipped trace (the key of its default curve).
TRACE_HARNESS = {DEFAULT_TRACE: "mini-swe-agent"}
SPLIT_SALT = "evalfleet-curves-v1"


def _trace_file(name: str, kind: str) -> pd.DataFrame:
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise NotFound(f"no shipped trace named {name!r}")
    path = resources.files("sim").joinpath("traces", f"{name}.{kind}.csv.gz")
    if not path.is_file():
        known = ", ".join(sorted(TRACE_HARNESS))
        raise NotFound(f"no shipped trace named {name!r} (shipped: {known})")
    with path.open("rb") as fh:
        return pd.read_csv(fh, compression="gzip")


def load_calls(name: str = DEFAULT_TRACE) -> pd.DataFrame:
    """One row per LLM call of the shipped trace ``name`` (instance_id, step, t_request_s, ...)."""
    return _trace_file(name, "calls")


def load_instances(name: str = DEFAULT_TRACE) -> pd.DataFrame:
    """One row per instance of the shipped trace ``name`` (instance_id, wall_time_s, ...)."""
    return _trace_file(name, "instances")


@dataclass(frozen=True)
class TraceSplit:
    """A deterministic split of a trace by instance: calls and instances of each side."""

    train_calls: pd.DataFrame
    train_instances: pd.DataFrame
    test_calls: pd.DataFrame
    test_instances: pd.DataFrame


def split_ids(
    instance_ids: list[str], test_share: float = 0.2, salt: str = SPLIT_SALT
) -> tuple[list[str], list[str]]:
    """Split ids into (train, test); the test set has ``round(test_share * n)`` ids."""
    if not 0.0 < test_share < 1.0:
        raise ConfigError("split", [f"test_share: must be in (0, 1), got {test_share}"])
    unique = sorted(set(instance_ids))
    ranked = sorted(unique, key=lambda i: hashlib.sha256(f"{salt}:{i}".encode()).hexdigest())
    n_test = round(test_share * len(ranked))
    test = set(ranked[:n_test])
    return [i for i in unique if i not in test], [i for i in unique if i in test]


def split_trace(
    calls: pd.DataFrame,
    instances: pd.DataFrame,
    test_share: float = 0.2,
    salt: str = SPLIT_SALT,
) -> TraceSplit:
    """Split a trace's calls and instances by instance id (see ``split_ids``)."""
    train, test = split_ids(instances["instance_id"].astype(str).tolist(), test_share, salt)
    train_set, test_set = set(train), set(test)
    call_ids = calls["instance_id"].astype(str)
    inst_ids = instances["instance_id"].astype(str)
    return TraceSplit(
        train_calls=calls[call_ids.isin(train_set)].reset_index(drop=True),
        train_instances=instances[inst_ids.isin(train_set)].reset_index(drop=True),
        test_calls=calls[call_ids.isin(test_set)].reset_index(drop=True),
        test_instances=instances[inst_ids.isin(test_set)].reset_index(drop=True),
    )


def _sample_durations(curve: HarnessCurve, u: np.ndarray) -> np.ndarray:
    """Inverse-transform sampling of durations from the curve's survival (``S(d) = u``)."""
    ages = np.asarray(curve.survival_age_s, dtype=np.float64)
    surv = np.asarray(curve.survival_at, dtype=np.float64)
    last_age, last = ages[-1], surv[-1]
    # Body: S is piecewise linear and non-increasing; interpolate the inverse on reversed arrays.
    body = np.interp(u, surv[::-1], ages[::-1])
    with np.errstate(divide="ignore"):
        tail = last_age + curve.survival_tail_s * np.log(last / u)
    return np.asarray(np.where(u >= last, body, tail), dtype=np.float64)


def synthesize_calls(
    curve: HarnessCurve,
    n_instances: int,
    *,
    seed: int = 0,
    size_shape: float = 4.0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Sample ``n_instances`` synthetic instances from ``curve``: (calls, instances) DataFrames.

    Columns follow the shipped traces (calls: instance_id, step, t_request_s, input_tokens,
    cached_input_tokens, output_tokens; instances: instance_id, n_calls, wall_time_s). Call
    sizes are gamma-distributed with shape ``size_shape`` around the curve's mean per call.
    Deterministic for a seed.
    """
    if n_instances < 1:
        raise ConfigError("synthesize_calls", [f"n_instances: must be >= 1, got {n_instances}"])
    rng = np.random.default_rng(seed)
    u = rng.uniform(np.finfo(np.float64).tiny, 1.0, size=n_instances)
    durations = np.maximum(_sample_durations(curve, u), 1e-3)
    # Thinning: candidates at the peak call rate, kept with probability rate(t) / peak.
    peak = max(max(curve.calls_per_s_at), 1e-12)
    counts = rng.poisson(peak * durations)
    owner = np.repeat(np.arange(n_instances), counts)
    t = rng.uniform(0.0, 1.0, size=owner.size) * durations[owner]
    keep = rng.uniform(0.0, 1.0, size=t.size) * peak < curve.calls_per_s(t)
    owner, t = owner[keep], t[keep]
    order = np.lexsort((t, owner))
    owner, t = owner[order], t[order]

    rate = np.maximum(curve.calls_per_s(t), 1e-12)
    mean_in = curve.input_tokens_per_s(t) / rate
    share_cached = np.divide(
        curve.cached_input_tokens_per_s(t),
        curve.input_tokens_per_s(t),
        out=np.zeros_like(t),
        where=curve.input_tokens_per_s(t) > 0,
    )
    mean_out = curve.output_tokens_per_s(t) / rate
    scale = 1.0 / size_shape
    tokens_in = np.rint(rng.gamma(size_shape, scale, size=t.size) * mean_in)
    cached = np.minimum(np.rint(tokens_in * share_cached), tokens_in)
    tokens_out = np.rint(rng.gamma(size_shape, scale, size=t.size) * mean_out)

    ids = np.array([f"synthetic-{i:06d}" for i in range(n_instances)], dtype=object)
    step = np.ones(owner.size, dtype=np.int64)
    if owner.size:
        starts = np.r_[True, owner[1:] != owner[:-1]]
        group_start = np.maximum.accumulate(np.where(starts, np.arange(owner.size), 0))
        step = np.arange(owner.size) - group_start + 1
    calls = pd.DataFrame(
        {
            "instance_id": ids[owner],
            "step": step,
            "t_request_s": t,
            "input_tokens": tokens_in.astype(np.int64),
            "cached_input_tokens": cached.astype(np.int64),
            "output_tokens": tokens_out.astype(np.int64),
        }
    )
    instances = pd.DataFrame(
        {
            "instance_id": ids,
            "n_calls": np.bincount(owner, minlength=n_instances),
            "wall_time_s": durations,
        }
    )
    return calls, instances
