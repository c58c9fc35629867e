"""The eval-fleet scaler: the eval pool's Prefect concurrency follows its queue, within bounds."""

from __future__ import annotations

import contextlib

import pytest

from planner.eval_scaler import eval_pool_target


def test_target_follows_the_queue_within_bounds() -> None:
    assert eval_pool_target(0, 4, 1, 16) == 1
    assert eval_pool_target(9, 4, 1, 16) == 3
    assert eval_pool_target(1_000, 4, 1, 16) == 16
    with pytest.raises(ValueError):
        eval_pool_target(1, 0, 1, 16)


@pytest.mark.prefect
def test_scaler_raises_and_lowers_the_eval_pool_limit(prefect_api_url: str) -> None:
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    from evalfleet.settings import get_settings
    from tasks.supervise import scale_eval_pool

    pool = get_settings().eval_pool
    with get_client(sync_client=True) as client:
        with contextlib.suppress(ObjectAlreadyExists):
            client.create_work_pool(WorkPoolCreate(name=pool, type="process", concurrency_limit=1))
        assert scale_eval_pool(40) == 10
        assert client.read_work_pool(pool).concurrency_limit == 10
        assert scale_eval_pool(10_000) == get_settings().eval_concurrency_max
        assert client.read_work_pool(pool).concurrency_limit == get_settings().eval_concurrency_max
        assert scale_eval_pool(0) == get_settings().eval_concurrency_min
        assert client.read_work_pool(pool).concurrency_limit == get_settings().eval_concurrency_min
