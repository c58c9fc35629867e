"""Fitting a curve from any well-formed table of calls gives a curve the planner can use.

``planner.fit.fit_curve`` takes operators' tables (``evalfleet curves fit``, the refit notebook).
Whatever a well-formed table holds (one instance or many, calls bunched at one age or spread
over an hour, zero tokens, prompts all cache reads, instances' wall times or none), the fit
returns a curve whose survival starts at 1 and never rises, whose every rate is finite and not
negative, and which reads back from its own parameters. A ``ConfigError`` here is a fault of the
fit, not of the table: the curve's own validation refusing what the fit made (the solve of node
values without its bound at 0 is refused so). Malformed tables are refused by name in
``test_curves_fit.test_bad_call_tables_are_clear_errors``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.curves import HarnessCurve
from planner.fit import CALL_COLUMNS, fit_curve
from tests.property_support import PROPERTIES

AGES = np.linspace(0.0, 20_000.0, 401)


@st.composite
def _tables(draw: st.DrawFn) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    rows, walls = [], []
    for i in range(draw(st.integers(1, 25))):
        t, last = 0.0, 0.0
        for _ in range(draw(st.integers(1, 30))):
            t += draw(st.sampled_from((0.0, 1.0)) | st.floats(0.0, 300.0))
            uncached = draw(st.integers(0, 50_000))
            cached = draw(st.integers(0, 200_000))
            rows.append((f"i{i}", t, uncached + cached, cached, draw(st.integers(0, 5_000))))
            last = t
        walls.append((f"i{i}", last + draw(st.floats(0.5, 600.0))))
    calls = pd.DataFrame(
        rows,
        columns=list(CALL_COLUMNS),
    )
    instances = draw(
        st.none() | st.just(pd.DataFrame(walls, columns=["instance_id", "wall_time_s"]))
    )
    return calls, instances


#: a fit takes about a second (its smoothing cross-validates), so fewer cases than elsewhere
@settings(PROPERTIES, max_examples=30)
@given(_tables(), st.sampled_from((30.0, 60.0)), st.integers(1, 20))
def test_any_well_formed_table_fits_a_sound_curve(
    table: tuple[pd.DataFrame, pd.DataFrame | None], bin_s: float, tail_min_alive: int
) -> None:
    calls, instances = table
    curve = fit_curve(
        calls, "drawn", instances=instances, bin_s=bin_s, tail_min_alive=tail_min_alive
    ).curve
    survival = curve.survival(AGES)
    assert survival[0] == 1.0
    assert np.all((survival >= 0.0) & (survival <= 1.0))
    assert np.all(np.diff(survival) <= 1e-12), "survival rises with age"
    for rate in (
        curve.calls_per_s,
        curve.cached_input_tokens_per_s,
        curve.uncached_input_tokens_per_s,
        curve.output_tokens_per_s,
        curve.inflight_tokens,
        curve.inflight_calls,
    ):
        values = rate(AGES)
        assert np.all(np.isfinite(values)) and np.all(values >= 0.0), rate.__name__
    assert np.isfinite(curve.mean_duration_s()) and curve.mean_duration_s() > 0
    again = HarnessCurve.from_params(curve.to_params())
    assert np.allclose(again.calls_per_s(AGES), curve.calls_per_s(AGES))
    assert np.allclose(again.survival(AGES), survival)
