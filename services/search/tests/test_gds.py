"""GDS Yen: detection on the real Neo4j, and the query building and row handling on rows shaped
like the plugin's.

This machine's Neo4j is community without the GDS plugin, so `gds.*` procedures cannot run
here: `RecordingReader` answers the GDS calls with recorded rows of the documented shape
(`gds.shortestPath.yens.stream` yields index, sourceNode, targetNode, totalCost, nodeIds, costs,
path; the query maps nodeIds to concept keys), and the tests check what is sent and what is made
of the answer. The paths found that way go through the real scoring in test_knowledge.py.
"""

from __future__ import annotations

from typing import Any

from pml_search.gds import YEN_PROCEDURE, GdsPaths, graph_name, paths_of_rows
from pml_search.knowledge_reads import RELATION_TYPES, KnowledgeReads


class RecordingReader:
    def __init__(self, yen_rows: list[dict[str, Any]], relationships: int = 3) -> None:
        self.yen_rows = yen_rows
        self.relationships = relationships
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, query: str, **params: Any) -> list[dict[str, Any]]:
        self.calls.append((query, params))
        if "SHOW PROCEDURES" in query:
            return [{"found": 1}]
        if "gds.graph.project" in query:
            return [{"nodes": 4, "relationships": self.relationships}]
        if "gds.shortestPath.yens.stream" in query:
            return self.yen_rows
        return []

    def kinds(self) -> list[str]:
        names = ("SHOW PROCEDURES", "gds.graph.drop", "gds.graph.project", "yens.stream")
        return [next(n for n in names if n in q) for q, _ in self.calls]


ROWS = [
    {"source": "a", "target": "d", "index": 1, "totalCost": 1.2, "nodes": ["a", "c", "d"]},
    {"source": "a", "target": "d", "index": 0, "totalCost": 0.4, "nodes": ["a", "d"]},
    {"source": "a", "target": "d", "index": 2, "totalCost": 2.0, "nodes": ["a", "b", "c", "b"]},
    {
        "source": "a",
        "target": "d",
        "index": 3,
        "totalCost": 3.0,
        "nodes": ["a", "b", "c", "e", "d"],
    },
]


async def test_detection_on_community_neo4j_finds_no_gds(graph_db, settings) -> None:
    reads = KnowledgeReads(graph_db, settings.neo4j_database)
    assert await GdsPaths(reads.read, "replica").available() is False


async def test_projection_once_per_tenant_until_invalidated() -> None:
    reader = RecordingReader(ROWS)
    gds = GdsPaths(reader, "replica-1")
    assert await gds.available() and await gds.available()
    pairs = [("a", "d")]
    first = await gds.paths("t1", pairs, k=5, max_hops=3)
    await gds.paths("t1", pairs, k=5, max_hops=3)
    assert reader.kinds() == [
        "SHOW PROCEDURES",  # checked once, then remembered
        "gds.graph.drop",
        "gds.graph.project",
        "yens.stream",
        "yens.stream",
    ]
    gds.invalidate("t1")
    await gds.paths("t1", pairs, k=5, max_hops=3)
    assert reader.kinds()[-3:] == ["gds.graph.drop", "gds.graph.project", "yens.stream"]
    # in Yen's order, loops and paths longer than 3 hops dropped
    assert first == [("a", "d"), ("a", "c", "d")]


async def test_queries_carry_everything_as_parameters() -> None:
    reader = RecordingReader(ROWS)
    gds = GdsPaths(reader, "replica-1", min_confidence=0.65)
    await gds.paths("tenant x'})", [("a", "d")], k=5, max_hops=3)
    project_query, project = next(c for c in reader.calls if "gds.graph.project" in c[0])
    yen_query, yen = next(c for c in reader.calls if "yens.stream" in c[0])
    name = graph_name("replica-1", "tenant x'})")
    assert project == {
        "tenant": "tenant x'})",
        "graph": name,
        "types": RELATION_TYPES,
        "min_cost": project["min_cost"],
        "min_confidence": 0.65,  # seed §5.3: weaker relations are not projected
    }
    assert "r.confidence >= $min_confidence" in project_query
    assert yen == {"tenant": "tenant x'})", "graph": name, "pairs": [["a", "d"]], "k": 5}
    assert "tenant x" not in yen_query and name not in yen_query
    for key in ("sourceNode", "targetNode", "k: $k", "relationshipWeightProperty: 'cost'"):
        assert key in yen_query
    assert YEN_PROCEDURE in yen_query
    # one projection per tenant and replica, whatever the tenant id looks like
    assert name.startswith("pml-semantic-") and name != graph_name("replica-2", "tenant x'})")


async def test_a_tenant_without_relations_is_not_searched() -> None:
    reader = RecordingReader(ROWS, relationships=0)
    gds = GdsPaths(reader, "replica-1")
    assert await gds.paths("t", [("a", "d")], k=5, max_hops=3) == []
    assert await gds.paths("t", [], k=5, max_hops=3) == []
    assert "yens.stream" not in reader.kinds()


def test_rows_are_ordered_by_pair_then_index() -> None:
    rows = [
        {"source": "b", "target": "c", "index": 0, "nodes": ["b", "c"]},
        *ROWS,
    ]
    assert paths_of_rows(rows, max_hops=3) == [("a", "d"), ("a", "c", "d"), ("b", "c")]
