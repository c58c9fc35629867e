"""`evalfleet deploy` against a real Prefect server, and the ECS job template rendering."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from deployments.apply import (
    DeployReport,
    EcsVariables,
    apply_project,
    base_job_template,
    load_ecs_variables,
    load_project,
)
from evalfleet.errors import ConfigError
from evalfleet.settings import load_settings

ECS_VARS = {
    "cluster": "evalfleet",
    "image": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/evalfleet:1.0",
    "cpu": 2048,
    "memory": 4096,
    "subnets": ["subnet-aaa", "subnet-bbb"],
    "security_groups": ["sg-123"],
    "task_role_arn": "arn:aws:iam::123456789012:role/evalfleet-task",
    "execution_role_arn": "arn:aws:iam::123456789012:role/evalfleet-exec",
}


def _state(client: Any) -> Coroutine[Any, Any, dict[str, Any]]:
    async def read() -> dict[str, Any]:
        pools = {p.name: p for p in await client.read_work_pools()}
        out: dict[str, Any] = {}
        for name in ("evalfleet-harness", "evalfleet-ecs", "evalfleet-eval"):
            pool = pools[name]
            queues = await client.read_work_queues(work_pool_name=name)
            out[name] = {
                "type": pool.type,
                "limit": pool.concurrency_limit,
                "template": pool.base_job_template,
                "queues": sorted((q.name, q.priority) for q in queues),
            }
        deps = await client.read_deployments()
        out["deployments"] = sorted(
            (
                d.id,
                d.name,
                d.entrypoint,
                d.work_pool_name,
                d.work_queue_name,
                d.global_concurrency_limit.limit if d.global_concurrency_limit else None,
                json.dumps(d.pull_steps, sort_keys=True),
            )
            for d in deps
        )
        autos = await client.read_automations()
        out["automations"] = sorted((a.id, a.name) for a in autos if a.name.startswith("evalfleet"))
        return out

    return read()


@pytest.mark.prefect
def test_deploy_twice_gives_the_same_result(prefect_api_url: str, tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client

    spec = load_project()
    settings = load_settings(static_cap=40, eval_concurrency_min=2, project_dir=tmp_path)
    ecs = EcsVariables.model_validate(ECS_VARS)

    async def go() -> tuple[DeployReport, dict[str, Any], DeployReport, dict[str, Any]]:
        from prefect.exceptions import ObjectNotFound

        async with get_client() as client:
            # The session server is shared: earlier tests (the e2e deploy, the eval scaler) may
            # have made the project's pools. Start without them, so the first deploy creates
            # them whatever ran before.
            for pool in spec.pools:
                with contextlib.suppress(ObjectNotFound):
                    await client.delete_work_pool(pool.name)
            first = await apply_project(client, spec, settings, ecs)
            state1 = await _state(client)
            second = await apply_project(client, spec, settings, ecs)
            state2 = await _state(client)
            return first, state1, second, state2

    first, state1, second, state2 = asyncio.run(go())
    assert state1 == state2
    assert {a for _, _, a in second.lines} <= {"unchanged", "upserted"}
    assert {("work-pool", pool.name, "created") for pool in spec.pools} <= set(first.lines)
    assert ("work-pool", "evalfleet-ecs", "created") in first.lines
    assert state1["evalfleet-harness"]["limit"] == 40
    assert state1["evalfleet-eval"]["limit"] == 2
    assert state1["evalfleet-ecs"]["type"] == "ecs"
    assert ("instances", 2) in state1["evalfleet-harness"]["queues"]
    names = {(d[1], d[3]) for d in state1["deployments"]}
    assert {
        ("process", "evalfleet-harness"),
        ("ecs", "evalfleet-ecs"),
        ("eval", "evalfleet-eval"),
    } <= names
    planner = [d for d in state1["deployments"] if d[2] == "flows/planner_loop.py:planner_loop"]
    assert planner and planner[0][5] == 1
    process = next(d for d in state1["deployments"] if d[1] == "process")
    assert str(tmp_path) in process[6]
    ecs_dep = next(d for d in state1["deployments"] if d[1] == "ecs")
    assert "/opt/evalfleet" in ecs_dep[6]
    assert len(state1["automations"]) == 3
    props = state1["evalfleet-ecs"]["template"]["variables"]["properties"]
    assert props["subnets"]["default"] == ["subnet-aaa", "subnet-bbb"]


@pytest.mark.prefect
def test_ecs_template_renders_with_the_documented_variables(prefect_api_url: str) -> None:
    from prefect_aws.workers.ecs_worker import ECSJobConfiguration

    spec = load_project()
    pool = next(p for p in spec.pools if p.type == "ecs")
    template = base_job_template(pool, EcsVariables.model_validate(ECS_VARS))
    config: ECSJobConfiguration = asyncio.run(
        ECSJobConfiguration.from_template_and_values(template, {})
    )
    request = config.task_run_request
    assert request["cluster"] == "evalfleet"
    assert request["launchType"] == "FARGATE"
    assert request["networkConfiguration"]["awsvpcConfiguration"] == {
        "subnets": ["subnet-aaa", "subnet-bbb"],
        "securityGroups": ["sg-123"],
        "assignPublicIp": "DISABLED",
    }
    assert request["overrides"]["taskRoleArn"] == ECS_VARS["task_role_arn"]
    assert config.task_definition["executionRoleArn"] == ECS_VARS["execution_role_arn"]
    assert config.task_definition["containerDefinitions"][0]["image"] == ECS_VARS["image"]
    assert config.task_definition["cpu"] == "2048" or config.task_definition["cpu"] == 2048
    assert str(config.task_definition["memory"]) == "4096"
    assert config.env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30"
    # a task definition ARN instead of an image; values given per deployment override defaults
    by_arn = {**ECS_VARS, "task_definition_arn": "arn:aws:ecs:eu-west-1:1:task-definition/ef:3"}
    del by_arn["image"]
    template = base_job_template(pool, EcsVariables.model_validate(by_arn))
    config = asyncio.run(
        ECSJobConfiguration.from_template_and_values(template, {"subnets": ["subnet-ccc"]})
    )
    assert config.task_run_request["taskDefinition"].endswith("task-definition/ef:3")
    assert config.task_run_request["networkConfiguration"]["awsvpcConfiguration"]["subnets"] == [
        "subnet-ccc"
    ]


def test_ecs_variables_are_checked(tmp_path: Path) -> None:
    both = {**ECS_VARS, "task_definition_arn": "arn:aws:ecs:eu-west-1:1:task-definition/ef:3"}
    path = tmp_path / "ecs.json"
    path.write_text(json.dumps(both))
    with pytest.raises(ConfigError, match="exactly one of `image` and `task_definition_arn`"):
        load_ecs_variables(path)
    path.write_text(json.dumps({**ECS_VARS, "subnets": [], "cpu": 1}))
    with pytest.raises(ConfigError) as info:
        load_ecs_variables(path)
    assert "subnets" in str(info.value) and "cpu" in str(info.value)
