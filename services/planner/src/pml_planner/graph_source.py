"""What the planner reads of a tenant's tool graph (Neo4j, written by the trainer only).

Nodes with their execution statistics, capabilities with their ordered members (`CONTAINS`),
and the learned `LINK`s with type, source and weight. The planner turns these into hyperedges;
it never writes the graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from neo4j import AsyncDriver

_NODES = """
CALL () {
  MATCH (n:Tool {tenant_id: $tenant}) RETURN n, 'tool' AS kind
  UNION
  MATCH (n:Capability {tenant_id: $tenant}) RETURN n, 'capability' AS kind
}
RETURN n.id AS id, kind, coalesce(n.executions, 0) AS executions,
       n.success_rate AS success_rate, n.last_used_at AS last_used_at
ORDER BY kind, id
"""

_MEMBERS = """
MATCH (c:Capability {tenant_id: $tenant})
OPTIONAL MATCH (c)-[r:CONTAINS]->(m)
WITH c, r, m ORDER BY r.position
RETURN c.id AS id, [x IN collect(m.id) WHERE x IS NOT NULL] AS members
ORDER BY id
"""

_LINKS = """
CALL () {
  MATCH (a:Tool {tenant_id: $tenant})-[r:LINK]->(b) RETURN a, r, b
  UNION
  MATCH (a:Capability {tenant_id: $tenant})-[r:LINK]->(b) RETURN a, r, b
}
RETURN a.id AS src, b.id AS dst, r.type AS type, r.source AS source,
       coalesce(r.count, 0) AS count, coalesce(r.weight, 0.0) AS weight,
       coalesce(r.origin, 'execution') AS origin, coalesce(r.factor, 1.0) AS factor
ORDER BY src, dst, type
"""


@dataclass(frozen=True)
class NodeInfo:
    id: str
    kind: str  # tool | capability
    executions: int
    success_rate: float | None  # None: never executed
    last_used_at: datetime | None


@dataclass(frozen=True)
class LinkInfo:
    src: str
    dst: str
    type: str  # dependency | contains | sequence
    source: str  # observed | inferred | template
    count: int
    weight: float
    #: Who created it: execution | template | similarity | same_server (a cold-start guess).
    origin: str = "execution"
    #: The cold-start guess's scale, folded into `weight` (1.0 once an execution observed it).
    factor: float = 1.0


@dataclass(frozen=True)
class PlannerGraph:
    tenant_id: str
    nodes: dict[str, NodeInfo]
    #: capability id -> its members (tools and capabilities) in declared order
    members: dict[str, tuple[str, ...]]
    links: tuple[LinkInfo, ...]

    @property
    def tools(self) -> list[str]:
        return [n.id for n in self.nodes.values() if n.kind == "tool"]

    @property
    def capabilities(self) -> list[str]:
        return [n.id for n in self.nodes.values() if n.kind == "capability"]


async def read_planner_graph(driver: AsyncDriver, database: str, tenant: str) -> PlannerGraph:
    nodes = await driver.execute_query(_NODES, tenant=tenant, database_=database)
    members = await driver.execute_query(_MEMBERS, tenant=tenant, database_=database)
    links = await driver.execute_query(_LINKS, tenant=tenant, database_=database)
    return PlannerGraph(
        tenant_id=tenant,
        nodes={
            r["id"]: NodeInfo(
                id=r["id"],
                kind=r["kind"],
                executions=int(r["executions"]),
                success_rate=r["success_rate"],
                last_used_at=_native(r["last_used_at"]),
            )
            for r in nodes.records
        },
        members={r["id"]: tuple(r["members"]) for r in members.records},
        links=tuple(
            LinkInfo(
                r["src"],
                r["dst"],
                r["type"],
                r["source"],
                int(r["count"]),
                r["weight"],
                r["origin"],
                float(r["factor"]),
            )
            for r in links.records
        ),
    )


def _native(value: object) -> datetime | None:
    """Neo4j temporal values to Python datetimes (None stays None)."""
    if value is None:
        return None
    to_native = getattr(value, "to_native", None)
    return to_native() if to_native is not None else value  # type: ignore[return-value]
