"""What each provider answer teaches the alias's pacer, at once rather than at the planner's tick.

The planner re-sizes budgets every 15 s from ``llm_calls`` and ``alias_observations``; within
that window the gateway's pacer must not keep sending into a bucket the provider has just said
is empty. This module owns that per-call reaction, apart from the call path (``gateway.app``)
so the forwarding loop only sequences: send, read the answer, let this module teach the pacer,
retry or return.

- A success's rate-limit headers: the pacer holds no more of a bucket than the provider states
  is left (a limit that dropped, or other users of the key, show here first), and the send log
  keeps the counted bucket's reading for judging a later token 429.
- A rejection (429/529/503, already classified by ``planner.classify``):
  - a call's first 429 cuts the budget of only the limit it names (``planner.provisional_cut``);
    a retry's 429 repeats its first one's evidence and cuts nothing more;
  - the stated remaining of every bucket is mirrored, so retries do not storm it;
  - a bucket the 429 says nothing of is held (``planner.pacer_holds`` decides which);
  - a token 429 is judged against what was sent since a reading shortly before it: where the
    bucket emptied by more than the uncached tokens sent, the provider counts cache reads and
    the pacer starts counting them (``planner.cache_counting``). Only a gateway that is the
    alias's only one judges so: where replicas share the alias (``gateway.replica_sync``), the
    others' sends drained the bucket too, and a replica that knows only its own would read them
    as cache reads counted. The planner's tick judges the same 429 from every replica's rows.
- Where replicas share the alias, a call's first 429 is also news for the others
  (``on_first_429``: ``gateway.replica_sync`` posts it), and another replica's is applied here
  as one of this gateway's own would be (``peer_rejected``): the cut, the mirror, the hold.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx

from gateway.calls import Call
from gateway.pacer_local import token_class
from gateway.pacing import Pacer
from gateway.send_log import SendLog
from planner.cache_counting import infer_cached_input_counts
from planner.classify import Classification, LimitType, parse_rate_limit_headers

log = logging.getLogger(__name__)


class ProviderFeedback:
    """Turns provider answers into pacer updates for the aliases one gateway serves."""

    def __init__(
        self,
        pacer: Pacer,
        sends: SendLog,
        clock: Callable[[], float],
        alone: Callable[[str], bool] = lambda _alias: True,
    ) -> None:
        self.pacer = pacer
        self.sends = sends
        self._clock = clock
        self._alone = alone  # whether this gateway sends everything the alias's buckets see
        # told of every call's first 429 of a per-minute or per-day limit (the replicas' post)
        self.on_first_429: Callable[[str, Classification], None] = lambda _alias, _view: None

    def served(self, call: Call, upstream: httpx.Response, sent_at: float) -> None:
        """A 200: mirror the buckets its headers state, and keep the reading in the send log."""
        now = self._clock()
        stated = parse_rate_limit_headers(upstream.headers, now_epoch=now)
        if stated.remaining:
            self.pacer.observe_remaining(call.alias.name, stated.remaining)
            self.sends.read(
                call.alias.name,
                now,
                sent_at,
                stated.limits,
                stated.remaining,
                token_class(call.alias),
            )

    def judge_counting(self, call: Call, verdict: Classification, sent_at: float) -> bool:
        """A token 429 against what was sent since a reading shortly before it
        (``gateway.send_log``): where it says the provider counts the cache reads the pacer
        does not charge, the pacer counts them at once (the planner adopts the verdict, which
        the observation carries, at its next tick). True when it flipped the pacer.

        Called before ``rejected`` so the call's ``alias_observations`` row can carry it."""
        alias = call.alias.name
        if verdict.limit_type not in (LimitType.TOKENS, LimitType.INPUT_TOKENS):
            return False
        if self.pacer.cached_input_counts(alias) or not self._alone(alias):
            return False
        window = self.sends.window_at(
            alias, sent_at, verdict.limits, verdict.remaining, token_class(call.alias)
        )
        if window is None:
            return False
        if not infer_cached_input_counts([window], believed=False):
            return False
        self.pacer.recount(alias, True)
        log.warning(
            "alias %s: a token 429 found the provider's bucket emptied by more than the uncached "
            "tokens sent since its last reading: it counts cache reads; pacing so",
            alias,
        )
        return True

    def rejected(self, call: Call, verdict: Classification) -> None:
        """A 429/529/503: cut, mirror and hold as the verdict says."""
        alias = call.alias.name
        first = verdict.status == 429 and not call.retry
        self._apply(alias, verdict, first=first)
        if first and (verdict.is_throttle or verdict.limit_type is LimitType.DAILY):
            self.on_first_429(alias, verdict)

    def peer_rejected(self, alias: str, verdict: Classification, age_s: float) -> None:
        """Another replica's first 429 on the alias, ``age_s`` old: its bucket is this one's
        too, and the hold ends when the other replica's does (else this one, hearing late,
        would still hold when the other, free again, draws the next 429, and hold again)."""
        self._apply(alias, verdict, first=verdict.status == 429, elapsed_s=age_s)

    def _apply(
        self, alias: str, verdict: Classification, *, first: bool, elapsed_s: float = 0.0
    ) -> None:
        if first:
            # a call's first 429: cut what it hit at once, not at the planner's next tick
            # (planner.provisional_cut); a retry's repeats its first one's evidence
            self.pacer.cut_at_429(alias, verdict)
        if verdict.remaining:
            # the provider's bucket is emptier than the pacer's: retries must not storm it
            self.pacer.observe_remaining(alias, verdict.remaining)
        # and a bucket it says nothing of is empty: hold it (planner.pacer.classes_to_hold
        # decides which, none for spend or overload; a per-day limit's 429 holds them all)
        self.pacer.hold(alias, verdict, elapsed_s=elapsed_s)


__all__ = ["ProviderFeedback"]
