"""Per-harness usage curves: what one running task of a given age asks of the provider.

A ``HarnessCurve`` answers, for a task of age ``a`` seconds (time since its container started)
that is *still running*: expected LLM calls/s, input tokens/s split into cached and uncached,
output tokens/s, expected tokens (and calls) in flight, and the survival ``S(a)`` = share of
tasks still running at age ``a``. The planner projects a live fleet forward with them: the
expected load at time ``a + h`` of a task aged ``a`` now is ``rate(a + h) * S(a + h) / S(a)``
(``survival_ratio`` computes that ratio safely, also deep in the tail).

Representation (the fitted parameters, see ``to_params``):
- rates: values at node ages (pooled age bins, see ``planner.fit``), linearly interpolated
  between nodes and held flat before the first and after the last node; so they are continuous,
  non-negative and finite at every age;
- survival: values at node ages (piecewise linear, 1 at age 0, non-increasing), followed past the
  last node by an exponential tail ``S(a) = S_last * exp(-(a - a_last) / tail_s)`` that goes to 0
  (``tail_s`` is the mean residual life of the tasks alive at the last node).

Evaluation is pure numpy and vectorised (10,000 ages in well under a millisecond). This module is
pure: no I/O besides reading the shipped default parameters, no clock, no environment.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evalfleet.errors import ConfigError, NotFound

FloatArray = npt.NDArray[np.float64]
ArrayLike = npt.ArrayLike

PARAMS_FORMAT = 1
DEFAULT_HARNESS = "mini-swe-agent"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class RateParams(_Strict):
    """Per-running-task rates at node ages (seconds), interpolated linearly between nodes."""

    age_s: list[float] = Field(min_length=1)
    calls_per_s: list[float]
    cached_input_tokens_per_s: list[float]
    uncached_input_tokens_per_s: list[float]
    output_tokens_per_s: list[float]
    inflight_tokens: list[float]
    inflight_calls: list[float]


class SurvivalParams(_Strict):
    """Share of tasks still running at node ages, then an exponential tail of mean ``tail_s``."""

    age_s: list[float] = Field(min_length=1)
    value: list[float]
    tail_s: float = Field(gt=0)


class LatencyParams(_Strict):
    """The LLM latency assumed to place calls in flight: ``base_s + per_output_token_s * out``."""

    base_s: float = Field(ge=0)
    per_output_token_s: float = Field(ge=0)


class CurveParams(_Strict):
    """The serialised form of a ``HarnessCurve`` (JSON object, see ``HarnessCurve.to_params``)."""

    format: int
    harness: str = Field(min_length=1, max_length=128)
    rates: RateParams
    survival: SurvivalParams
    latency: LatencyParams
    fit: dict[str, Any] = Field(default_factory=dict)


_RATE_FIELDS = (
    "calls_per_s",
    "cached_input_tokens_per_s",
    "uncached_input_tokens_per_s",
    "output_tokens_per_s",
    "inflight_tokens",
    "inflight_calls",
)


def _check_nodes(name: str, ages: tuple[float, ...], problems: list[str]) -> None:
    if not ages:
        problems.append(f"{name}.age_s: must not be empty")
        return
    arr = np.asarray(ages, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        problems.append(f"{name}.age_s: must be finite")
    elif arr[0] < 0:
        problems.append(f"{name}.age_s: must start at an age >= 0, got {arr[0]}")
    elif arr.size > 1 and not np.all(np.diff(arr) > 0):
        problems.append(f"{name}.age_s: must be strictly increasing")


@dataclass(frozen=True)
class HarnessCurve:
    """Fitted usage of one harness as functions of task age; see the module docstring.

    All rate methods are per *running* task of that age (conditional on survival). Ages are
    seconds; negative ages are treated as 0. Construct through ``from_params`` or
    ``planner.fit.fit_curve``; the constructor validates and raises ``ConfigError``.
    """

    harness: str
    rate_age_s: tuple[float, ...]
    calls_per_s_at: tuple[float, ...]
    cached_input_tokens_per_s_at: tuple[float, ...]
    uncached_input_tokens_per_s_at: tuple[float, ...]
    output_tokens_per_s_at: tuple[float, ...]
    inflight_tokens_at: tuple[float, ...]
    inflight_calls_at: tuple[float, ...]
    survival_age_s: tuple[float, ...]
    survival_at: tuple[float, ...]
    survival_tail_s: float
    latency_base_s: float = 1.0
    latency_per_output_token_s: float = 0.01
    fit_info: tuple[tuple[str, Any], ...] = ()
    _arrays: dict[str, FloatArray] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not self.harness:
            problems.append("harness: must not be empty")
        _check_nodes("rates", self.rate_age_s, problems)
        n = len(self.rate_age_s)
        for name in _RATE_FIELDS:
            values = getattr(self, name + "_at")
            if len(values) != n:
                problems.append(f"rates.{name}: {len(values)} values for {n} ages")
            elif not all(math.isfinite(v) and v >= 0 for v in values):
                problems.append(f"rates.{name}: values must be finite and >= 0")
        _check_nodes("survival", self.survival_age_s, problems)
        surv = np.asarray(self.survival_at, dtype=np.float64)
        if surv.size != len(self.survival_age_s):
            problems.append(
                f"survival.value: {surv.size} values for {len(self.survival_age_s)} ages"
            )
        elif surv.size:
            if not np.all(np.isfinite(surv)) or np.any(surv < 0) or np.any(surv > 1):
                problems.append("survival.value: values must be in [0, 1]")
            elif self.survival_age_s[0] != 0.0 or surv[0] != 1.0:
                problems.append("survival: must start at age 0 with value 1")
            elif np.any(np.diff(surv) > 0):
                problems.append("survival.value: must be non-increasing")
        if not (math.isfinite(self.survival_tail_s) and self.survival_tail_s > 0):
            problems.append("survival.tail_s: must be a finite number > 0")
        for name in ("latency_base_s", "latency_per_output_token_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                problems.append(f"{name}: must be a finite number >= 0")
        if problems:
            raise ConfigError(f"harness curve {self.harness!r}", problems)
        arrays = {"rate_age_s": np.asarray(self.rate_age_s, dtype=np.float64)}
        for name in _RATE_FIELDS:
            arrays[name] = np.asarray(getattr(self, name + "_at"), dtype=np.float64)
        arrays["survival_age_s"] = np.asarray(self.survival_age_s, dtype=np.float64)
        arrays["survival"] = surv
        object.__setattr__(self, "_arrays", arrays)

    # -- evaluation -----------------------------------------------------------------------
    def _rate(self, name: str, age_s: ArrayLike) -> FloatArray:
        ages = np.maximum(np.asarray(age_s, dtype=np.float64), 0.0)
        a = self._arrays
        return np.interp(ages, a["rate_age_s"], a[name])

    def calls_per_s(self, age_s: ArrayLike) -> FloatArray:
        """Expected LLM calls per second of one running task of age ``age_s``."""
        return self._rate("calls_per_s", age_s)

    def cached_input_tokens_per_s(self, age_s: ArrayLike) -> FloatArray:
        """Expected prompt tokens/s served from the provider's cache (cache reads)."""
        return self._rate("cached_input_tokens_per_s", age_s)

    def uncached_input_tokens_per_s(self, age_s: ArrayLike) -> FloatArray:
        """Expected prompt tokens/s not served from cache."""
        return self._rate("uncached_input_tokens_per_s", age_s)

    def input_tokens_per_s(self, age_s: ArrayLike) -> FloatArray:
        """Expected prompt tokens/s, cached and uncached together."""
        return self.cached_input_tokens_per_s(age_s) + self.uncached_input_tokens_per_s(age_s)

    def output_tokens_per_s(self, age_s: ArrayLike) -> FloatArray:
        """Expected completion tokens/s (reasoning included)."""
        return self._rate("output_tokens_per_s", age_s)

    def inflight_tokens(self, age_s: ArrayLike) -> FloatArray:
        """Expected tokens (input + output) of the calls in flight for a running task of that age.

        Based on the latency model in ``latency_base_s`` / ``latency_per_output_token_s``.
        """
        return self._rate("inflight_tokens", age_s)

    def inflight_calls(self, age_s: ArrayLike) -> FloatArray:
        """Expected number of calls in flight (share of time waiting on the LLM), in [0, 1]-ish."""
        return self._rate("inflight_calls", age_s)

    def survival(self, age_s: ArrayLike) -> FloatArray:
        """Share of tasks still running at ``age_s``: 1 at 0, non-increasing, -> 0."""
        ages = np.maximum(np.asarray(age_s, dtype=np.float64), 0.0)
        a = self._arrays
        last_age = a["survival_age_s"][-1]
        last = a["survival"][-1]
        body = np.interp(ages, a["survival_age_s"], a["survival"])
        tail = last * np.exp(-np.maximum(ages - last_age, 0.0) / self.survival_tail_s)
        return np.where(ages <= last_age, body, tail)

    def log_survival(self, age_s: ArrayLike) -> FloatArray:
        """``log S(age)``; finite in the exponential tail where ``S`` underflows (-inf at S=0)."""
        ages = np.maximum(np.asarray(age_s, dtype=np.float64), 0.0)
        a = self._arrays
        last_age = a["survival_age_s"][-1]
        last = float(a["survival"][-1])
        body = np.interp(np.minimum(ages, last_age), a["survival_age_s"], a["survival"])
        with np.errstate(divide="ignore"):
            log_body = np.log(body)
            log_tail = (math.log(last) if last > 0 else -np.inf) - np.maximum(
                ages - last_age, 0.0
            ) / self.survival_tail_s
        return np.asarray(np.where(ages <= last_age, log_body, log_tail), dtype=np.float64)

    def survival_ratio(self, age_s: ArrayLike, horizon_s: ArrayLike) -> FloatArray:
        """``S(age + horizon) / S(age)``: chance a task running at ``age`` still runs later.

        Broadcasts its arguments; 0 where the task cannot be running at ``age`` (``S = 0``),
        never NaN. ``horizon_s`` must be >= 0.
        """
        ages = np.maximum(np.asarray(age_s, dtype=np.float64), 0.0)
        later = ages + np.maximum(np.asarray(horizon_s, dtype=np.float64), 0.0)
        log_now = self.log_survival(ages)
        log_later = self.log_survival(later)
        with np.errstate(invalid="ignore"):
            diff = log_later - log_now
        ratio = np.exp(np.where(np.isfinite(log_now), diff, -np.inf))
        return np.asarray(np.minimum(np.nan_to_num(ratio, nan=0.0), 1.0), dtype=np.float64)

    def mean_duration_s(self) -> float:
        """Mean task duration: the integral of the survival curve (tail included)."""
        a = self._arrays
        ages, surv = a["survival_age_s"], a["survival"]
        body = float(np.sum(np.diff(ages) * (surv[1:] + surv[:-1]) / 2.0)) if ages.size > 1 else 0
        return body + float(surv[-1]) * self.survival_tail_s

    @property
    def max_fitted_age_s(self) -> float:
        """The last age with fitted data (rates are flat beyond it)."""
        return max(self.rate_age_s[-1], self.survival_age_s[-1])

    # -- serialisation --------------------------------------------------------------------
    def to_params(self) -> dict[str, Any]:
        """The curve as a JSON-able dict; ``from_params(to_params())`` gives an equal curve."""
        return {
            "format": PARAMS_FORMAT,
            "harness": self.harness,
            "rates": {
                "age_s": list(self.rate_age_s),
                **{name: list(getattr(self, name + "_at")) for name in _RATE_FIELDS},
            },
            "survival": {
                "age_s": list(self.survival_age_s),
                "value": list(self.survival_at),
                "tail_s": self.survival_tail_s,
            },
            "latency": {
                "base_s": self.latency_base_s,
                "per_output_token_s": self.latency_per_output_token_s,
            },
            "fit": dict(self.fit_info),
        }

    @classmethod
    def from_params(cls, params: dict[str, Any], *, source: str = "harness curve") -> HarnessCurve:
        """Build a curve from ``to_params`` output; a bad dict raises ``ConfigError``."""
        try:
            p = CurveParams.model_validate(params)
        except ValidationError as exc:
            problems = [
                f"{'.'.join(str(x) for x in err['loc']) or '<root>'}: {err['msg']}"
                for err in exc.errors()
            ]
            raise ConfigError(source, problems) from None
        if p.format != PARAMS_FORMAT:
            raise ConfigError(source, [f"format: expected {PARAMS_FORMAT}, got {p.format}"])
        return cls(
            harness=p.harness,
            rate_age_s=tuple(p.rates.age_s),
            **{name + "_at": tuple(getattr(p.rates, name)) for name in _RATE_FIELDS},
            survival_age_s=tuple(p.survival.age_s),
            survival_at=tuple(p.survival.value),
            survival_tail_s=p.survival.tail_s,
            latency_base_s=p.latency.base_s,
            latency_per_output_token_s=p.latency.per_output_token_s,
            fit_info=tuple(sorted(p.fit.items())),
        )

    def fit_summary(self) -> dict[str, Any]:
        """The fit's metadata (sample counts, validation errors) as stored with the params."""
        return dict(self.fit_info)


def default_curve_path(harness: str = DEFAULT_HARNESS) -> Traversable:
    """Where the shipped default curve of ``harness`` lives (package data of ``planner``)."""
    return resources.files("planner").joinpath("default_curves", f"{harness}.json")


@functools.lru_cache(maxsize=16)
def default_curve(harness: str = DEFAULT_HARNESS) -> HarnessCurve:
    """The shipped default curve of ``harness`` (fitted from the public traces in ``sim/traces``).

    Raises ``NotFound`` when no default ships for that harness.
    """
    path = default_curve_path(harness)
    if "/" in harness or "\\" in harness or not path.is_file():
        raise NotFound(f"no default usage curve ships for harness {harness!r}")
    try:
        params = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), [f"invalid JSON: {exc}"]) from None
    return HarnessCurve.from_params(params, source=str(path))
