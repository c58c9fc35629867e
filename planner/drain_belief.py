"""Whether cache reads count against the token limit, where no header states the bucket: from
how steadily the token bucket drained at the 429s that name no limit.

``planner.cache_counting`` tests the operator's belief (``cached_input_counts``) against the
bucket a provider states in its headers. Without headers nothing states it, and a wrong belief
went untested: the pacer charged every call in units the provider does not count, so the token
level at which the provider rejects moved as the run went on, and a token 429 could even read
as another limit's (wide-138 of ``sim.generate_wide``: its request seed re-based to a fifth of
the request limit on token 429s).

At a 429 of the token limit, the provider's token bucket drained at its limit
(``planner.drain``), counted the way the provider counts. Counted the other way, the same calls
read the limit times the ratio of the two countings over the calls of the last minutes, which
moves as the tasks age (a task's context grows, and with it the share the cache serves). So
across 429s of the token limit the true counting's drained rate holds steady and the other
wanders. The belief is contradicted when, over the last ``samples`` 429s of an unknown limit,
the token rate counted the other way

* spread (max / min) at most ``steady_spread``;
* spread at most ``share`` x as much as the believed counting's (logarithmically); and
* was the steadiest of every class by ``margin``: a 429 of the request or the output limit
  drains those buckets steadily, and the token rates, counted either way, then say nothing.

The limit in the new units is then the median of what the other counting drained
(``measured_limit``).

A belief the samples once confirmed (the mirror of a contradiction: the believed counting
steady, the other wandering, the steadiest class by ``margin``: ``drain_confirms_belief``) is
flipped only by a contradiction over ``confirmed_samples`` 429s. A provider counts one way for
the whole run, so the belief was right, unless a limit moved under those samples; and a limit
that moves makes the counting whose rate it moves look the wandering one. A limit dropping by
a third while the fleet aged read "cache reads count" across four 429s (the uncached rate fell
8,925 to 6,651 tokens/s, the counted-with-cache one held within 4.3%), though four earlier
ones had held the uncached rate within 2.4% while the other wandered 21,612 to 51,699: the
wrong belief held for 38 minutes, the fleet at one task for 17 of them (random-4088). Over
twice the samples a drop spans them and reads as nothing, while a belief wrongly confirmed
(that too needs a limit to move) is still contradicted once the limit holds.

A workload whose cache share does not move with age (a fixed share per call) reads the same
spread both ways: the belief stands, and a wrong one costs only a seed in other units, which
the controller re-bases like any other. Pure: samples in, a verdict out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from evalfleet.errors import ConfigError
from planner.budget_state import BudgetClass

__all__ = [
    "DrainBeliefConfig",
    "DrainEvidence",
    "DrainSample",
    "drain_confirms_belief",
    "drain_contradicts_belief",
    "judged",
    "measured_limit",
]


@dataclass(frozen=True, slots=True)
class DrainSample:
    """How fast each bucket was drained (per second, ``planner.drain``) at one 429 of an
    unknown limit: tokens counted as believed and the other way, requests, and output tokens
    (None: the alias budgets none)."""

    believed: float
    other: float
    requests: float
    output: float | None = None

    @classmethod
    def of(cls, drained: Mapping[BudgetClass, float], other_tokens: float) -> DrainSample:
        """The sample of the drained rates a blame reads (tokens counted as believed; output
        only where the alias budgets it) and the token rate counted the other way."""
        return cls(
            believed=drained[BudgetClass.TOKENS],
            other=other_tokens,
            requests=drained[BudgetClass.REQUESTS],
            output=drained.get(BudgetClass.OUTPUT_TOKENS),
        )

    def swapped(self) -> DrainSample:
        """The same rates with the two countings' roles swapped (the other belief's view)."""
        return DrainSample(self.other, self.believed, self.requests, self.output)


@dataclass(frozen=True, slots=True)
class DrainEvidence:
    """The drained rates of the latest 429s of an unknown limit (at most
    ``DrainBeliefConfig.confirmed_samples``), and whether they ever confirmed the belief since
    it was last set (``drain_confirms_belief``)."""

    samples: tuple[DrainSample, ...] = ()
    confirmed: bool = False


@dataclass(frozen=True)
class DrainBeliefConfig:
    """Constants of the test; each default is bounded (``ConfigError`` names the field)."""

    # 429s of an unknown limit the verdict reads [3, 50]: 4, not 6 (docs/bench-planner.md,
    # twenty-eighth round), as a wrong belief costs every minute until the flip
    samples: int = 4
    steady_spread: float = 1.05  # the other counting's spread (max / min) at most [1, 2]
    share: float = 0.3  # ... at most this share of the believed counting's, in logs [0, 1]
    margin: float = 1.5  # ... and the steadiest class by this factor, in logs [1, 10]
    # 429s a contradiction of a belief the samples once confirmed reads [samples, 50]
    confirmed_samples: int = 8

    def __post_init__(self) -> None:
        problems: list[str] = []
        if isinstance(self.samples, bool) or not isinstance(self.samples, int):
            problems.append(f"samples: must be an integer, got {self.samples!r}")
        elif not 3 <= self.samples <= 50:
            problems.append(f"samples: must be within [3, 50], got {self.samples!r}")
        elif isinstance(self.confirmed_samples, bool) or not isinstance(
            self.confirmed_samples, int
        ):
            problems.append(
                f"confirmed_samples: must be an integer, got {self.confirmed_samples!r}"
            )
        elif not self.samples <= self.confirmed_samples <= 50:
            problems.append(
                f"confirmed_samples: must be within [samples ({self.samples}), 50], "
                f"got {self.confirmed_samples!r}"
            )
        for name, lo, hi in (
            ("steady_spread", 1.0, 2.0),
            ("share", 0.0, 1.0),
            ("margin", 1.0, 10.0),
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and lo <= value <= hi):
                problems.append(f"{name}: must be within [{lo}, {hi}], got {value!r}")
        if problems:
            raise ConfigError("drain-belief config", problems)


def _log_spread(values: Sequence[float]) -> float:
    return math.log(max(values) / min(values))


def drain_contradicts_belief(
    samples: Sequence[DrainSample],
    config: DrainBeliefConfig | None = None,
    *,
    reads: int | None = None,
) -> bool:
    """Whether the last ``reads`` (default ``config.samples``) 429s of an unknown limit say
    the provider counts its token limit the other way from the belief (module docstring).
    Fewer samples, or a rate of zero among them: False (the belief stands)."""
    cfg = config or DrainBeliefConfig()
    n = cfg.samples if reads is None else reads
    last = list(samples)[-n:]
    if len(last) < n:
        return False
    rates = [s.believed for s in last] + [s.other for s in last] + [s.requests for s in last]
    if any(not (math.isfinite(r) and r > 0) for r in rates):
        return False
    other = _log_spread([s.other for s in last])
    believed = _log_spread([s.believed for s in last])
    if other > math.log(cfg.steady_spread) or other > cfg.share * believed:
        return False
    rivals = [_log_spread([s.requests for s in last])]
    outputs = [s.output for s in last]
    if all(o is not None and math.isfinite(o) and o > 0 for o in outputs):
        rivals.append(_log_spread([o for o in outputs if o is not None]))
    return all(other * cfg.margin <= r for r in rivals)


def drain_confirms_belief(
    samples: Sequence[DrainSample], config: DrainBeliefConfig | None = None
) -> bool:
    """Whether the last ``config.samples`` 429s confirm the belief: they would contradict the
    other one (the believed counting steady, the other wandering, by the same tests)."""
    return drain_contradicts_belief([s.swapped() for s in samples], config)


def measured_limit(
    samples: Sequence[DrainSample],
    config: DrainBeliefConfig | None = None,
    *,
    reads: int | None = None,
) -> float:
    """The token limit in the other units, as the samples of a verdict drained it: the median
    of the other counting's rates over the last ``reads`` (default ``config.samples``)."""
    cfg = config or DrainBeliefConfig()
    n = cfg.samples if reads is None else reads
    return float(statistics.median(s.other for s in list(samples)[-n:]))


def judged(
    evidence: DrainEvidence, sample: DrainSample, config: DrainBeliefConfig | None = None
) -> tuple[DrainEvidence, float | None]:
    """``sample`` added to the evidence: the evidence to keep and None while the belief
    stands, or none and the limit measured in the other units (``measured_limit``) where the
    samples contradict it (the caller flips the belief): over ``config.samples`` 429s, or
    ``config.confirmed_samples`` once they have confirmed it."""
    cfg = config or DrainBeliefConfig()
    kept = (*evidence.samples, sample)[-cfg.confirmed_samples :]
    confirmed = evidence.confirmed or drain_confirms_belief(kept, cfg)
    reads = cfg.confirmed_samples if confirmed else cfg.samples
    if not drain_contradicts_belief(kept, cfg, reads=reads):
        return DrainEvidence(kept, confirmed), None
    return DrainEvidence(), measured_limit(kept, cfg, reads=reads)
