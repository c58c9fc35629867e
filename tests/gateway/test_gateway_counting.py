"""The gateway judges a storm's first token 429 at once, from what it sent since a reading
shortly before it (``gateway.send_log``): where the provider's bucket was emptied by more than
the uncached tokens sent, the provider counts cache reads, and the pacer charges them from that
429 on; the observation the planner reads carries the verdict."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import delete, select

from gateway.pacer_local import InProcessPacer
from gateway.provider_sim.profile import DEFAULT_PROFILE
from ledger.models import COMPLETE_BEFORE_KEY, THROTTLE_READING_KEY, AliasObservation
from ledger.throttle_reading import ThrottleReading
from tests.gateway.gw_helpers import Stack, sim_profile

HISTORY = "x" * 20_000  # 5,000 tokens


@pytest.mark.parametrize("provider_counts", [True, False])
def test_a_token_429_tells_the_gateway_at_once_whether_cache_reads_count(
    make_stack: Callable[..., Stack], provider_counts: bool
) -> None:
    """sim-anthropic's config says cache reads do not count; the provider's input limit is 60k
    tokens a minute. Calls that resend one 5k-token history and add a few tokens each empty a
    provider that counts the cache reads within a dozen calls (more on a loaded machine, as the
    bucket refills between slower calls), while the gateway sent a few
    uncached tokens a call: at its first 429 the pacer counts cache reads. Calls that each send
    a new 5k-token history empty one that does not count them as fast, with no cache reads to
    blame: the belief stands."""
    anthropic = {
        **DEFAULT_PROFILE["anthropic"],
        "rpm": 10_000.0,
        "input_tpm": 60_000.0,
        "cached_input_counts": provider_counts,
    }
    stack = make_stack(profile=sim_profile(anthropic=anthropic))
    with stack.engine.begin() as conn:  # the ledger is the session's: no earlier storm's 429
        conn.execute(delete(AliasObservation).where(AliasObservation.alias == "sim-anthropic"))
    secret = stack.new_run(alias="sim-anthropic").gateway_key.get_secret_value()
    pacer = stack.gateway.pacer
    assert isinstance(pacer, InProcessPacer)  # make_stack's default
    assert pacer.cached_input_counts("sim-anthropic") is False
    statuses = _storm(stack, secret, provider_counts)
    assert statuses[-1] == 429 and 8 <= len(statuses) <= 60, statuses
    assert pacer.cached_input_counts("sim-anthropic") is provider_counts
    reading, _ = _throttle_reading(stack)
    assert reading.limit_type == "input_tokens"
    assert reading.gateway_counts is provider_counts


def _storm(stack: Stack, secret: str, provider_counts: bool) -> list[int]:
    """Calls until the first 429 (at most 60); their statuses."""
    statuses: list[int] = []
    for k in range(60):
        if provider_counts:
            messages = [
                {"role": "user", "content": HISTORY},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": f"step {k}"},
            ]
        else:
            messages = [{"role": "user", "content": f"{k} {HISTORY}"}]
        r = httpx.post(
            stack.url + "/v1/messages",
            headers={"authorization": f"Bearer {secret}"},
            json={"model": "sim-anthropic", "max_tokens": 5, "messages": messages},
            timeout=10,
        )
        statuses.append(r.status_code)
        if r.status_code == 429:
            break
    return statuses


def _throttle_reading(stack: Stack) -> tuple[ThrottleReading, dict[str, object]]:
    """The 429's reading in the alias's observation, and its ``limits``, once written (the
    recorder flushes on the gateway's own loop, every quarter second)."""
    deadline = time.monotonic() + 10.0
    while True:
        with stack.engine.connect() as conn:
            limits = conn.execute(
                select(AliasObservation.limits).where(AliasObservation.alias == "sim-anthropic")
            ).scalar_one_or_none()
        reading = (
            None if limits is None else ThrottleReading.from_json(limits.get(THROTTLE_READING_KEY))
        )
        if reading is not None:
            assert isinstance(limits, dict)
            return reading, limits
        assert time.monotonic() < deadline, "the 429's reading was never written"
        time.sleep(0.05)


def test_a_replica_sharing_the_alias_leaves_the_judgement_to_the_planner(
    make_stack: Callable[..., Stack],
) -> None:
    """The same storm on a provider that counts cache reads, through a gateway that paces at
    half the alias's budgets (another replica serves it: ``gateway.replica_sync``). The bucket
    it sees emptied was emptied by both, so what it sent alone says nothing: the pacer keeps
    its belief, the observation carries no verdict, and the gateway does not vouch that every
    call before a time is recorded (the other replica's may not be); the planner judges from
    every replica's rows."""
    anthropic = {
        **DEFAULT_PROFILE["anthropic"],
        "rpm": 10_000.0,
        "input_tpm": 60_000.0,
        "cached_input_counts": True,
    }
    stack = make_stack(profile=sim_profile(anthropic=anthropic))
    with stack.engine.begin() as conn:
        conn.execute(delete(AliasObservation).where(AliasObservation.alias == "sim-anthropic"))
    secret = stack.new_run(alias="sim-anthropic").gateway_key.get_secret_value()
    pacer = stack.gateway.pacer
    assert isinstance(pacer, InProcessPacer)
    pacer.set_share("sim-anthropic", 0.5)
    statuses = _storm(stack, secret, provider_counts=True)
    assert statuses[-1] == 429, statuses
    assert pacer.cached_input_counts("sim-anthropic") is False
    reading, limits = _throttle_reading(stack)
    assert reading.limit_type == "input_tokens"
    assert reading.gateway_counts is False
    assert COMPLETE_BEFORE_KEY not in limits


def test_the_gateways_own_verdict_holds_until_the_planner_can_have_adopted_it() -> None:
    from gateway.aliases import load_aliases
    from gateway.pacer_local import VERDICT_HOLD_S

    now = [1000.0]
    aliases = load_aliases(None, provider_sim_url="http://127.0.0.1:9")
    pacer = InProcessPacer(aliases, clock=lambda: now[0])
    assert not pacer.holds_own_verdict("sim-anthropic")
    pacer.recount("sim-anthropic", True)
    assert pacer.cached_input_counts("sim-anthropic") is True
    assert pacer.holds_own_verdict("sim-anthropic")
    assert not pacer.holds_own_verdict("sim-openai")
    now[0] += VERDICT_HOLD_S
    assert not pacer.holds_own_verdict("sim-anthropic")
