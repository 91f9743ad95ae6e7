"""The planner's read of the trainer's graph, on the suite's real Neo4j."""

from __future__ import annotations

from datetime import UTC, datetime

from pml_common.settings import Settings
from pml_common.stores import neo4j_driver
from pml_planner.graph_source import read_planner_graph

_SEED = """
CREATE (a:Tool {tenant_id: $tenant, id: 's:a', executions: 4, success_rate: 0.75,
                last_used_at: datetime('2026-11-20T10:00:00Z')})
CREATE (b:Tool {tenant_id: $tenant, id: 's:b'})
CREATE (c:Capability {tenant_id: $tenant, id: 'cap', executions: 2, success_rate: 1.0})
CREATE (c)-[:CONTAINS {position: 1}]->(a)
CREATE (c)-[:CONTAINS {position: 0}]->(b)
CREATE (b)-[:LINK {type: 'sequence', source: 'observed', count: 3, weight: 0.5}]->(a)
CREATE (c)-[:LINK {type: 'contains', source: 'inferred', count: 1, weight: 0.56}]->(a)
CREATE (:Tool {tenant_id: $other, id: 's:z'})
"""


async def test_reads_nodes_members_and_links_of_one_tenant(settings: Settings, tenant: str) -> None:
    driver = neo4j_driver(settings)
    try:
        await driver.execute_query(_SEED, tenant=tenant, other=f"{tenant}-x")
        graph = await read_planner_graph(driver, settings.neo4j_database, tenant)
    finally:
        await driver.close()
    assert sorted(graph.tools) == ["s:a", "s:b"] and graph.capabilities == ["cap"]
    a = graph.nodes["s:a"]
    assert (a.executions, a.success_rate) == (4, 0.75)
    assert a.last_used_at == datetime(2026, 11, 20, 10, tzinfo=UTC)
    assert graph.nodes["s:b"].success_rate is None and graph.nodes["s:b"].last_used_at is None
    assert graph.members == {"cap": ("s:b", "s:a")}
    assert [(link.src, link.dst, link.type, link.source) for link in graph.links] == [
        ("cap", "s:a", "contains", "inferred"),
        ("s:b", "s:a", "sequence", "observed"),
    ]
