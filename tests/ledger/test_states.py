"""The run and instance state machines match DESIGN.md "States" exactly: every legal transition
is accepted, every other pair raises IllegalTransition, and returns end `lost` past max_attempts."""

from __future__ import annotations

import itertools

import pytest

from evalfleet.errors import EvalfleetError, IllegalTransition
from evalfleet.states import (
    INSTANCE_TERMINAL,
    RUN_TERMINAL,
    InstanceState,
    RunState,
    check_instance_transition,
    check_run_transition,
    instance_sources,
    return_target,
)

# Written out from the design, independently of the tables in evalfleet.states.
RUN_LEGAL = {
    ("pending", "launching"),
    ("launching", "running"),
    ("running", "draining"),
    ("draining", "closed"),
    ("running", "paused"),
    ("paused", "running"),
    ("paused", "draining"),
} | {
    (live, end)
    for live in ("pending", "launching", "running", "paused", "draining")
    for end in ("aborted", "failed")
}

LANDINGS = ("resolved", "unresolved", "error", "aborted")
INSTANCE_LEGAL = (
    {
        ("pending", "queued"),
        ("queued", "booting"),
        ("booting", "running"),
        ("running", "evaluating"),
        ("booting", "error"),
        ("pending", "aborted"),
        ("queued", "aborted"),
        ("booting", "aborted"),
    }
    | {
        (leased, back)
        for leased in ("booting", "running", "evaluating")
        for back in ("queued", "lost")
    }
    | {(live, end) for live in ("running", "evaluating") for end in LANDINGS}
)


@pytest.mark.parametrize(("current", "target"), sorted(RUN_LEGAL))
def test_legal_run_transitions(current: str, target: str) -> None:
    assert check_run_transition(current, target) == RunState(target)


@pytest.mark.parametrize(("current", "target"), sorted(INSTANCE_LEGAL))
def test_legal_instance_transitions(current: str, target: str) -> None:
    assert check_instance_transition(current, target) == InstanceState(target)


def test_every_other_run_pair_is_illegal() -> None:
    illegal = 0
    for current, target in itertools.product(list(RunState), repeat=2):
        if (current.value, target.value) in RUN_LEGAL:
            continue
        with pytest.raises(IllegalTransition) as info:
            check_run_transition(current, target)
        assert info.value.kind == "run"
        assert f"{current.value} -> {target.value}" in str(info.value)
        illegal += 1
    assert illegal == len(RunState) ** 2 - len(RUN_LEGAL)


def test_every_other_instance_pair_is_illegal() -> None:
    for current, target in itertools.product(list(InstanceState), repeat=2):
        if (current.value, target.value) in INSTANCE_LEGAL:
            continue
        with pytest.raises(IllegalTransition):
            check_instance_transition(current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [("resolved", "queued"), ("lost", "queued"), ("closed", "running"), ("queued", "resolved")],
)
def test_terminal_states_never_change_and_no_skipping(current: str, target: str) -> None:
    check = (
        check_run_transition
        if current in RunState._value2member_map_
        else check_instance_transition
    )
    with pytest.raises(IllegalTransition):
        check(current, target)


def test_unknown_state_names_are_illegal_transitions_not_tracebacks() -> None:
    with pytest.raises(IllegalTransition, match="bogus -> running"):
        check_instance_transition("bogus", "running")
    with pytest.raises(IllegalTransition, match="running -> exploded"):
        check_run_transition("running", "exploded")
    assert issubclass(IllegalTransition, EvalfleetError)


def test_terminal_sets() -> None:
    assert {s.value for s in RUN_TERMINAL} == {"closed", "aborted", "failed"}
    assert {s.value for s in INSTANCE_TERMINAL} == {
        "resolved",
        "unresolved",
        "error",
        "aborted",
        "lost",
    }


def test_instance_sources_inverts_the_table() -> None:
    assert {s.value for s in instance_sources(InstanceState.QUEUED)} == {
        "pending",
        "booting",
        "running",
        "evaluating",
    }
    assert {s.value for s in instance_sources(InstanceState.LOST)} == {
        "booting",
        "running",
        "evaluating",
    }


@pytest.mark.parametrize(
    ("used", "max_attempts", "expected"),
    [
        (1, 1, "lost"),
        (1, 3, "queued"),
        (2, 3, "queued"),
        (3, 3, "lost"),
        (4, 3, "lost"),
        (0, 1, "queued"),
    ],
)
def test_return_target_counts_attempts(used: int, max_attempts: int, expected: str) -> None:
    assert return_target(used, max_attempts) == InstanceState(expected)


def test_return_target_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        return_target(1, 0)
    with pytest.raises(ValueError):
        return_target(-1, 3)
