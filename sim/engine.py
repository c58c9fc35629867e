"""The discrete-event fleet simulator: one scenario, one policy, deterministic, no wall clock.

Owns the event loop (a heapq of (time, sequence, kind, instance)) and the life of every
instance: launch → boot → calls → done. Each call is offered to the policy's gate (our pacer,
planner policy only; baselines have none), sent to the provider (``sim.limits.ProviderLimits``,
the true limits, the same model the simulated provider server uses), and on a 429 retried after
the revealed ``retry-after`` (15 s when the response states none). Every delay shifts the rest
of the instance: a call's in-flight and tool times are kept, the clock moves. The policy ticks
every ``tick_s`` simulated seconds and returns the fleet ceiling; the dispatcher launches queued
instances (in order) whenever running + booting < ceiling.

What the provider reveals (headers, the classified limit type, retry-after) comes from
``sim.reveal`` according to the scenario's header style.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from planner.classify import Classification, LimitType
from sim.limits import CallCharge, ProviderLimits, Ticket
from sim.reveal import describe_429, retry_after
from sim.workload import Workload

TICK, START, REQUEST, RESPONSE, DONE, WAKE = range(6)
DEFAULT_RETRY_S = 15.0
MIN_WAKE_STEP_S = 1e-6  # a pacer wake is at least this far ahead of the drain that set it
# What a policy that does not read headers hears of a 429: that it happened.
_BARE_429 = Classification(status=429, limit_type=LimitType.UNKNOWN)


@dataclass(frozen=True, slots=True)
class FleetView:
    """What a policy sees at a tick: running tasks' ages, booting and queued counts."""

    now: float
    ages: NDArray[np.float64]
    booting: int
    queued: int


class Gate(Protocol):
    """Our pacer between the instances and the provider (time is an argument)."""

    def offer(self, now: float, call: int) -> bool:
        """Queue call index ``call``; True when it is admitted at once (it is then not queued)."""
        ...

    def release(self, now: float, call: int, ok: bool) -> None:
        """The call's response (``ok``) or 429 arrived: settle it, free its in-flight tokens."""
        ...

    def admit_ready(self, now: float) -> list[int]:
        """Admit queued calls (in the pacer's order) that the budgets allow at ``now``."""
        ...

    def next_time(self, now: float) -> float | None:
        """When the head of the queue could next be admitted (None: queue empty or blocked)."""
        ...

    @property
    def waiting(self) -> int:
        """How many calls wait in the queue."""
        ...


class Policy(Protocol):
    """A fleet policy: sets the ceiling every tick and hears every provider response."""

    name: str
    gate: Gate | None
    reads_headers: bool

    def tick(self, fleet: FleetView) -> int:
        """The fleet ceiling (running + booting) from now until the next tick."""
        ...

    def on_response(self, now: float, call: int, classification: Classification | None) -> None:
        """A call was answered: ``classification`` is None for a success, else the 429's."""
        ...


@dataclass
class RunStats:
    """Raw figures of one simulated run (see sim.metrics for the derived ones)."""

    makespan_s: float = 0.0
    calls: int = 0
    http_429: int = 0
    peak_fleet: int = 0
    ticks: int = 0
    pacer_wait_s: float = 0.0
    finished: int = 0
    consumed: dict[str, float] = field(default_factory=dict)
    fleet_s: float = 0.0
    stalled_at: float | None = None
    # per instance (the workload's order): when it was launched and finished (nan: it was
    # not), and the seconds its calls were held at the policy's gate and waited after 429s;
    # finished - launched = its unthrottled duration (``Workload.durations``) + the two
    launched_at: list[float] = field(default_factory=list)
    finished_at: list[float] = field(default_factory=list)
    paced_s: list[float] = field(default_factory=list)
    throttled_s: list[float] = field(default_factory=list)


