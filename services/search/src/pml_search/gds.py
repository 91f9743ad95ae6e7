"""Yen's k-shortest paths with the Neo4j Graph Data Science plugin, when it is installed.

Seed 001 §5.1 and D3: paths between seed concepts come from `gds.shortestPath.yens` over the
tenant's semantic graph; without the plugin, `KnowledgeReads.cypher_paths` is the fallback.

- Detection: `SHOW PROCEDURES` names `gds.shortestPath.yens.stream` (checked again every
  `RECHECK_S`, so installing the plugin is noticed without restarting search).
- Projection: one in-memory graph per tenant and search replica (named from the replica and a
  hash of the tenant: a name is data, passed as a parameter), projected with a Cypher
  projection from the tenant's semantic relations, undirected, each with
  `cost = −ln(confidence)`: the cheapest path is then the one whose product of confidences is
  highest (§5.3's `path_confidence`). It is dropped and projected again when the tenant's
  relations change (`invalidate`, called on Pass 3 and deletion events).
- Query: `gds.shortestPath.yens.stream` from each seed of a pair to the other, k paths each;
  rows give the node ids of each path, mapped back to concept keys in the same query.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import structlog

from pml_search.knowledge_reads import RELATION_TYPES

log = structlog.get_logger(__name__)

YEN_PROCEDURE = "gds.shortestPath.yens.stream"
#: How often the plugin's presence is checked again.
RECHECK_S = 300.0
#: Floor of a relation's confidence in its cost (a confidence of 1 would cost 0).
MIN_COST = 1e-3

_HAS_PROCEDURE = """
SHOW PROCEDURES YIELD name
WHERE name = $name
RETURN count(*) AS found
"""

_DROP = """
CALL gds.graph.drop($graph, false) YIELD graphName
RETURN graphName
"""

_PROJECT = """
MATCH (a:CanonicalConcept {tenant_id: $tenant})-[r]->(b:CanonicalConcept {tenant_id: $tenant})
WHERE type(r) IN $types AND r.tenant_id = $tenant
WITH a, b, max(r.confidence) AS confidence
WITH gds.graph.project(
  $graph, a, b,
  {relationshipProperties: {cost: CASE WHEN confidence >= 1.0 THEN $min_cost
                                       ELSE -log(confidence) END}},
  {undirectedRelationshipTypes: ['*']}
) AS g
RETURN g.nodeCount AS nodes, g.relationshipCount AS relationships
"""

_YEN = """
UNWIND $pairs AS pair
MATCH (a:CanonicalConcept {tenant_id: $tenant, canonical_name: pair[0]})
MATCH (b:CanonicalConcept {tenant_id: $tenant, canonical_name: pair[1]})
CALL gds.shortestPath.yens.stream($graph, {
  sourceNode: a, targetNode: b, k: $k, relationshipWeightProperty: 'cost'
})
YIELD index, totalCost, nodeIds
RETURN pair[0] AS source, pair[1] AS target, index, totalCost,
       [n IN gds.util.asNodes(nodeIds) | n.canonical_name] AS nodes
"""

Reader = Callable[..., Awaitable[Sequence[Mapping[str, Any]]]]


def graph_name(replica: str, tenant: str) -> str:
    """The projection of `tenant` held for this search replica."""
    digest = hashlib.sha256(f"{replica}\x00{tenant}".encode()).hexdigest()[:24]
    return f"pml-semantic-{digest}"


def paths_of_rows(rows: Sequence[Mapping[str, Any]], max_hops: int) -> list[tuple[str, ...]]:
    """Node-key sequences of Yen's rows (pair by pair, `index` order), loops and paths longer
    than `max_hops` dropped."""
    ordered = sorted(rows, key=lambda r: (r["source"], r["target"], int(r["index"])))
    paths = []
    for row in ordered:
        nodes = tuple(str(n) for n in row["nodes"])
        if 2 <= len(nodes) <= max_hops + 1 and len(set(nodes)) == len(nodes):
            paths.append(nodes)
    return paths


class GdsPaths:
    """Yen's k-shortest paths through GDS, one projection per tenant, kept until invalidated."""

    def __init__(self, read: Reader, replica: str) -> None:
        self._read = read
        self._replica = replica
        self._checked_at = -RECHECK_S
        self._available = False
        # tenant -> whether its projection holds any relation (an empty one is not created)
        self._projected: dict[str, bool] = {}

    async def available(self) -> bool:
        now = time.monotonic()
        if now - self._checked_at >= RECHECK_S:
            rows = await self._read(_HAS_PROCEDURE, name=YEN_PROCEDURE)
            self._available = bool(rows) and int(rows[0]["found"]) > 0
            self._checked_at = now
            log.info("knowledge.gds_checked", available=self._available)
        return self._available

    def invalidate(self, tenant: str) -> None:
        """The tenant's relations changed: project again on its next question."""
        self._projected.pop(tenant, None)

    async def paths(
        self, tenant: str, pairs: Sequence[tuple[str, str]], k: int, max_hops: int
    ) -> list[tuple[str, ...]]:
        if not pairs:
            return []
        graph = graph_name(self._replica, tenant)
        if tenant not in self._projected:
            await self._project(tenant, graph)
        if not self._projected[tenant]:
            return []
        rows = await self._read(
            _YEN, tenant=tenant, graph=graph, pairs=[list(p) for p in pairs], k=k
        )
        return paths_of_rows(rows, max_hops)

    async def _project(self, tenant: str, graph: str) -> None:
        await self._read(_DROP, graph=graph)
        rows = await self._read(
            _PROJECT, tenant=tenant, graph=graph, types=RELATION_TYPES, min_cost=MIN_COST
        )
        relationships = int(rows[0]["relationships"] or 0) if rows else 0
        self._projected[tenant] = relationships > 0
        log.info("knowledge.gds_projected", graph=graph, relationships=relationships)
