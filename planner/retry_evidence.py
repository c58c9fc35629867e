"""When a retry's 429 is evidence: a window in which the provider answered nothing.

A call's first 429 is the controller's evidence; its retries' 429s repeat it. The gateway flags
retries (``llm_calls.retry``) and the planner's window skips them, so that a call too big for
the provider's bucket at the moment, retried until it fits, does not cut every budget on each
retry (docs/bench-planner.md, seventeenth round).

A window in which the provider answered nothing and only retries drew 429s is different: the
pacer lets through more than the provider accepts. Providers count rejected requests against
the request limit (OpenAI documents it), so a few tasks retrying every 15 s keep a bucket of 5
requests a minute empty; no call gets a first 429 any more, so nothing new reaches the
controller, and a request budget far above the limit was never cut down to it: every call
was rejected for good (a livelock; docs/bench-planner.md, thirty-second round). Such a window
counts one 429 per limit type the retries named. The controller cuts a class at most once per
cooldown, so a run of such windows cuts as a run of 429s does.

Both the simulator's planner policy and the planner tick's read of the ledger
(``ledger.pacer_window.read_window``) use this rule. Pure.
"""

from __future__ import annotations

from collections.abc import Collection

from planner.classify import LimitType

__all__ = ["unanswered_retry_throttles"]


def unanswered_retry_throttles(
    retried: Collection[LimitType], *, first_429s: int, answered: int
) -> list[LimitType]:
    """The 429s a window counts from its retries' (``retried``: the limit types their 429s
    named): one per type where the provider answered nothing and no call's first 429 came in
    the window; none otherwise."""
    if answered > 0 or first_429s > 0:
        return []
    return sorted(set(retried), key=lambda t: t.value)