class Simulation:
    """One run of ``workload`` under ``policy`` against ``provider``."""

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        provider: ProviderLimits,
        style: str,
        *,
        tick_s: float = 15.0,
        max_time_s: float = 30 * 86_400.0,
        stall_s: float = 1800.0,
        on_throttle: Callable[[float, LimitType | None], None] | None = None,
    ) -> None:
        self.w = workload
        self.policy = policy
        self.provider = provider
        self.style = style
        self.tick_s = tick_s
        self.max_time_s = max_time_s
        self.stall_s = stall_s
        # told the limit each 429 truly hit (``sim.trace``: what the policy could not know)
        self.on_throttle = on_throttle

    def run(self) -> RunStats:
        w, policy, provider, gate = self.w, self.policy, self.provider, self.policy.gate
        style, reads_headers = self.style, self.policy.reads_headers
        on_throttle = self.on_throttle
        n = w.n_instances
        starts = w.start.tolist()
        boot = w.boot.tolist()
        latency = w.latency.tolist()
        after = w.after.tolist()
        uncached = (w.input - w.cached).tolist()
        cached = w.cached.tolist()
        output = w.output.tolist()
        # one charge per call, built on its first send: a 429 storm retries the same call
        # hundreds of thousands of times
        charges: list[CallCharge | None] = [None] * len(uncached)
        call_of = [0] * n  # next call index of each instance
        inst_of_call: dict[int, int] = {}
        running: dict[int, float] = {}  # instance -> start time (age origin)
        tickets: dict[int, Ticket] = {}
        offered_at: dict[int, float] = {}
        booting = 0
        next_inst = 0
        ceiling = 0
        stats = RunStats(
            launched_at=[math.nan] * n,
            finished_at=[math.nan] * n,
            paced_s=[0.0] * n,
            throttled_s=[0.0] * n,
        )
        paced_s, throttled_s = stats.paced_s, stats.throttled_s
        heap: list[tuple[float, int, int, int]] = []
        seq = 0
        wake_at = math.inf
        last_t = 0.0
        live_area = 0.0
        last_progress = 0.0
        # calls requested and not yet admitted (held at the gate or retrying after a 429): a
        # stall is no admission for ``stall_s`` while one waits, or while nothing is live; an
        # instance in a long tool gap with nothing waiting is the workload, not a stall
        pending: set[int] = set()

        def push(t: float, kind: int, who: int) -> None:
            nonlocal seq
            seq += 1
            heapq.heappush(heap, (t, seq, kind, who))

        def launch(t: float) -> None:
            nonlocal next_inst, booting
            while next_inst < n and len(running) + booting < ceiling:
                booting += 1
                stats.launched_at[next_inst] = t
                push(t + boot[next_inst], START, next_inst)
                next_inst += 1
            stats.peak_fleet = max(stats.peak_fleet, len(running) + booting)

        def send(t: float, call: int) -> None:
            nonlocal last_progress
            stats.calls += 1
            charge = charges[call]
            if charge is None:
                charge = charges[call] = CallCharge(uncached[call], cached[call], output[call])
            adm = provider.admit(t, charge)
            if adm.admitted:
                last_progress = t
                pending.discard(call)
                assert adm.ticket is not None
                tickets[call] = adm.ticket
                push(t + latency[call], RESPONSE, call)
                return
            stats.http_429 += 1
            if on_throttle is not None:
                on_throttle(t, adm.limit)
            retry = retry_after(style, adm)
            delay = DEFAULT_RETRY_S if retry is None else retry
            throttled_s[inst_of_call[call]] += delay
            if gate is not None:
                gate.release(t, call, False)
            if reads_headers:
                policy.on_response(t, call, describe_429(style, provider, t, adm))
            else:
                policy.on_response(t, call, _BARE_429)
            push(t + delay, REQUEST, call)

        def schedule_wake(t: float) -> None:
            nonlocal wake_at
            assert gate is not None
            nt = gate.next_time(t)
            if nt is not None and nt < wake_at:
                # the gate was just drained at t: a wake at t itself would loop at t forever
                wake_at = max(nt, t + MIN_WAKE_STEP_S)
                push(wake_at, WAKE, -1)

        def admit_from_gate(t: float) -> None:
            assert gate is not None
            for call in gate.admit_ready(t):
                wait = t - offered_at.pop(call)
                stats.pacer_wait_s += wait
                paced_s[inst_of_call[call]] += wait
                send(t, call)
            schedule_wake(t)

        push(0.0, TICK, -1)
        remaining = n
        while heap and remaining > 0:
            t, _, kind, who = heapq.heappop(heap)
            if t > self.max_time_s or (
                t - last_progress > self.stall_s and (pending or not (running or booting))
            ):
                # no call admitted for stall_s while calls wait: the clients' retries keep the
                # provider's request bucket empty (rejected requests count against it) - a
                # livelock; or the policy holds every call, or launches nothing
                stats.stalled_at = t
                break
            live_area += (len(running) + booting) * (t - last_t)
            last_t = t
            if kind == REQUEST:
                if not pending:
                    last_progress = t  # the wait starts now, not at the last admission
                pending.add(who)
                if gate is None:
                    send(t, who)
                else:
                    offered_at[who] = t
                    if gate.offer(t, who):
                        offered_at.pop(who)
                        send(t, who)
                    else:
                        schedule_wake(t)
            elif kind == RESPONSE:
                ticket = tickets.pop(who)
                provider.settle(t, ticket, output[who])
                inst = inst_of_call.pop(who)
                policy.on_response(t, who, None)
                nxt = who + 1
                if nxt < starts[inst + 1]:
                    call_of[inst] = nxt
                    inst_of_call[nxt] = inst
                    push(t + after[who], REQUEST, nxt)
                else:
                    push(t + after[who], DONE, inst)
                if gate is not None:
                    gate.release(t, who, True)
                    if gate.waiting:
                        admit_from_gate(t)
            elif kind == WAKE:
                if t == wake_at:
                    wake_at = math.inf
                    admit_from_gate(t)
            elif kind == START:
                booting -= 1
                running[who] = t
                first = starts[who]
                if first < starts[who + 1]:
                    inst_of_call[first] = who
                    push(t, REQUEST, first)
                else:
                    push(t, DONE, who)
            elif kind == DONE:
                last_progress = t
                del running[who]
                remaining -= 1
                stats.finished += 1
                stats.finished_at[who] = t
                stats.makespan_s = t
                launch(t)
            else:  # TICK
                stats.ticks += 1
                ages = t - np.fromiter(running.values(), dtype=np.float64, count=len(running))
                view = FleetView(now=t, ages=ages, booting=booting, queued=n - next_inst)
                ceiling = policy.tick(view)
                launch(t)
                if gate is not None and gate.waiting:
                    admit_from_gate(t)
                push(t + self.tick_s, TICK, -1)
        stats.fleet_s = live_area
        stats.consumed = {str(k.value): v for k, v in provider.consumed.items()}
        if remaining > 0:
            stats.makespan_s = math.inf
        return stats
