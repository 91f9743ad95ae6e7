"""The planner's event handlers on the suite's real Redis and Neo4j."""

from __future__ import annotations

import neo4j
from redis.asyncio import Redis

from pml_common.events import ExecutionCompleted, ExecutionStep, TenantDeleted
from pml_common.settings import Settings
from pml_planner.consumers import PlannerConsumers
from pml_planner.outcomes import SuggestionMemory
from pml_planner.tenants import TenantPlanners
from pml_planner.thresholds import RedisThresholdStore


async def test_a_deleted_tenant_takes_its_thresholds_and_suggestions_along(
    redis: Redis, graph_db: neo4j.AsyncDriver, settings: Settings, tenant: str
) -> None:
    thresholds = RedisThresholdStore(redis)
    memory = SuggestionMemory(redis, thresholds)
    consumers = PlannerConsumers(TenantPlanners(graph_db, settings.neo4j_database), memory)
    other = f"{tenant}-other"
    for who in (tenant, other):
        await memory.remember(who, "ship it", "next", "drdsp:next", 0.8, ["s:a"])
        await memory.remember(who, "deploy", "dag", "drdsp:dag", 0.7, ["s:a", "s:b"])
    # one suggestion followed, so the tenant has a learned threshold too
    await consumers.on_execution_completed(
        ExecutionCompleted.create(
            tenant_id=tenant,
            intent="ship it",
            steps=[ExecutionStep(node_id="s:a", success=False)],
            outcome="failure",
        )
    )
    assert await thresholds.all_contexts(tenant)

    await consumers.on_tenant_deleted(TenantDeleted.create(tenant_id=tenant))

    assert await thresholds.all_contexts(tenant) == {}
    assert await redis.exists(f"pml:planner:suggestions:{tenant}") == 0
    assert await redis.exists(f"pml:planner:suggestions:{other}") == 1
