"""Yen's k-shortest paths and Personalized PageRank with the Neo4j Graph Data Science plugin,
when it is installed.

Seed 001 §5.1 and D3: paths between seed concepts come from `gds.shortestPath.yens` over the
tenant's semantic graph; without the plugin, `KnowledgeReads.cypher_paths` is the fallback.

- Detection: `SHOW PROCEDURES` names `gds.shortestPath.yens.stream` (checked again every
  `RECHECK_S`, so installing the plugin is noticed without restarting search).
- Projection: one in-memory graph per tenant and search replica (named from the replica and a
  hash of the tenant: a name is data, passed as a parameter), projected with a Cypher
  projection from the tenant's semantic relations of at least `min_confidence`
  (`PML_KNOWLEDGE_MIN_CONFIDENCE`, seed §5.3), undirected, each with
  `cost = −ln(confidence)`: the cheapest path is then the one whose product of confidences is
  highest (§5.3's `path_confidence`). It is dropped and projected again when the tenant's
  relations change (`invalidate`, called on Pass 3 and deletion events).
- Query: `gds.shortestPath.yens.stream` from each seed of a pair to the other, k paths each;
  rows give the node ids of each path, mapped back to concept keys in the same query.

`GdsPageRank` is the plugin's side of `pml_search.propagation` (method `graph-ppr`): a second
projection per tenant and replica, the concept ↔ section graph with the edge weights of
`propagation` (mentions by salience, topics over their sections, `COVERS`, a concept and the
topic of its key, evidenced relations) as the undirected type `LINK`, and the title routes (a
concept to the document it names, `NameIndex.title_links`) as the one-way type `NAMES`; then
`gds.pageRank.stream` with
`sourceNodes` as [node, weight] pairs (each seed's specificity, shared between its concept and
its topic) and the damping of `propagation`; the best sections are mapped back to context ids
in the same query. It is dropped and projected again when the tenant's graph changes (any pass
or deletion event, see `knowledge_consumers`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import structlog

from pml_search import propagation
from pml_search.knowledge_reads import MIN_CONFIDENCE, RELATION_TYPES

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
WHERE type(r) IN $types AND r.tenant_id = $tenant AND r.confidence >= $min_confidence
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

PAGERANK_PROCEDURE = "gds.pageRank.stream"

# The propagation graph of a tenant (see `pml_search.propagation` for the weights).
_PROJECT_PROPAGATION = """
CALL () {
  MATCH (c:CanonicalConcept {tenant_id: $tenant})-[m:MENTIONED_IN]->
        (s:SectionContext {tenant_id: $tenant})
  RETURN c AS a, s AS b, coalesce(m.salience, 0.0) AS weight, 'LINK' AS type
  UNION ALL
  MATCH (s:SectionContext {tenant_id: $tenant})
  UNWIND coalesce(s.topic_ids, []) AS topic_id
  MATCH (t:Topic {tenant_id: $tenant, topic_id: topic_id})
  RETURN t AS a, s AS b, $topic_section AS weight, 'LINK' AS type
  UNION ALL
  MATCH (t:Topic {tenant_id: $tenant})-[r:COVERS]->(c:CanonicalConcept {tenant_id: $tenant})
  RETURN t AS a, c AS b, $covers_share * coalesce(r.confidence, 1.0) AS weight, 'LINK' AS type
  UNION ALL
  MATCH (t:Topic {tenant_id: $tenant})
  MATCH (c:CanonicalConcept {tenant_id: $tenant, canonical_name: t.topic_id})
  RETURN c AS a, t AS b, $same_key AS weight, 'LINK' AS type
  UNION ALL
  MATCH (x:CanonicalConcept {tenant_id: $tenant})-[r]->(y:CanonicalConcept {tenant_id: $tenant})
  WHERE type(r) IN $types AND r.tenant_id = $tenant
    AND size(coalesce(r.evidence_context_ids, r.evidence_ids, [])) > 0
    AND size(coalesce(r.evidence_quotes, [])) > 0
  RETURN x AS a, y AS b, $relation_share * coalesce(r.confidence, 0.0) AS weight, 'LINK' AS type
  UNION ALL
  UNWIND $title_links AS link
  MATCH (c:CanonicalConcept {tenant_id: $tenant, canonical_name: link[0]})
  MATCH (t:Topic {tenant_id: $tenant, topic_id: link[1]})
  CALL (c) {
    MATCH (c)-[m:MENTIONED_IN]->(:SectionContext {tenant_id: $tenant})
    RETURN sum(coalesce(m.salience, 0.0)) AS mentions
  }
  RETURN c AS a, t AS b, $title_route * mentions AS weight, 'NAMES' AS type
}
WITH a, b, weight, type
WHERE weight > 0
WITH gds.graph.project(
  $graph, a, b,
  {relationshipProperties: {weight: weight}, relationshipType: type},
  {undirectedRelationshipTypes: ['LINK']}
) AS g
RETURN g.nodeCount AS nodes, g.relationshipCount AS relationships
"""

# The walk from the seeds ([key, weight] pairs; a key names a concept, a topic or both, each
# node of the projection), the best sections kept.
_PAGERANK = """
UNWIND $seeds AS seed
OPTIONAL MATCH (c:CanonicalConcept {tenant_id: $tenant, canonical_name: seed[0]})
  WHERE EXISTS { (c)-[:MENTIONED_IN]->(:SectionContext) }
