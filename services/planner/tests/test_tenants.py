"""Each tenant's planner in memory, within the node budget, on the suite's real Neo4j."""

from __future__ import annotations

import asyncio

import neo4j

from pml_common.settings import Settings
from pml_planner.graph_source import read_planner_graph
from pml_planner.planning import TenantPlanner
from pml_planner.tenants import TenantPlanners

_SEED = """
CREATE (a:Tool {tenant_id: $tenant, id: 's:a'})
CREATE (b:Tool {tenant_id: $tenant, id: 's:b'})
CREATE (c:Capability {tenant_id: $tenant, id: 'cap'})
CREATE (c)-[:CONTAINS {position: 0}]->(a)
CREATE (c)-[:CONTAINS {position: 1}]->(b)
"""


async def test_planners_keep_their_node_budget_and_empty_tenants_are_not_kept(
    graph_db: neo4j.AsyncDriver, settings: Settings, tenant: str
) -> None:
    first, second = f"{tenant}-a", f"{tenant}-b"
    for name in (first, second):
        await graph_db.execute_query(_SEED, tenant=name)
    planners = TenantPlanners(graph_db, settings.neo4j_database, max_nodes=4)

    kept = await planners.get(first)
    assert await planners.get(first) is kept  # loaded once
    await planners.get(second)  # 6 nodes > 4: the least recently used tenant goes
    again = await planners.get(first)
    assert again is not kept and sorted(again.graph.nodes) == ["cap", "s:a", "s:b"]

    empty = f"{tenant}-none"
    assert not (await planners.get(empty)).graph.nodes
    assert await planners.get(empty) is not await planners.get(empty)  # answered, not kept
    assert await planners.get(first) is again
    assert len(planners._locks) == 0  # a lock lives while someone holds or awaits it


async def test_a_change_during_a_load_is_applied_once_the_load_is_done(
    graph_db: neo4j.AsyncDriver, settings: Settings, tenant: str
) -> None:
    await graph_db.execute_query("CREATE (:Tool {tenant_id: $tenant, id: 's:a'})", tenant=tenant)
    planners = TenantPlanners(graph_db, settings.neo4j_database)
    lock = planners._lock(tenant)
    await lock.acquire()  # a first request is loading the tenant, from a read without `cap`
    stale = await read_planner_graph(graph_db, settings.neo4j_database, tenant)
    await graph_db.execute_query(_SEED.replace("CREATE (a:Tool", "MERGE (a:Tool"), tenant=tenant)
    changed = asyncio.create_task(planners.refresh(tenant))  # the trainer's GraphChanged
    await asyncio.sleep(0.1)
    assert not changed.done()  # it waits for the load instead of dropping the change
    planners._planners.put(tenant, TenantPlanner.build(stale))
    lock.release()
    await changed
    assert "cap" in (await planners.get(tenant)).graph.nodes
