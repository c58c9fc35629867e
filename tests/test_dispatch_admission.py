"""Admission (``tasks.dispatch.plan_admission``): the pure rule that decides how many jobs of
each run may be claimed in one dispatcher pass — ceilings, fair shares by priority, caps,
overrides, pauses, booting tasks counted as live, the static cap and the launcher's slots."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.dispatch import Fleet, RunLoad, alias_ceiling, plan_admission


def load(run_id: str, alias: str = "sim", **over: object) -> RunLoad:
    values: dict[str, object] = {
        "run_id": run_id,
        "alias": alias,
        "priority": 1.0,
        "task_cap": None,
        "ceiling_override": None,
        "live": 0,
        "queued": 100,
        "paused": False,
        "claimable": True,
    }
    values.update(over)
    return RunLoad(**values)  # type: ignore[arg-type]


def fleet(*loads: RunLoad, ceiling: int | None = 8, **over: object) -> Fleet:
    ceilings = {} if ceiling is None else {x.alias: ceiling for x in loads}
    values: dict[str, object] = {
        "pool_paused": False,
        "planner_ceilings": ceilings,
        "bootstrap_ceiling": 4,
    }
    values.update(over)
    return Fleet(tuple(loads), **values)  # type: ignore[arg-type]


def test_two_runs_split_the_planner_ceiling_by_priority() -> None:
    adm = plan_admission(fleet(load("a"), load("b", priority=3.0)), 64, 64)
    assert adm.ceilings == {"a": 2, "b": 6}
    assert adm.allowed == {"a": 2, "b": 6}


def test_when_one_run_is_done_the_other_takes_the_whole_ceiling() -> None:
    f = fleet(load("a", live=2), load("b", priority=3.0, live=0, queued=0))
    adm = plan_admission(f, 64, 64)
    assert adm.ceilings == {"a": 8, "b": 0}
    assert adm.allowed == {"a": 6, "b": 0}


def test_live_tasks_count_booting_ones_included() -> None:
    # live = booting + running + evaluating: a run already at its share gets nothing more
    adm = plan_admission(fleet(load("a", live=2), load("b", priority=3.0, live=5)), 64, 64)
    assert adm.allowed == {"a": 0, "b": 1}


def test_a_run_over_its_share_blocks_nobody_beyond_the_alias_ceiling() -> None:
    # a joined while b held the whole ceiling: nothing running is killed, a waits for room
    f = fleet(load("a", priority=3.0), load("b", live=8))
    adm = plan_admission(f, 64, 64)
    assert adm.ceilings == {"a": 6, "b": 2}
    assert adm.allowed == {"a": 0, "b": 0}
    f = fleet(load("a", priority=3.0), load("b", live=5))
    assert plan_admission(f, 64, 64).allowed == {"a": 3, "b": 0}


def test_a_run_cap_binds_and_its_unused_share_goes_to_the_other() -> None:
    adm = plan_admission(fleet(load("a", priority=3.0, task_cap=1), load("b")), 64, 64)
    assert adm.allowed == {"a": 1, "b": 7}
    adm = plan_admission(fleet(load("a", priority=3.0, ceiling_override=2), load("b")), 64, 64)
    assert adm.allowed == {"a": 2, "b": 6}


def test_a_run_with_little_work_left_gives_its_share_away() -> None:
    adm = plan_admission(fleet(load("a"), load("b", priority=3.0, queued=1)), 64, 64)
    assert adm.allowed == {"a": 7, "b": 1}


def test_the_alias_override_lowers_the_planner_ceiling() -> None:
    f = fleet(load("a"), load("b", priority=3.0), alias_overrides={"sim": 4})
    assert alias_ceiling(f, "sim", 64) == 4
    assert plan_admission(f, 64, 64).allowed == {"a": 1, "b": 3}
    held = fleet(load("a"), alias_overrides={"sim": 0})
    assert plan_admission(held, 64, 64).allowed == {"a": 0}


def test_without_a_planner_decision_the_bootstrap_ceiling_holds_the_first_pass() -> None:
    # before the planner's first decision a pass admitted the whole static cap (10 here)
    f = fleet(load("a", queued=50), load("b", priority=3.0, queued=50), ceiling=None)
    adm = plan_admission(f, 10, 64)
    assert adm.total == 4 and adm.allowed == {"a": 1, "b": 3}
    # booting tasks count: the next pass admits nothing until a decision is in force
    f = fleet(
        load("a", queued=49, live=1), load("b", priority=3.0, queued=47, live=3), ceiling=None
    )
    assert plan_admission(f, 10, 64).total == 0
    assert f.unplanned() == {"sim"}
    # the bootstrap is at least 1: an alias without a planner still makes progress
    lone = fleet(load("a", queued=5), ceiling=None, bootstrap_ceiling=1)
    assert plan_admission(lone, 10, 64).allowed == {"a": 1}
    # once the planner decides, its ceiling replaces the bootstrap (higher or lower)
    assert plan_admission(fleet(load("a", queued=50), ceiling=9), 10, 64).allowed == {"a": 9}
    assert plan_admission(fleet(load("a", queued=50), ceiling=2), 10, 64).allowed == {"a": 2}
    # the static cap and an operator override still bind below the bootstrap
    assert plan_admission(fleet(load("a", queued=50), ceiling=None), 3, 64).allowed == {"a": 3}
    held = fleet(load("a", queued=50), ceiling=None, alias_overrides={"sim": 0})
    assert plan_admission(held, 10, 64).allowed == {"a": 0}


def test_a_paused_pool_admits_nothing() -> None:
    f = fleet(load("a"), load("b", priority=3.0), pool_paused=True)
    assert plan_admission(f, 64, 64).allowed == {"a": 0, "b": 0}


def test_a_paused_run_admits_nothing_and_keeps_its_live_slots() -> None:
    f = fleet(load("a", paused=True, live=3), load("b"))
    adm = plan_admission(f, 64, 64)
    assert adm.allowed == {"a": 0, "b": 5}
    # a run paused by its state (not claimable) is treated the same way
    f = fleet(load("a", claimable=False, live=3), load("b"))
    assert plan_admission(f, 64, 64).allowed == {"a": 0, "b": 5}


def test_the_static_cap_counts_live_tasks_of_every_alias() -> None:
    f = fleet(load("a", alias="x", live=6), load("b", alias="y"), ceiling=8)
    assert plan_admission(f, 10, 64).allowed == {"a": 2, "b": 2}


def test_few_free_slots_are_split_by_priority() -> None:
    adm = plan_admission(fleet(load("a"), load("b", priority=3.0)), 64, 4)
    assert adm.allowed == {"a": 1, "b": 3}
    assert adm.total == 4


@st.composite
def fleets(draw: st.DrawFn) -> tuple[Fleet, int, int]:
    n = draw(st.integers(1, 6))
    loads = [
        load(
            f"r{i}",
            alias=draw(st.sampled_from(["x", "y"])),
            priority=draw(st.sampled_from([0.5, 1.0, 3.0])),
            task_cap=draw(st.none() | st.integers(1, 20)),
            ceiling_override=draw(st.none() | st.integers(0, 20)),
            live=draw(st.integers(0, 15)),
            queued=draw(st.integers(0, 30)),
            paused=draw(st.booleans()),
            claimable=draw(st.booleans()),
        )
        for i in range(n)
    ]
    f = Fleet(
        tuple(loads),
        pool_paused=draw(st.booleans()),
        planner_ceilings=draw(st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 40))),
        alias_overrides=draw(st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 40))),
        bootstrap_ceiling=draw(st.integers(1, 10)),
    )
    return f, draw(st.integers(1, 50)), draw(st.integers(0, 50))


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_admission_never_exceeds_any_bound(case: tuple[Fleet, int, int]) -> None:
    f, static_cap, free_slots = case
    adm = plan_admission(f, static_cap, free_slots)
    live = sum(x.live for x in f.loads)
    assert adm.total <= max(0, min(free_slots, static_cap - live))
    if f.pool_paused:
        assert adm.total == 0
    for x in f.loads:
        got = adm.allowed[x.run_id]
        assert 0 <= got <= x.queued
        if got:
            assert x.admits
            assert x.live + got <= adm.ceilings[x.run_id]
            own = min(c for c in (static_cap, x.task_cap, x.ceiling_override) if c is not None)
            assert x.live + got <= own
    for alias in {x.alias for x in f.loads}:
        on = [x for x in f.loads if x.alias == alias]
        added = sum(adm.allowed[x.run_id] for x in on)
        if added:
            assert sum(x.live for x in on) + added <= alias_ceiling(f, alias, static_cap)
            if alias not in f.planner_ceilings:
                assert sum(x.live for x in on) + added <= f.bootstrap_ceiling
