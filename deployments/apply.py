"""`evalfleet deploy`: create evalfleet's work pools, queues, limits and deployments idempotently.

``prefect.yaml`` at the project root is the one description of what exists on Prefect; this
module reads it (strictly: an unknown key is an error naming it), loads each entrypoint to get
its parameter schema, and upserts everything against whatever Prefect API the client points at
(a local server or Prefect Cloud). Running it twice gives the same result: pools and queues are
read first and only updated where they differ, deployments are upserted by (flow, name), and the
restart-on-crash automations of the loop flows are replaced only if their definition changed.

The ECS pool's documented variables (cluster, image or task definition, cpu/memory, subnets,
security groups, IAM roles) can be given as a JSON/YAML file; they become the defaults of the
pool's base job template, validated here before anything is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalfleet.documents import load_document, validate
from evalfleet.errors import ConfigError
from evalfleet.settings import PROJECT_ROOT, Settings

PROJECT_DIR_PLACEHOLDER = "{{ $EVALFLEET_PROJECT_DIR }}"
TEMPLATES_DIR = Path(__file__).resolve().parent
LOOP_FLOWS = ("planner", "supervisor", "dispatcher")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class QueueSpec(_Strict):
    name: str = Field(min_length=1, max_length=64)
    priority: int = Field(ge=1, le=100)


class PoolSpec(_Strict):
    name: str = Field(min_length=1, max_length=64)
    type: Literal["process", "ecs"]
    base_job_template: str
    queues: list[QueueSpec]


class WorkPoolRef(_Strict):
    name: str
    work_queue_name: str


class ConcurrencySpec(_Strict):
    limit: int = Field(ge=1)
    collision_strategy: Literal["ENQUEUE", "CANCEL_NEW"]


class DeploymentSpec(_Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str = ""
    entrypoint: str = Field(pattern=r"^[\w/]+\.py:\w+$")
    work_pool: WorkPoolRef
    tags: list[str] = []
    concurrency_limit: ConcurrencySpec | None = None
    pull: list[dict[str, Any]] | None = None


class ProjectSpec(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    name: str
    prefect_version: str = Field(alias="prefect-version")
    build: None = None
    push: None = None
    pull: list[dict[str, Any]]
    pools: list[PoolSpec]
    deployments: list[DeploymentSpec]


class EcsVariables(_Strict):
    """The ECS pool's documented variables (see deployments/README.md)."""

    cluster: str = Field(min_length=1)
    image: str | None = Field(default=None, min_length=1)
    task_definition_arn: str | None = Field(default=None, pattern=r"^arn:aws[\w-]*:ecs:")
    cpu: int = Field(default=1024, ge=256, le=16_384)
    memory: int = Field(default=2048, ge=512, le=122_880)
    subnets: list[str] = Field(min_length=1)
    security_groups: list[str] = Field(min_length=1)
    assign_public_ip: Literal["ENABLED", "DISABLED"] = "DISABLED"
    task_role_arn: str | None = Field(default=None, pattern=r"^arn:aws[\w-]*:iam::")
    execution_role_arn: str | None = Field(default=None, pattern=r"^arn:aws[\w-]*:iam::")
    launch_type: Literal["FARGATE", "FARGATE_SPOT", "EC2"] = "FARGATE"

    @model_validator(mode="after")
    def _image_xor_task_definition(self) -> EcsVariables:
        if (self.image is None) == (self.task_definition_arn is None):
            raise ValueError("give exactly one of `image` and `task_definition_arn`")
        if self.image is not None and self.execution_role_arn is None:
            raise ValueError("`execution_role_arn` is required with `image` (ECS pulls the image)")
        return self


def load_project(path: Path = PROJECT_ROOT / "prefect.yaml") -> ProjectSpec:
    """Read and validate prefect.yaml, or raise ConfigError naming the bad fields."""
    spec = validate(ProjectSpec, load_document(path), source=str(path))
    pools = {p.name for p in spec.pools}
    problems = [
        f"deployments.{d.name}.work_pool.name: unknown pool {d.work_pool.name!r}"
        for d in spec.deployments
        if d.work_pool.name not in pools
    ]
    if problems:
        raise ConfigError(str(path), problems)
    return spec


def load_ecs_variables(path: Path) -> EcsVariables:
    """Read the ECS variables file, or raise ConfigError naming the bad fields."""
    return validate(EcsVariables, load_document(path), source=str(path))


def base_job_template(pool: PoolSpec, ecs: EcsVariables | None = None) -> dict[str, Any]:
    """The pool's base job template; for ECS with the given variables as defaults."""
    template_path = (PROJECT_ROOT / pool.base_job_template).resolve()
    if TEMPLATES_DIR not in template_path.parents:
        raise ConfigError("prefect.yaml", [f"pools.{pool.name}: template outside deployments/"])
    template: dict[str, Any] = json.loads(template_path.read_text())
    if pool.type == "ecs" and ecs is not None:
        props = template["variables"]["properties"]
        for key, value in ecs.model_dump(exclude_none=True).items():
            props[key]["default"] = value
    return template


def _pull_steps(spec: ProjectSpec, dep: DeploymentSpec, settings: Settings) -> list[dict[str, Any]]:
    steps = json.dumps(list(dep.pull if dep.pull is not None else spec.pull))
    return list(json.loads(steps.replace(PROJECT_DIR_PLACEHOLDER, str(settings.project_dir))))


@dataclass
class DeployReport:
    """What `evalfleet deploy` did: one (kind, name, action) line per object."""

    lines: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, kind: str, name: str, action: str) -> None:
        self.lines.append((kind, name, action))