OPTIONAL MATCH (t:Topic {tenant_id: $tenant, topic_id: seed[0]})
  WHERE EXISTS { (:Document {tenant_id: $tenant})-[:HAS_TOPIC]->(t) }
WITH seed, [n IN [c, t] WHERE n IS NOT NULL] AS nodes
UNWIND nodes AS n
WITH collect([n, seed[1] / size(nodes)]) AS sources
WHERE size(sources) > 0
CALL gds.pageRank.stream($graph, {
  sourceNodes: sources, dampingFactor: $damping, maxIterations: $iterations,
  tolerance: $tolerance, relationshipWeightProperty: 'weight'
})
YIELD nodeId, score
WITH gds.util.asNode(nodeId) AS n, score
WHERE n:SectionContext AND score > 0
RETURN n.context_id AS context_id, n.document_id AS document_id, score
ORDER BY score DESC, context_id
LIMIT $limit
"""

Reader = Callable[..., Awaitable[Sequence[Mapping[str, Any]]]]


def graph_name(replica: str, tenant: str, kind: str = "semantic") -> str:
    """The projection of `tenant` held for this search replica (`semantic` for Yen,
    `propagation` for PageRank)."""
    digest = hashlib.sha256(f"{replica}\x00{tenant}".encode()).hexdigest()[:24]
    return f"pml-{kind}-{digest}"


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

    def __init__(self, read: Reader, replica: str, min_confidence: float = MIN_CONFIDENCE) -> None:
        self._read = read
        self._replica = replica
        self._min_confidence = min_confidence
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

    def invalidate(self, tenant: str, removed: bool = False) -> None:
        """The tenant's relations changed (`removed`: by a deletion): project again on its
        next question."""
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
            _PROJECT,
            tenant=tenant,
            graph=graph,
            types=RELATION_TYPES,
            min_cost=MIN_COST,
            min_confidence=self._min_confidence,
        )
        relationships = int(rows[0]["relationships"] or 0) if rows else 0
        self._projected[tenant] = relationships > 0
        log.info("knowledge.gds_projected", graph=graph, relationships=relationships)


class GdsPageRank:
    """Personalized PageRank through GDS, one projection per tenant, kept until invalidated."""

    def __init__(self, read: Reader, replica: str) -> None:
        self._read = read
        self._replica = replica
        # tenant -> whether its projection holds any relationship
        self._projected: dict[str, bool] = {}

    def invalidate(self, tenant: str, removed: bool = False) -> None:
        """The tenant's graph changed (`removed`: by a deletion): project again on its next
        question."""
        self._projected.pop(tenant, None)

    async def sections(
        self,
        tenant: str,
        seeds: Sequence[tuple[str, float]],
        limit: int,
        title_links: Sequence[tuple[str, str]] = (),
    ) -> tuple[dict[str, float], dict[str, str]]:
        """The `limit` sections the walk from `seeds` (key, weight) reaches most, with their
        documents; `title_links` (concept key, topic key) are the tenant's concepts that name
        a document (`NameIndex.title_links`), projected when the tenant is."""
        if not seeds:
            return {}, {}
        graph = graph_name(self._replica, tenant, "propagation")
        if tenant not in self._projected:
            await self._project(tenant, graph, title_links)
        if not self._projected[tenant]:
            return {}, {}
        rows = await self._read(
            _PAGERANK,
            tenant=tenant,
            graph=graph,
            seeds=[[key, weight] for key, weight in seeds],
            damping=propagation.DAMPING,
            iterations=propagation.MAX_ITERATIONS,
            tolerance=propagation.TOLERANCE,
            limit=limit,
        )
        scores = {str(r["context_id"]): float(r["score"]) for r in rows}
        documents = {str(r["context_id"]): str(r["document_id"] or "") for r in rows}
        return scores, documents

    async def _project(
        self, tenant: str, graph: str, title_links: Sequence[tuple[str, str]]
    ) -> None:
        await self._read(_DROP, graph=graph)
        rows = await self._read(
            _PROJECT_PROPAGATION,
            title_links=[list(link) for link in title_links],
            title_route=propagation.TITLE_ROUTE,
            tenant=tenant,
            graph=graph,
            types=RELATION_TYPES,
            topic_section=propagation.TOPIC_SECTION,
            covers_share=propagation.COVERS_SHARE,
            same_key=propagation.SAME_KEY,
            relation_share=propagation.RELATION_SHARE,
        )
        relationships = int(rows[0]["relationships"] or 0) if rows else 0
        self._projected[tenant] = relationships > 0
        log.info("knowledge.gds_projected", graph=graph, relationships=relationships)
