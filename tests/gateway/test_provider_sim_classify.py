"""The simulated provider's refusals classify correctly through the planner's classifier."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from gateway.provider_sim.server import ProviderSim
from gateway.serving import ServerThread
from planner.classify import LimitType, classify
from tests.gateway.gw_helpers import ADMIN_KEY, sim_profile


def _flavour(profile_overrides: dict[str, Any], flavour: str, **limits: float) -> Any:
    base = sim_profile().model_dump()
    base[flavour] = {**base[flavour], **limits}
    base.update(profile_overrides)
    return sim_profile(**base)


def _call(
    url: str, flavour: str, key: str, content: str = "hello", max_tokens: int = 10
) -> httpx.Response:
    if flavour == "openai":
        return httpx.post(
            url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            json={
                "model": "m",
                "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens,
            },
            timeout=5,
        )
    return httpx.post(
        url + "/v1/messages",
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        json={
            "model": "m",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
        },
        timeout=5,
    )


def _first_refusal(
    profile: Any, flavour: str, calls: list[tuple[str, int]], cap: int = 10**12
) -> httpx.Response:
    sim = ProviderSim(profile, ADMIN_KEY)
    key = sim.mint("t", cap, None)
    with ServerThread(sim.app) as url:
        for content, max_tokens in calls:
            r = _call(url, flavour, key, content, max_tokens)
            if r.status_code != 200:
                return r
    pytest.fail("no refusal")


@pytest.mark.parametrize(
    ("flavour", "limits", "calls", "expected"),
    [
        ("openai", {"rpm": 2.0}, [("a", 5)] * 3, LimitType.REQUESTS),
        ("openai", {"tpm": 1000.0}, [("a", 600)] * 2, LimitType.TOKENS),
        (
            "anthropic",
            {"input_tpm": 1000.0},
            [("x" * 2400, 5), ("y" * 2400, 5)],
            LimitType.INPUT_TOKENS,
        ),
        ("anthropic", {"output_tpm": 1000.0}, [("a", 600), ("b", 600)], LimitType.OUTPUT_TOKENS),
        ("anthropic", {"rpm": 1.0}, [("a", 5)] * 2, LimitType.REQUESTS),
    ],
)
def test_rate_limit_429s_classify_per_limit_type(
    flavour: str, limits: dict[str, float], calls: list[tuple[str, int]], expected: LimitType
) -> None:
    profile = _flavour({"output_fraction_min": 1.0, "output_fraction_max": 1.0}, flavour, **limits)
    r = _first_refusal(profile, flavour, calls)
    assert r.status_code == 429
    verdict = classify(r.status_code, r.headers, r.content, now_epoch=time.time())
    assert verdict.limit_type is expected
    assert verdict.provider == flavour
    assert verdict.retry_after_s is not None and verdict.retry_after_s > 0
    # The headers state the configured per-minute limits.
    for cls, value in limits.items():
        stated = {
            "rpm": LimitType.REQUESTS,
            "tpm": LimitType.TOKENS,
            "input_tpm": LimitType.INPUT_TOKENS,
            "output_tpm": LimitType.OUTPUT_TOKENS,
        }[cls]
        assert verdict.limits[stated] == value


@pytest.mark.parametrize("flavour", ["openai", "anthropic"])
def test_spend_cap_of_a_provider_key_classifies_as_spend(flavour: str) -> None:
    r = _first_refusal(sim_profile(), flavour, [("a", 5)] * 2, cap=1)
    verdict = classify(r.status_code, r.headers, r.content, now_epoch=time.time())
    assert verdict.limit_type is LimitType.SPEND


@pytest.mark.parametrize(("flavour", "status"), [("openai", 503), ("anthropic", 529)])
def test_overload_classifies_as_overload(flavour: str, status: int) -> None:
    r = _first_refusal(sim_profile(overload_rate=1.0), flavour, [("a", 5)])
    assert r.status_code == status
    verdict = classify(r.status_code, r.headers, r.content, now_epoch=time.time())
    assert verdict.limit_type is LimitType.OVERLOAD


def test_success_headers_state_limits_and_remaining() -> None:
    sim = ProviderSim(sim_profile(), ADMIN_KEY)
    key = sim.mint("t", 10**9, None)
    with ServerThread(sim.app) as url:
        r = _call(url, "anthropic", key, "hello", 10)
    assert r.status_code == 200
    verdict = classify(200, r.headers, r.content, now_epoch=time.time())
    assert verdict.limit_type is LimitType.NONE
    assert verdict.limits[LimitType.REQUESTS] == 600
    assert verdict.remaining[LimitType.REQUESTS] == 599
    assert verdict.limits[LimitType.INPUT_TOKENS] == 1_200_000


def test_unknown_and_revoked_keys_are_refused_401() -> None:
    sim = ProviderSim(sim_profile(), ADMIN_KEY)
    with ServerThread(sim.app) as url:
        admin = {"authorization": f"Bearer {ADMIN_KEY.get_secret_value()}"}
        created = httpx.post(
            url + "/admin/keys", headers=admin, json={"spend_cap_micro_usd": 100}, timeout=5
        )
        assert created.status_code == 201
        key = created.json()["key"]
        assert _call(url, "openai", key).status_code == 200
        assert (
            httpx.delete(
                url + f"/admin/keys/{created.json()['id']}", headers=admin, timeout=5
            ).status_code
            == 200
        )
        assert _call(url, "openai", key).status_code == 401
        assert _call(url, "openai", "sk-sim-unknown").status_code == 401
        assert (
            httpx.post(url + "/admin/keys", json={"spend_cap_micro_usd": 1}, timeout=5).status_code
            == 401
        )
        bad = httpx.post(
            url + "/admin/keys", headers=admin, json={"spend_cap_micro_usd": -1}, timeout=5
        )
        assert bad.status_code == 400 and "spend_cap_micro_usd" in bad.json()["error"]["message"]