async def apply_project(
    client: Any,
    spec: ProjectSpec,
    settings: Settings,
    ecs: EcsVariables | None = None,
) -> DeployReport:
    """Create or update every pool, queue, limit, deployment and automation of ``spec``."""
    report = DeployReport()
    for pool in spec.pools:
        await _apply_pool(client, pool, settings, ecs, report)
    for dep in spec.deployments:
        await _apply_deployment(client, spec, dep, settings, report)
    return report


def _pool_limit(pool: PoolSpec, settings: Settings) -> int:
    return settings.eval_concurrency_min if pool.name == settings.eval_pool else settings.static_cap


async def _apply_pool(
    client: Any,
    pool: PoolSpec,
    settings: Settings,
    ecs: EcsVariables | None,
    report: DeployReport,
) -> None:
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    template = base_job_template(pool, ecs)
    try:
        existing = await client.read_work_pool(pool.name)
    except ObjectNotFound:
        existing = None
    if existing is None:
        await client.create_work_pool(
            WorkPoolCreate(
                name=pool.name,
                type=pool.type,
                base_job_template=template,
                concurrency_limit=_pool_limit(pool, settings),
            )
        )
        report.add("work-pool", pool.name, "created")
    else:
        if existing.type != pool.type:
            raise ConfigError(
                "prefect.yaml",
                [
                    f"pools.{pool.name}: exists on Prefect with type {existing.type!r}, not {pool.type!r}"
                ],
            )
        update: dict[str, Any] = {}
        if existing.base_job_template != template:
            update["base_job_template"] = template
        # The eval pool's limit belongs to the supervisor's scaler once the pool exists.
        if pool.name != settings.eval_pool and existing.concurrency_limit != settings.static_cap:
            update["concurrency_limit"] = settings.static_cap
        if update:
            await client.update_work_pool(pool.name, WorkPoolUpdate(**update))
        report.add("work-pool", pool.name, "updated" if update else "unchanged")
    for queue in pool.queues:
        await _apply_queue(client, pool.name, queue, report)


async def _apply_queue(client: Any, pool: str, queue: QueueSpec, report: DeployReport) -> None:
    from prefect.exceptions import ObjectNotFound

    try:
        existing = await client.read_work_queue_by_name(queue.name, work_pool_name=pool)
    except ObjectNotFound:
        existing = None
    name = f"{pool}/{queue.name}"
    if existing is None:
        await client.create_work_queue(
            name=queue.name, priority=queue.priority, work_pool_name=pool
        )
        report.add("work-queue", name, "created")
    elif existing.priority != queue.priority:
        await client.update_work_queue(existing.id, priority=queue.priority)
        report.add("work-queue", name, "updated")
    else:
        report.add("work-queue", name, "unchanged")


async def _apply_deployment(
    client: Any,
    spec: ProjectSpec,
    dep: DeploymentSpec,
    settings: Settings,
    report: DeployReport,
) -> None:
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy, ConcurrencyOptions
    from prefect.exceptions import ObjectNotFound
    from prefect.flows import load_flow_from_entrypoint

    path, func = dep.entrypoint.split(":")
    flow: Any = load_flow_from_entrypoint(f"{PROJECT_ROOT / path}:{func}")
    flow_id = await client.create_flow_from_name(flow.name)
    full_name = f"{flow.name}/{dep.name}"
    try:
        before = await client.read_deployment_by_name(full_name)
    except ObjectNotFound:
        before = None
    limit = dep.concurrency_limit
    deployment_id = await client.create_deployment(
        flow_id=flow_id,
        name=dep.name,
        description=dep.description,
        entrypoint=dep.entrypoint,
        work_pool_name=dep.work_pool.name,
        work_queue_name=dep.work_pool.work_queue_name,
        tags=dep.tags,
        parameter_openapi_schema=flow.parameters.model_dump(),
        enforce_parameter_schema=True,
        pull_steps=_pull_steps(spec, dep, settings),
        concurrency_limit=limit.limit if limit else None,
        concurrency_options=(
            ConcurrencyOptions(
                collision_strategy=ConcurrencyLimitStrategy(limit.collision_strategy)
            )
            if limit
            else None
        ),
    )
    report.add("deployment", full_name, "created" if before is None else "upserted")
    if flow.name in LOOP_FLOWS:
        await _apply_restart_automation(client, full_name, deployment_id, report)


async def _apply_restart_automation(
    client: Any, deployment_name: str, deployment_id: Any, report: DeployReport
) -> None:
    """A crashed loop flow (planner, supervisor) is started again by a Prefect automation."""
    from prefect.events.actions import RunDeployment
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    name = f"evalfleet restart {deployment_name}"
    wanted = AutomationCore(
        name=name,
        description=f"Start {deployment_name} again when a run of it crashes.",
        trigger=EventTrigger(
            expect={"prefect.flow-run.Crashed"},
            match_related={"prefect.resource.id": f"prefect.deployment.{deployment_id}"},
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[RunDeployment(source="selected", deployment_id=deployment_id, parameters={})],
    )
    existing = await client.read_automations_by_name(name)
    if len(existing) == 1 and _shape(existing[0]) == _shape(wanted):
        report.add("automation", name, "unchanged")
        return
    for automation in existing:
        await client.delete_automation(automation.id)
    await client.create_automation(wanted)
    report.add("automation", name, "created" if not existing else "updated")


def _shape(automation: Any) -> dict[str, Any]:
    """What makes two automations the same, ignoring server-assigned ids."""
    return {
        "name": automation.name,
        "description": automation.description,
        "enabled": automation.enabled,
        "trigger": automation.trigger.model_dump(mode="json", exclude={"id"}),
        "actions": [a.model_dump(mode="json") for a in automation.actions],
    }
