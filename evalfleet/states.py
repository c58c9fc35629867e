"""Run and instance state machines: the states, the legal transitions, and checks that raise.

This module is the single definition of the lifecycles in DESIGN.md "States"; the ledger's
queue and the flows call ``check_*_transition`` before writing a state, so an illegal change is
an ``IllegalTransition`` error, never a silent overwrite. Pure: no I/O, no clock.

run: ``pending → launching → running → draining → closed``; ``running ⇄ paused``; ``aborted``
and ``failed`` are terminal and reachable from every live state.

instance: ``pending → queued → booting → running → evaluating → resolved | unresolved | error |
aborted | lost``. ``booting``, ``running`` and ``evaluating`` return to ``queued`` after an
infrastructure failure or an expired lease; each attempt counts, and a return once the run's
``max_attempts`` attempts are used up ends ``lost`` instead (see ``return_target``). A run
without an evaluation stage lands straight from ``running``; ``error`` can also end ``booting``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar

from evalfleet.errors import IllegalTransition


class RunState(StrEnum):
    """The lifecycle of a run."""

    PENDING = "pending"
    LAUNCHING = "launching"
    RUNNING = "running"
    PAUSED = "paused"
    DRAINING = "draining"
    CLOSED = "closed"
    ABORTED = "aborted"
    FAILED = "failed"


class InstanceState(StrEnum):
    """The lifecycle of one instance of a run."""

    PENDING = "pending"
    QUEUED = "queued"
    BOOTING = "booting"
    RUNNING = "running"
    EVALUATING = "evaluating"
    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"
    ERROR = "error"
    ABORTED = "aborted"
    LOST = "lost"


E = TypeVar("E", RunState, InstanceState)

_R = RunState
RUN_TRANSITIONS: Mapping[RunState, frozenset[RunState]] = {
    _R.PENDING: frozenset({_R.LAUNCHING, _R.ABORTED, _R.FAILED}),
    _R.LAUNCHING: frozenset({_R.RUNNING, _R.ABORTED, _R.FAILED}),
    _R.RUNNING: frozenset({_R.PAUSED, _R.DRAINING, _R.ABORTED, _R.FAILED}),
    _R.PAUSED: frozenset({_R.RUNNING, _R.DRAINING, _R.ABORTED, _R.FAILED}),
    _R.DRAINING: frozenset({_R.CLOSED, _R.ABORTED, _R.FAILED}),
    _R.CLOSED: frozenset(),
    _R.ABORTED: frozenset(),
    _R.FAILED: frozenset(),
}

_I = InstanceState
_ENDINGS = frozenset({_I.RESOLVED, _I.UNRESOLVED, _I.ERROR, _I.ABORTED})
INSTANCE_TRANSITIONS: Mapping[InstanceState, frozenset[InstanceState]] = {
    _I.PENDING: frozenset({_I.QUEUED, _I.ABORTED}),
    _I.QUEUED: frozenset({_I.BOOTING, _I.ABORTED}),
    _I.BOOTING: frozenset({_I.RUNNING, _I.QUEUED, _I.LOST, _I.ERROR, _I.ABORTED}),
    _I.RUNNING: frozenset({_I.EVALUATING, _I.QUEUED, _I.LOST} | _ENDINGS),
    _I.EVALUATING: frozenset({_I.QUEUED, _I.LOST} | _ENDINGS),
    _I.RESOLVED: frozenset(),
    _I.UNRESOLVED: frozenset(),
    _I.ERROR: frozenset(),
    _I.ABORTED: frozenset(),
    _I.LOST: frozenset(),
}

RUN_TERMINAL: frozenset[RunState] = frozenset(s for s, nxt in RUN_TRANSITIONS.items() if not nxt)
INSTANCE_TERMINAL: frozenset[InstanceState] = frozenset(
    s for s, nxt in INSTANCE_TRANSITIONS.items() if not nxt
)
#: Instance states that hold a lease (a claimed job): they may return to ``queued``.
INSTANCE_LEASED: frozenset[InstanceState] = frozenset({_I.BOOTING, _I.RUNNING, _I.EVALUATING})
#: Instance states that draw on the LLM provider: the harness fleet the planner sizes and the
#: dispatcher admits against. An ``evaluating`` instance is done calling the LLM (its grading
#: runs on the eval pool or holds an in-process launcher thread, which the launcher counts).
INSTANCE_CALLING: frozenset[InstanceState] = frozenset({_I.BOOTING, _I.RUNNING})
#: Outcomes an instance lands with (``lost`` is decided by the queue, not by the instance).
INSTANCE_OUTCOMES: frozenset[InstanceState] = _ENDINGS
#: Run states whose queued jobs may be claimed (``draining`` still finishes requeued work).
RUN_CLAIMABLE: frozenset[RunState] = frozenset({_R.RUNNING, _R.DRAINING})


def _check(
    kind: str,
    enum: type[E],
    table: Mapping[E, frozenset[E]],
    current: str,
    target: str,
) -> E:
    try:
        source, goal = enum(current), enum(target)
    except ValueError:
        raise IllegalTransition(kind, current, target) from None
    if goal not in table[source]:
        raise IllegalTransition(kind, source, goal)
    return goal


def check_run_transition(current: str, target: str) -> RunState:
    """Return ``target`` as a RunState if ``current → target`` is legal; else IllegalTransition."""
    return _check("run", RunState, RUN_TRANSITIONS, current, target)


def check_instance_transition(current: str, target: str) -> InstanceState:
    """Return ``target`` as an InstanceState if legal from ``current``; else IllegalTransition."""
    return _check("instance", InstanceState, INSTANCE_TRANSITIONS, current, target)


def instance_sources(target: InstanceState) -> frozenset[InstanceState]:
    """Every state from which ``target`` is legal (used in guarded ``UPDATE ... WHERE state IN``)."""
    return frozenset(s for s, nxt in INSTANCE_TRANSITIONS.items() if target in nxt)


def return_target(attempts_used: int, max_attempts: int) -> InstanceState:
    """Where a leased instance goes when its attempt fails for an infrastructure reason.

    ``attempts_used`` counts the claims so far (the failed one included). While fewer than
    ``max_attempts`` attempts were used the instance goes back to ``queued``; after that, ``lost``.
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    if attempts_used < 0:
        raise ValueError("attempts_used cannot be negative")
    return InstanceState.QUEUED if attempts_used < max_attempts else InstanceState.LOST
