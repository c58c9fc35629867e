"""The planner policy in the simulator: our budget controller, fleet sizing and pacer, wired up.

Every tick it feeds the budget controller (``planner.budgets.step``) what the gateway would
have seen in the window: the classified 429s and the latest rate-limit headers (per the
scenario's header style; nothing with ``none``), pushes the budgets to the pacer
(``planner.pacer.PacerCore``, which every call of the fleet goes through) and sizes the fleet
with ``planner.sizing.decide`` from the live tasks' ages, the booting count and the queue.
Between ticks a call's first 429 cuts the pacer at once, as the gateway's pacer does
(``planner.provisional_cut``); the controller acts on it at the tick.

The curve it sizes on and the pacer as the simulator's gate are ``sim.pacer_gate``'s. Only
what a real deployment knows is used: the alias config (seed, cache-counting belief), the
provider's limit classes (which exist, not their values), headers and 429s (a call's first 429,
not its retries', as the gateway records them, unless the provider answered nothing else in
the window: ``planner.retry_evidence``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from gateway.send_log import JUDGE_EVERY_S
from planner.budgets import (
    BudgetClass,
    Budgets,
    ControllerActions,
    ControllerConfig,
    TokenClass,
    WindowObservation,
    header_classes,
    initial_state,
    recounted,
    step,
)
from planner.cache_counting import infer_cached_input_counts
from planner.classify import Classification, LimitType
from planner.curves import HarnessCurve
from planner.decision import Decision, Quantity
from planner.drain_belief import DrainEvidence, DrainSample, judged
from planner.inflight_use import sized_by_inflight
from planner.pacer import (
    DEFAULT_BURST_S,
    DEFAULT_STATED_BURST_S,
    HOLD_AFTER_429_S,
    PacerCore,
    PacerUsage,
    classes_to_hold,
    hold_seconds,
)
from planner.provisional_cut import ProvisionalCuts
from planner.retry_evidence import unanswered_retry_throttles
from planner.sizing import (
    Caps,
    Counting,
    FleetState,
    OverdriveConfig,
    SizingConfig,
    decide,
    hold_overdrive,
    steady_state,
)
from sim.charge_tracker import ChargeTracker
from sim.drain_book import DrainBook
from sim.engine import FleetView, Gate
from sim.pacer_gate import PacerGate, scenario_curve
from sim.scenario import Scenario
from sim.workload import Workload

_BUDGET_CLASS = {
    Quantity.CALLS: BudgetClass.REQUESTS,
    Quantity.TOKENS: BudgetClass.TOKENS,
    Quantity.OUTPUT_TOKENS: BudgetClass.OUTPUT_TOKENS,
    Quantity.INFLIGHT_TOKENS: BudgetClass.INFLIGHT,
}
HeadersNow = Callable[[float], Classification | None]


class PlannerPolicy:
    """Ours: budget controller + sizing + pacer (see the module docstring)."""

    name = "planner"
    reads_headers = True

    def __init__(
        self,
        scenario: Scenario,
        workload: Workload,
        headers_now: HeadersNow,
        *,
        sizing: SizingConfig | None = None,
        controller: ControllerConfig | None = None,
        burst_s: float | None = None,
        curve: HarnessCurve | None = None,
        urgent_share: float | None = None,
    ) -> None:
        ac = scenario.alias_config
        self.token_class: TokenClass = "combined" if scenario.provider.tpm is not None else "input"
        seed = Budgets(
            calls_per_s=ac.calls_per_s,
            tokens_per_s=ac.tokens_per_s,
            output_tokens_per_s=ac.output_tokens_per_s,
            inflight_tokens=ac.inflight_tokens,
        )
        self.controller = controller or ControllerConfig()
        self.state = initial_state(
            seed,
            0.0,
            seeded_at=-ac.seeded_hours_ago * 3600.0,
            cached_input_counts=ac.cached_input_counts,
            token_class=self.token_class,
            config=self.controller,
        )
        self.sizing = sizing or SizingConfig(
            boot_s=(scenario.harness.boot_s.min + scenario.harness.boot_s.max) / 2.0
        )
        self.counting = Counting(
            cached_input_counts=ac.cached_input_counts, combined=self.token_class == "combined"
        )
        self.caps = Caps(
            static=scenario.caps.static, run=scenario.caps.run, override=scenario.caps.override
        )
        self.curve = curve or scenario_curve(scenario)
        self.instance_timeout_s = scenario.instance_timeout_s
        self.steady = steady_state(
            self.curve, self.counting, self.sizing.boot_s, self.sizing.integration_age_s
        )
        # The gateway's defaults (planner.pacer): a bucket the provider states is mirrored a
        # minute deep, so its burst is used as the provider allows; one it does not state is a
        # guess, 20 s deep: a third of the provider's minute absorbs the fleet's bursts, and an
        # over-guess bursts at most that far (2 s until the fortieth round: slower, as many 429s).
        self.pacer = PacerCore(
            self.state.budgets,
            DEFAULT_BURST_S if burst_s is None else burst_s,
            stated_burst_s=DEFAULT_STATED_BURST_S,
            token_class=self.token_class,
            cached_input_counts=ac.cached_input_counts,
            urgent_share=urgent_share,  # an alias's pacer.urgent_share (off by default)
        )
        self._pacer_gate = PacerGate(self.pacer, workload, scenario.instance_timeout_s)
        self._stated_by_429: dict[LimitType, float] = {}  # limits the window's 429s stated
        self._gateway_verdict = False  # the gateway judged a token 429: cache reads count
        self.provisional = ProvisionalCuts(
            self.state.budgets, cooldown_s=self.controller.cooldown_s
        )
        self.gate: Gate | None = self._pacer_gate
        self.progress = 1.0
        self.headers_now = headers_now
        self._throttles: list[tuple[LimitType, float | None]] = []
        self._answered = 0
        self.decisions: list[Decision] = []
        self.last_actions: ControllerActions | None = None  # the latest tick's
        self.overdrive = OverdriveConfig()
        self.overdrive_factor = 1.0
        # (response time, call) of the provider's successes over the last cooldown
        self._accepted: deque[tuple[float, int]] = deque()
        self._workload = workload
        self._counted_as = {counts: self._counted_per_call(counts) for counts in (True, False)}
        self._counted = self._counted_as[ac.cached_input_counts]
        self._output = workload.output.tolist()
        base = workload.input - workload.cached
        if self.token_class == "combined":
            base = base + workload.output
        self._base = base.tolist()
        self._cached = workload.cached.tolist()
        self.charges = ChargeTracker()
        self._admit_at: dict[int, float] = {}
        self.drains = DrainBook(self._counted_as, self._output)
        # the drained rates at the latest steps that read them (planner.drain_belief)
        self._belief_samples = DrainEvidence()

        def _on_admit(now: float, call: int) -> None:
            self._admit_at[call] = now
            self.charges.admitted(call, now, self._base[call], self._cached[call])

        self._pacer_gate.on_admit = _on_admit
        self._last_read = -math.inf  # the last success whose headers the tracker read
        self._rejected: set[int] = set()  # calls that drew a 429 (their retries' add nothing)
        # the window's retries' 429 types, and whether a call's first 429 came in it
        self._retried_429s: set[LimitType] = set()
        self._first_429_in_window = False
        self._largest: dict[bool, float] = {True: 0.0, False: 0.0}
        self._largest_output = 0.0
        self.recounted: list[tuple[float, bool]] = []  # (when, cache reads count) on each flip

    def _counted_per_call(self, cached_input_counts: bool) -> list[float]:
        wl = self._workload
        counted = wl.input - (0 if cached_input_counts else wl.cached)
        if self.token_class == "combined":
            counted = counted + wl.output
        return list(counted.tolist())

    def on_response(self, now: float, call: int, classification: Classification | None) -> None:
        if classification is None:
            self.drains.accepted(self._admit_at.pop(call, now), now, call)
            self._answered += 1
            if now - self._last_read >= JUDGE_EVERY_S:
                # the gateway reads every success's headers; once a second is what it judges by
                self._last_read = now
                limit, remaining = self._counted_view(self.headers_now(now))
                if limit is not None and remaining is not None:
                    self.charges.read(now, limit, remaining)
            # rule 8's evidence: the largest call accepted in the window, tokens counted both
            # ways (the tick reads the belief it holds then)
            for counts in (True, False):
                self._largest[counts] = max(self._largest[counts], self._counted_as[counts][call])
            self._largest_output = max(self._largest_output, self._output[call])
            self._accepted.append((now, call))
            self.charges.sent(call, now, self._base[call], self._cached[call])
            while self._accepted[0][0] < now - self.controller.cooldown_s:
                self._accepted.popleft()
            return
        self.charges.rejected(call)
        self._stated_by_429.update(classification.limits)
        throttle = (classification.limit_type, classification.retry_after_s)
        if classification.limit_type in (LimitType.TOKENS, LimitType.INPUT_TOKENS):
            limit, remaining = self._counted_view(classification)
            if limit is not None and remaining is not None:
                # the gateway judges it at once (gateway.send_log); the tick judges a
                # storm's first too, once every call admitted before it is answered
                window = self.charges.throttled(now, limit, remaining)
                if (
                    window is not None
                    and not self.counting.cached_input_counts
                    and infer_cached_input_counts([window], believed=False)
                ):
                    # the gateway's pacer counts cache reads from this 429 on; the planner
                    # adopts the verdict (budgets, sizing) at its tick
                    self.pacer.cached_input_counts = True
                    self._gateway_verdict = True
        first = call not in self._rejected
        # as the gateway's pacer does (planner.provisional_cut): a call's first 429 cuts the
        # classes it hits at once, until the controller acts on it at the tick
        if first and self.provisional.first_429(
            now, classification.limit_type, self.token_class, classification.limits
        ):
            self.pacer.set_budgets(self.provisional.budgets(), now)
        if classification.remaining:
            # the provider's buckets are emptier than ours: retries must not storm them
            self._observe_remaining(classification, now)
        held = classes_to_hold(
            classification,
            token_class=self.token_class,
            has_output_budget=self.pacer.budgets.output_tokens_per_s is not None,
        )
        if held:
            # an empty bucket it says nothing of takes no retries at once
            self.pacer.hold(held, hold_seconds(classification, HOLD_AFTER_429_S), now)
        if not first:
            # a retry's 429 repeats its first one's evidence (the gateway flags retries in
            # llm_calls.retry, and the planner's window skips them): a call too big for the
            # provider's bucket at the moment, retried until it fits, would otherwise cut every
            # budget on each retry (docs/bench-planner.md, seventeenth round); unless nothing
            # else happens in the window (``planner.retry_evidence``)
            self._retried_429s.add(classification.limit_type)
            return
        self._rejected.add(call)
        self._first_429_in_window = True
        self._throttles.append(throttle)

    def _push_budgets(self, now: float) -> None:
        """The controller's budgets to the pacer, as the planner's push reaches the gateway's:
        a provisional cut stands until the controller moves its class (or it lapses)."""
        self.provisional.settle(now, self.state.budgets)
        self.pacer.set_budgets(self.provisional.budgets(), now)

    def _observe_remaining(self, view: Classification, now: float) -> None:
        """No pacer bucket holds more than the provider says is left of its own."""
        self.pacer.observe_remaining(
            header_classes(
                view.remaining,
                token_class=self.token_class,
                # the pacer's buckets, a provisional output budget among them (as the gateway)
                has_output_budget=self.pacer.budgets.output_tokens_per_s is not None,
            ),
            now,
        )

    def _drained(self, now: float) -> dict[BudgetClass, float]:
        """Per budget class, how fast the provider's bucket was drained (``planner.drain``),
        tokens counted as believed."""
        return self.drains.rates(
            now,
            cached_input_counts=self.counting.cached_input_counts,
            with_output=self.state.budgets.output_tokens_per_s is not None,
        )

    def _drained_for_blame(self, now: float) -> dict[BudgetClass, float]:
        """The drained rates a step's blame of a 429 that names no limit reads, as the planner
        tick takes them: each is a sample of the cache-counting belief's test without headers
        (``planner.drain_belief``), and where the samples contradict the belief it flips
        first, and the rates read the new units."""
        believed = self.counting.cached_input_counts
        drained = self._drained(now)
        other_rate = self.drains.rate(BudgetClass.TOKENS, now, cached_input_counts=not believed)
        self._belief_samples, measured = judged(
            self._belief_samples, DrainSample.of(drained, other_rate)
        )
        if measured is None:
            return drained
        self._recount(not believed, now, measured)
        return self._drained(now)

    def _delivered(self, now: float) -> dict[BudgetClass, float]:
        """What the provider accepted over the last cooldown, per budget class, per second."""
        span = self.controller.cooldown_s
        while self._accepted and self._accepted[0][0] < now - span:
            self._accepted.popleft()
        calls = [c for _, c in self._accepted]
        counted = sum(self._counted[c] for c in calls)
        output = sum(self._output[c] for c in calls)
        out = {BudgetClass.REQUESTS: len(calls) / span, BudgetClass.TOKENS: counted / span}
        if self.state.budgets.output_tokens_per_s is not None:
            out[BudgetClass.OUTPUT_TOKENS] = output / span
        return out

    def _counted_view(self, view: Classification | None) -> tuple[float | None, float | None]:
        """The counted token class's stated limit (per minute) and remaining, if stated."""
        if view is None:
            return None, None
        limits = header_classes(view.limits, token_class=self.token_class, has_output_budget=False)
        left = header_classes(view.remaining, token_class=self.token_class, has_output_budget=False)
        return limits.get(BudgetClass.TOKENS), left.get(BudgetClass.TOKENS)

    def _judge_throttle(self, now: float) -> None:
        """A storm's first token 429 against the belief that cache reads do not count, once
        its calls are answered (``ChargeTracker.judge_throttle``, as the planner tick judges
        the one the gateway's recorder keeps)."""
        if self.counting.cached_input_counts:
            return
        window = self.charges.judge_throttle(now)
        if window is not None and infer_cached_input_counts([window], believed=False):
            self._recount(True, now)

    def _check_counting(self, view: Classification | None, now: float) -> None:
        """Test the cache-counting belief against the provider's stated bucket
        (``planner.cache_counting``) over the spans closed so far."""
        limit, remaining = self._counted_view(view)
        if not self.charges.observe(now, limit, remaining):
            return
        believed = self.counting.cached_input_counts
        counts = infer_cached_input_counts(
            list(self.charges.windows), believed, dips=list(self.charges.dips)
        )
        if counts != believed:
            self._recount(counts, now)

    def _recount(self, counts: bool, now: float, measured: float | None = None) -> None:
        """The belief flips: the pacer, the sizing and the token budget follow (to
        ``measured``, the limit in the new units, where no header states it)."""
        self.recounted.append((now, counts))
        self.charges.restart()
        self._belief_samples = DrainEvidence()
        self.counting = replace(self.counting, cached_input_counts=counts)
        self.steady = steady_state(
            self.curve, self.counting, self.sizing.boot_s, self.sizing.integration_age_s
        )
        self.pacer.cached_input_counts = counts
        self._counted = self._counted_as[counts]
        self.state = recounted(self.state, counts, now, measured)
        self._push_budgets(now)

    def _update_progress(self) -> None:
        """Smoothed share of unthrottled speed: 1 / (1 + pacer wait per call / mean gap)."""
        wait_s, admitted = self._pacer_gate.take_waits()
        if admitted == 0:
            return
        window = 1.0 / (1.0 + (wait_s / admitted) / self.steady.mean_gap_s)
        weight = min(1.0, self.sizing.step_s / max(self.curve.mean_duration_s(), 1.0))
        self.progress = min(1.0, max(0.05, self.progress + weight * (window - self.progress)))

    def _hold_overdrive(self, now: float, usage: PacerUsage) -> None:
        """Feed the saturation controller the last window's use of the saturating budget."""
        last = self.decisions[-1] if self.decisions else None
        if (
            last is None
            or not last.feeds_saturation
            or last.saturating is None
            or self.state.in_cooldown(now)
            or last.now < self.sizing.horizon_s
        ):
            return
        util = usage.utilisation.get(_BUDGET_CLASS[last.saturating])
        if util is not None:
            self.overdrive_factor = hold_overdrive(self.overdrive_factor, util, self.overdrive)

    def _take_largest(self) -> dict[BudgetClass, float] | None:
        """The window's largest accepted call per token class (rule 8), reset for the next."""
        if not self._answered:
            return None
        largest = {BudgetClass.TOKENS: self._largest[self.state.cached_input_counts]}
        if self._largest_output > 0:
            largest[BudgetClass.OUTPUT_TOKENS] = self._largest_output
        self._largest = {True: 0.0, False: 0.0}
        self._largest_output = 0.0
        return largest

    def tick(self, fleet: FleetView) -> int:
        now = fleet.now
        observed = None
        view = self.headers_now(now)
        if self._answered or self._throttles:
            # the latest headers, plus what a 429 in the window stated that they do not (a
            # limit only a 429's message names), as the tick reads alias_observations
            observed = {
                **self._stated_by_429,
                **(view.limits if view is not None and view.limits else {}),
            } or None
            if view is not None and view.remaining:
                self._observe_remaining(view, now)
        self._stated_by_429 = {}
        if self._gateway_verdict and not self.counting.cached_input_counts:
            self._recount(True, now)
        self._gateway_verdict = False
        self._judge_throttle(now)
        self._check_counting(view, now)
        self._throttles.extend(
            (lt, None)
            for lt in unanswered_retry_throttles(
                self._retried_429s,
                first_429s=int(self._first_429_in_window),
                answered=self._answered,
            )
        )
        self._retried_429s = set()
        self._first_429_in_window = False
        usage = self.pacer.take_usage(now)
        last = self.decisions[-1] if self.decisions else None
        # read only by the blame of a 429 that names no limit (as the planner tick reads it),
        # and first: a flip of the belief it makes puts what was delivered in new units
        drained = (
            self._drained_for_blame(now)
            if any(lt is LimitType.UNKNOWN for lt, _ in self._throttles)
            else None
        )
        obs = WindowObservation(
            now=now,
            throttles=tuple(self._throttles),
            observed_limits=observed,
            utilisation=usage.utilisation,
            delivered=self._delivered(now) if self._throttles else None,
            drained=drained,
            answered=self._answered,
            largest_accepted=self._take_largest(),
            sized_by_inflight=last is not None and sized_by_inflight(last.binding, last.sized_by),
            # a re-probe's drained rate read again once its calls in flight are answered
            settled_drained=self.drains.settled(
                self.state.unsettled_reprobe,
                self.charges.complete_before(now),
                cached_input_counts=self.counting.cached_input_counts,
            ),
        )
        self._throttles.clear()
        self._answered = 0
        self.state, actions = step(self.state, obs, self.controller)
        self.last_actions = actions  # read by sim.trace
        self._update_progress()
        self._hold_overdrive(now, usage)
        self._push_budgets(now)
        decision = decide(
            FleetState(
                now=now,
                ages=fleet.ages,
                booting=fleet.booting,
                queued=fleet.queued,
                paused=actions.pause_run,
                in_cooldown=self.state.in_cooldown(now),
                stale=actions.stale,
                progress=self.progress,
                ramping=self.state.ramping(),
                instance_timeout_s=self.instance_timeout_s,
            ),
            self.curve,
            self.state.budgets,
            self.counting,
            self.caps,
            replace(self.sizing, overdrive=self.sizing.overdrive * self.overdrive_factor),
            self.steady,
        )
        self.decisions.append(decision)
        self.pacer.set_old_tasks_first(decision.old_tasks_first)
        return decision.ceiling
