"""What the property tests share: their Hypothesis settings and a log-uniform strategy.
Import with ``from tests.property_support import ...``."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: derandomized: CI draws the same cases every run (a failure is reproducible, not a flake);
#: raise ``max_examples`` locally to search further
PROPERTIES = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def log_uniform(lo: float, hi: float) -> st.SearchStrategy[float]:
    """Positive numbers spread evenly over the orders of magnitude from ``lo`` to ``hi``."""
    return st.floats(math.log(lo), math.log(hi)).map(math.exp)
