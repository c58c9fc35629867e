"""The pacer queue's order: which waiting call goes first, from which bucket holds the queue back.

``planner.pacer.PacerCore`` admits head-of-line; this module owns how the head is chosen. The
order depends on which bucket has held the head back (an average over the last ~100 times it
had to wait):

- the calls bucket: FIFO;
- the counted-token bucket: the call with the smallest prompt first, ageing
  ``AGEING_TOKENS_PER_S`` tokens of priority per second queued. A young task's call is small,
  and admitting it moves its task a whole tool cycle on for few tokens, so under a token limit
  more tasks progress and the queue of instances drains sooner (docs/bench-planner.md); a big
  call waits at most its prompt / ``AGEING_TOKENS_PER_S`` seconds longer than in FIFO, so it is
  never starved. The bound is per call, not per task: a task with a grown context waits that
  long at each of its calls, and under the sizing's token overdrive a few such tasks can run
  several times their unthrottled length (random-4744: four tasks started in its first minute
  still ran at 3,000 s, where no instance runs over 585 s unthrottled). Counting a task's
  earlier waits toward its calls' ageing ends that, and was measured slower on average
  (docs/bench-planner.md, thirty-eighth round);
- the output-token bucket: a call's task age counts as much as its time queued (the rank is
  arrival time + task start time). A call's output does not grow with its task's age, so
  favouring small prompts there only favours young tasks and stretches the old ones, and the
  run ends on its longest tasks, stretched (docs/bench-planner.md, tenth round). A young task's
  call ranks as if it had arrived the two tasks' age gap later, so it is delayed, never
  starved; a call of unknown task age ranks as a task started when it arrived. The planner
  turns this off (``PacerCore.set_old_tasks_first``, from ``Decision.old_tasks_first``) once
  no instance is left to launch and its curve's task durations are narrow: an old task is then
  nearly done, and the run ends on the young ones. The calls then go in arrival order.

Before all of these, when ``QueueOrder.urgent_share`` is set (an alias's
``pacer.urgent_share``; off by default), a call whose task has run that share of its instance
timeout (``CallEstimate.task_timeout_s``) goes first, the oldest task's first (earliest
deadline first): past the timeout its attempt lands as ``error``. A task already past it is
not urgent: its attempt is lost whatever the pacer does (the harness stops it, and a call it
left queued ranks as any other), and the rank it would take is what the tasks that can still
make it need. The simulator runs such a task on (it counts the timeout and does not enforce
it), and there the oldest-first rank went to dead tasks first, a domino: batch thirty-five
(168 runs, docs/bench-planner.md fifty-fifth round) at 0.75 left 592 instances past a 3,600 s
timeout uncapped and 485 capped (812 with the order off). Measured on batch twenty-six
with the sizing's timeout bound (docs/bench-planner.md, fiftieth round), 0.75 took the runs
with an instance past a 3,600 s timeout from 88 to 26 of 168, for 0.45% of mean makespan; it
costs up to 2% on some files (a trace file's 4-7 instances saved per 500) and two of the
target tests' files then miss a target, so it is the operator's choice, not the default.

Pure: arrival times are arguments; no clock, no I/O.
"""

from __future__ import annotations

from typing import Literal

from planner.pacer_types import CallEstimate

__all__ = ["AGEING_TOKENS_PER_S", "Order", "QueueOrder"]

#: Prompt tokens of priority a queued call gains per second waited, when a token bucket holds
#: the queue back (see the module docstring): a 40k-token call waits at most ~133 s longer than
#: in FIFO order behind a stream of small ones, well inside an LLM client's usual 600 s timeout.
#: Measured on the simulator over 124 runs (docs/bench-planner.md): 1,000 -> 300 took the
#: planner's mean makespan from 0.948 to 0.943 of the best baseline's, and the runs more than 3%
#: slower than it from 13 to 7; 100 gained little more (0.940) for a bound three times as long.
AGEING_TOKENS_PER_S = 300.0
#: Below every other rank (a prompt rank is ~300 x an epoch-seconds arrival, ~5e11): an urgent
#: call's rank is this plus its task's start time.
_URGENT_RANK = -1e15
#: Weight of the last wait in the average of which bucket holds the head back (per wait).
_BLOCKED_DECAY = 0.99

Order = Literal["fifo", "prompt", "task_age"]


class QueueOrder:
    """Which bucket has held the queue's head back, and each call's rank under the order that
    follows from it (smallest first)."""

    def __init__(self, urgent_share: float | None = None) -> None:
        if urgent_share is not None and not 0.0 < urgent_share <= 1.0:
            raise ValueError(f"urgent_share must be in (0, 1] or None, got {urgent_share!r}")
        # decaying counts of the waits of the head on the calls, token and output buckets
        self._held_by_calls = 0.0
        self._held_by_tokens = 0.0
        self._held_by_output = 0.0
        self.old_tasks_first = True
        self.urgent_share = urgent_share

    def urgent(self, estimate: CallEstimate) -> bool:
        """Whether the call's task has run ``urgent_share`` of its instance timeout and not yet
        all of it (past it the attempt is lost: its harness stops it, and the rank goes to the
        tasks that can still make it)."""
        share = self.urgent_share
        timeout = estimate.task_timeout_s
        age = estimate.task_age_s
        return (
            share is not None
            and timeout is not None
            and age is not None
            and share * timeout <= age < timeout
        )

    @property
    def order(self) -> Order:
        """The queue's order, from the bucket that has held the head back most."""
        output = self._held_by_output
        if output > self._held_by_tokens and output > self._held_by_calls:
            return "task_age"
        if self._held_by_tokens > self._held_by_calls:
            return "prompt"
        return "fifo"

    def note_hold(self, calls: float, tokens: float, output: float) -> bool:
        """Count which bucket holds the head back, from its waits on the calls, counted-token
        and output buckets (a head held only by in-flight tokens says nothing of the rates).
        True when that changed the order: the queued calls are to be ranked again."""
        if calls <= 0 and tokens <= 0 and output <= 0:
            return False
        before = self.order
        self._held_by_calls *= _BLOCKED_DECAY
        self._held_by_tokens *= _BLOCKED_DECAY
        self._held_by_output *= _BLOCKED_DECAY
        if output > tokens and output > calls:
            self._held_by_output += 1.0
        elif tokens > calls:
            self._held_by_tokens += 1.0
        else:
            self._held_by_calls += 1.0
        return self.order != before

    def priority(self, estimate: CallEstimate, arrived: float) -> float:
        """The call's rank in the current order (smallest first; module docstring)."""
        if self.urgent(estimate):
            return _URGENT_RANK + arrived - (estimate.task_age_s or 0.0)
        order = self.order
        if order == "prompt":
            return AGEING_TOKENS_PER_S * arrived + estimate.input_uncached + estimate.input_cached
        if order == "task_age" and self.old_tasks_first:
            age = estimate.task_age_s or 0.0
            return arrived + (arrived - age)
        return arrived
