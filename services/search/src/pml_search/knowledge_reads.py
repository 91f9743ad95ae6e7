"""Read-only Cypher over the knowledge graph for `KnowledgeService.Ask` (seed 001 §5).

The ingest pass workers write the graph (`pml_common.knowledge_graph` describes it); search only
reads it, through the queries below. Every query matches `tenant_id` on every node and
relationship it reads, so a tenant never sees another's concepts, sections or relations, and
every value from a request reaches Neo4j as a parameter.

- `anchors`: which canonical keys of a question are concepts (or topics) of the tenant, with
  how many sections mention them (their document frequency), their semantic degree and their
  routes: the sections that mention them (`MENTIONED_IN`, by salience) and, when the key names
  a structural topic (a heading), the sections under it. Scope only: a route is never a
  semantic link (seed §4).
- `bridges`: the concepts mentioned in some sections that lead elsewhere (the second hop).
- `routes`: the routes of given keys (the chosen bridges, the inner concepts of paths).
- `cypher_paths`: up to `PATHS_PER_PAIR` shortest paths (1 to 3 hops) between pairs of concepts
  over the semantic relations (the fallback of GDS Yen, §5.1).
- `edges`: the stored relations between pairs of concepts, with their evidence.
- `graph`: the whole concept ↔ section graph of a tenant, for propagation
  (`pml_search.propagation`): each section's mentions and topics, each topic's `COVERS`, each
  evidenced semantic relation.
- `link_rows`: the concepts some sections mention and the topics of others (`graph-ppr`
  follows the names in its best answers to the documents they title).
- `names`: every concept and topic of a tenant with its display name and entity type, for the
  index that links questions to them (`pml_search.seed_linking`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import neo4j

from pml_common.knowledge_graph import SEMANTIC_RELATION_TYPES
from pml_common.settings import Settings
from pml_search.paths import Edge, Evidence
from pml_search.seed_linking import CONCEPT_TYPE, TOPIC_TYPE, NameRow

#: Relation types a path may follow: the Pass 3 whitelist (a parameter of every path query).
RELATION_TYPES = sorted(SEMANTIC_RELATION_TYPES)
#: Paths per seed pair of the Cypher fallback (the literal of `SHORTEST 5` below; seed §8bis
#: returns k = 5 paths).
PATHS_PER_PAIR = 5
#: Default of the lowest confidence of a relation a path follows: the setting's.
MIN_CONFIDENCE: float = Settings.model_fields["knowledge_min_confidence"].default
#: How long the tenant's section count (the N of the document frequency) is reused.
SECTION_COUNT_TTL_S = 30.0

# The sections a concept key leads to, for a `key` in scope: its mentions (most salient first)
# and the sections under the topic it names. `weight` is the mention's salience, or 1 for a
# section under the topic. Scope only: a route is never a semantic link (seed §4).
_ROUTES_OF_KEY = """
  MATCH (:CanonicalConcept {tenant_id: $tenant, canonical_name: key})
        -[m:MENTIONED_IN]->(s:SectionContext {tenant_id: $tenant})
  RETURN s, m.salience AS weight, 'mention' AS via
  ORDER BY weight DESC
  LIMIT $per_key
  UNION
  MATCH (:Topic {tenant_id: $tenant, topic_id: key})
        <-[:HAS_TOPIC]-(d:Document {tenant_id: $tenant})
  MATCH (s:SectionContext {tenant_id: $tenant, document_id: d.document_id})
  WHERE key IN s.topic_ids
  RETURN s, 1.0 AS weight, 'topic' AS via
  LIMIT $per_key
"""

# A route as a list (context id, document id, weight, via): lists of values decode several times
# faster in the driver than one record or map per route.
_ROUTE = "[s.context_id, s.document_id, weight, via]"

# The keys that are concepts or topics of the tenant, each with its routes (one round trip).
_ANCHORS = f"""
UNWIND $keys AS key
OPTIONAL MATCH (c:CanonicalConcept {{tenant_id: $tenant, canonical_name: key}})
OPTIONAL MATCH (t:Topic {{tenant_id: $tenant, topic_id: key}})
WITH key, c, t
WHERE c IS NOT NULL OR t IS NOT NULL
OPTIONAL CALL (key) {{
{_ROUTES_OF_KEY}
}}
WITH key, c, t, collect(CASE WHEN s IS NULL THEN null ELSE {_ROUTE} END) AS routes
RETURN key,
       coalesce(c.name, t.name) AS name,
       coalesce(c.concept_type, 'TOPIC') AS concept_type,
       CASE WHEN c IS NULL THEN 0 ELSE COUNT {{ (c)-[:MENTIONED_IN]->() }} END AS sections,
       CASE WHEN c IS NULL THEN 0
            ELSE COUNT {{ (c)-[r]-(:CanonicalConcept) WHERE type(r) IN $types }} END AS degree,
       t IS NOT NULL AS topic,
       routes
"""

_SECTION_COUNT = """
MATCH (d:Document {tenant_id: $tenant})
RETURN coalesce(sum(d.section_count), 0) AS sections
"""

# Routes of given keys (the chosen bridges, the inner concepts of paths), one row per key.
_ROUTES = f"""
UNWIND $keys AS key
CALL (key) {{
{_ROUTES_OF_KEY}
}}
RETURN key, collect({_ROUTE}) AS routes
"""

# The concepts of some sections that lead elsewhere (mentioned in more than one section, in at
# most `max_sections`: more is a generic hub; or naming a topic), and where each is mentioned
# among those sections, with its salience. Their routes are asked for once chosen (`routes`).
_BRIDGES = """
UNWIND $context_ids AS context_id
MATCH (:SectionContext {tenant_id: $tenant, context_id: context_id})
      <-[m:MENTIONED_IN]-(c:CanonicalConcept {tenant_id: $tenant})
WITH c, collect([context_id, m.salience]) AS seen_in
WITH c, seen_in, COUNT { (c)-[:MENTIONED_IN]->() } AS sections,
     EXISTS { MATCH (:Topic {tenant_id: $tenant, topic_id: c.canonical_name}) } AS topic
WHERE (sections > 1 OR topic) AND sections <= $max_sections
RETURN collect([c.canonical_name, sections, topic, seen_in]) AS bridges
"""

# What `graph-ppr` needs to follow the names its best answers write, in one round trip: the
# concepts each anchor section mentions, and the topics of each candidate section.
_LINK_ROWS = """
CALL () {
  UNWIND $anchors AS anchor
  MATCH (:SectionContext {tenant_id: $tenant, context_id: anchor})
        <-[:MENTIONED_IN]-(c:CanonicalConcept {tenant_id: $tenant})
  RETURN collect([anchor, c.canonical_name]) AS mentions
}
CALL () {
  UNWIND $within AS context_id
  MATCH (s:SectionContext {tenant_id: $tenant, context_id: context_id})
  RETURN collect([context_id, coalesce(s.topic_ids, [])]) AS topics
}
RETURN mentions, topics
"""

# The Cypher fallback of GDS Yen: shortest paths by hops over the semantic relations of the
# tenant of at least `min_confidence`, undirected, 1 to 3 hops (seed §5.3), up to 5 per pair.
_CYPHER_PATHS = """
UNWIND $pairs AS pair
MATCH (a:CanonicalConcept {tenant_id: $tenant, canonical_name: pair[0]})
MATCH (b:CanonicalConcept {tenant_id: $tenant, canonical_name: pair[1]})
CALL (a, b) {
  MATCH p = SHORTEST 5 (a)
        ((x:CanonicalConcept)-[r WHERE r.tenant_id = $tenant AND type(r) IN $types
                                  AND r.confidence >= $min_confidence]-
         (y:CanonicalConcept WHERE y.tenant_id = $tenant)){1,3}
        (b)
  RETURN p
}
RETURN [n IN nodes(p) | n.canonical_name] AS nodes
"""

# Every stored semantic relation between each pair, either direction, that a path may follow.
_EDGES = """
UNWIND $pairs AS pair
MATCH (a:CanonicalConcept {tenant_id: $tenant, canonical_name: pair[0]})
      -[r]-(b:CanonicalConcept {tenant_id: $tenant, canonical_name: pair[1]})
WHERE type(r) IN $types AND r.tenant_id = $tenant AND r.confidence >= $min_confidence
RETURN DISTINCT startNode(r).canonical_name AS source, type(r) AS relation,
       endNode(r).canonical_name AS target, r.confidence AS confidence,
       coalesce(r.evidence_context_ids, r.evidence_ids, []) AS context_ids,
       coalesce(r.evidence_quotes, []) AS quotes,
       coalesce(r.evidence_document_ids, []) AS document_ids
"""

# The propagation graph (`graph`): a row per section, per topic and per relation, all the rows of
# a query in one record (the async driver's cost per record made a large tenant's graph take
# seconds to read); a section row holds its document, topics and mentions ([concept key,
# salience] pairs).
_GRAPH_SECTIONS = """
MATCH (s:SectionContext {tenant_id: $tenant})
OPTIONAL MATCH (c:CanonicalConcept {tenant_id: $tenant})-[m:MENTIONED_IN]->(s)
WITH s, collect(CASE WHEN c IS NULL THEN null
                     ELSE [c.canonical_name, coalesce(m.salience, 0.0)] END) AS mentions
WITH s, mentions,
     [t IN coalesce(s.topic_ids, [])
      WHERE EXISTS { MATCH (:Topic {tenant_id: $tenant, topic_id: t}) }] AS topics
RETURN collect([s.context_id, s.document_id, topics, mentions]) AS rows
"""

_GRAPH_COVERS = """
MATCH (t:Topic {tenant_id: $tenant})-[r:COVERS]->(c:CanonicalConcept {tenant_id: $tenant})
WITH t, collect([c.canonical_name, coalesce(r.confidence, 1.0)]) AS covered
RETURN collect([t.topic_id, covered]) AS rows
"""

# Only relations with evidence (a section and a quote): an unproven relation never carries a
# walk, as it never makes a path (invariant I2).
_GRAPH_RELATIONS = """
MATCH (a:CanonicalConcept {tenant_id: $tenant})-[r]->(b:CanonicalConcept {tenant_id: $tenant})
WHERE type(r) IN $types AND r.tenant_id = $tenant
  AND size(coalesce(r.evidence_context_ids, r.evidence_ids, [])) > 0
  AND size(coalesce(r.evidence_quotes, [])) > 0
RETURN collect([a.canonical_name, b.canonical_name, coalesce(r.confidence, 0.0)]) AS rows
"""

# Every concept's key, name and type (its NER label from ingestion, or "CONCEPT" for a noun
# phrase), and every topic's key and heading; one record per query, as for `graph`.
_CONCEPT_NAMES = """
MATCH (c:CanonicalConcept {tenant_id: $tenant})
RETURN collect([c.canonical_name, coalesce(c.name, c.canonical_name),
                CASE WHEN c.concept_type = 'ENTITY' THEN coalesce(c.entity_label, 'ENTITY')
                     ELSE 'CONCEPT' END]) AS rows
"""

_TOPIC_NAMES = """
MATCH (t:Topic {tenant_id: $tenant})
RETURN collect([t.topic_id, coalesce(t.name, t.topic_id)]) AS rows
"""

_DEGREES = """
UNWIND $keys AS key
MATCH (c:CanonicalConcept {tenant_id: $tenant, canonical_name: key})
RETURN key, COUNT { (c)-[r]-(:CanonicalConcept) WHERE type(r) IN $types } AS degree
"""


@dataclass(frozen=True)
class ConceptRow:
    key: str
    name: str
    concept_type: str
    sections: int  # sections mentioning it (0 for a topic that is no concept)
    degree: int  # semantic relations
    topic: bool  # a structural topic has this key


@dataclass(frozen=True)
class Route:
    """A key leads to a section: by a mention (weight = salience) or a topic (weight 1)."""

    key: str
    context_id: str
    document_id: str
    weight: float
    via: str


@dataclass(frozen=True)
class Bridge:
    """A concept of some sections: where among them it is mentioned (context id → salience),
    how many sections mention it, and whether it names a topic."""

    key: str
    seen_in: dict[str, float]
    sections: int
    topic: bool


@dataclass(frozen=True)
class SectionRow:
    """A section of the propagation graph: its mentions (concept key → salience) and topics."""

    context_id: str
    document_id: str
    topic_ids: tuple[str, ...]
    concepts: dict[str, float]


@dataclass(frozen=True)
class CoverRow:
    """A topic's `COVERS`: concept key → confidence."""

    topic_id: str
    concepts: dict[str, float]


@dataclass(frozen=True)
class RelationRow:
    """An evidenced semantic relation between two concepts, by its confidence."""

    source: str
    target: str
    weight: float


@dataclass(frozen=True)
class GraphRows:
    sections: list[SectionRow]
    covers: list[CoverRow]
    relations: list[RelationRow]


class KnowledgeReads:
    """The read queries of the knowledge graph of one Neo4j database."""

    def __init__(
        self, driver: neo4j.AsyncDriver, database: str, min_confidence: float = MIN_CONFIDENCE
    ) -> None:
        self._driver = driver
        self._database = database
        #: Relations below it are never walked by a path (`cypher_paths`, `edges`).
        self.min_confidence = min_confidence
        self._section_counts: dict[str, tuple[float, int]] = {}

    async def anchors(
        self, tenant: str, keys: Sequence[str], per_key: int
    ) -> tuple[list[ConceptRow], list[Route]]:
        """The keys that are concepts or topics of the tenant, and the routes of each."""
        rows = await self._read(
            _ANCHORS, tenant=tenant, keys=list(keys), per_key=per_key, types=RELATION_TYPES
        )
        concepts = [
            ConceptRow(
                key=r["key"],
                name=r["name"] or r["key"],
                concept_type=r["concept_type"],
                sections=int(r["sections"]),
                degree=int(r["degree"]),
                topic=bool(r["topic"]),
            )
            for r in rows
        ]
        routes = [_route(r["key"], x) for r in rows for x in r["routes"]]
        return concepts, routes

    async def section_count(self, tenant: str) -> int:
        """How many sections the tenant has (cached for `SECTION_COUNT_TTL_S`)."""
        cached = self._section_counts.get(tenant)
        now = time.monotonic()
        if cached is not None and now - cached[0] < SECTION_COUNT_TTL_S:
            return cached[1]
        rows = await self._read(_SECTION_COUNT, tenant=tenant)
        count = int(rows[0]["sections"]) if rows else 0
        self._section_counts[tenant] = (now, count)
        return count

    async def routes(self, tenant: str, keys: Sequence[str], per_key: int) -> list[Route]:
        if not keys:
            return []
        rows = await self._read(_ROUTES, tenant=tenant, keys=list(keys), per_key=per_key)
        return [_route(r["key"], x) for r in rows for x in r["routes"]]

    async def bridges(
        self, tenant: str, context_ids: Sequence[str], max_sections: int
    ) -> list[Bridge]:
        """The concepts of these sections that lead to other sections."""
        if not context_ids:
            return []
        rows = await self._read(
            _BRIDGES, tenant=tenant, context_ids=list(context_ids), max_sections=max_sections
        )
        found = rows[0]["bridges"] if rows else []
        return [
            Bridge(
                key=key,
                seen_in={context_id: float(salience) for context_id, salience in seen_in},
                sections=int(sections),
                topic=bool(topic),
            )
            for key, sections, topic, seen_in in found
        ]

    async def link_rows(
        self, tenant: str, anchors: Sequence[str], within: Sequence[str]
    ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """The concepts each `anchors` section mentions, and the topics of each `within`
        section (context id -> concept keys, context id -> topic ids)."""
        if not anchors:
            return {}, {}
        rows = await self._read(
            _LINK_ROWS, tenant=tenant, anchors=list(anchors), within=list(within)
        )
        mentions: dict[str, list[str]] = {}
        for anchor, key in rows[0]["mentions"] if rows else ():
            mentions.setdefault(str(anchor), []).append(str(key))
        topics = {str(c): [str(t) for t in ts] for c, ts in (rows[0]["topics"] if rows else ())}
        return mentions, topics

    async def cypher_paths(
        self, tenant: str, pairs: Sequence[tuple[str, str]]
    ) -> list[tuple[str, ...]]:
        """Node keys of up to `PATHS_PER_PAIR` shortest paths of each pair."""
        if not pairs:
            return []
        rows = await self._read(
            _CYPHER_PATHS,
            tenant=tenant,
            pairs=[list(p) for p in pairs],
            types=RELATION_TYPES,
            min_confidence=self.min_confidence,
        )
        return [tuple(r["nodes"]) for r in rows]

    async def edges(self, tenant: str, pairs: Sequence[tuple[str, str]]) -> list[Edge]:
        """Every stored relation between each pair (either direction), with its evidence."""
        if not pairs:
            return []
        rows = await self._read(
            _EDGES,
            tenant=tenant,
            pairs=[list(p) for p in pairs],
            types=RELATION_TYPES,
            min_confidence=self.min_confidence,
        )
        return [_edge(r) for r in rows]

    async def degrees(self, tenant: str, keys: Sequence[str]) -> dict[str, int]:
        if not keys:
            return {}
        rows = await self._read(_DEGREES, tenant=tenant, keys=list(keys), types=RELATION_TYPES)
        return {r["key"]: int(r["degree"]) for r in rows}

    async def graph(self, tenant: str) -> GraphRows:
        """The tenant's concept ↔ section graph (sections, covers, evidenced relations)."""
        (sections,) = await self._read(_GRAPH_SECTIONS, tenant=tenant)
        (covers,) = await self._read(_GRAPH_COVERS, tenant=tenant)
        (relations,) = await self._read(_GRAPH_RELATIONS, tenant=tenant, types=RELATION_TYPES)
        return GraphRows(
            sections=[_section_row(row) for row in sections["rows"]],
            covers=[CoverRow(str(topic), _weights(covered)) for topic, covered in covers["rows"]],
            relations=[RelationRow(str(a), str(b), float(w)) for a, b, w in relations["rows"]],
        )

    async def names(self, tenant: str) -> list[NameRow]:
        """Every concept and topic of the tenant, named and typed (see `seed_linking`)."""
        (concepts,) = await self._read(_CONCEPT_NAMES, tenant=tenant)
        (topics,) = await self._read(_TOPIC_NAMES, tenant=tenant)
        return [NameRow(str(k), str(n), str(t or CONCEPT_TYPE)) for k, n, t in concepts["rows"]] + [
            NameRow(str(k), str(n), TOPIC_TYPE) for k, n in topics["rows"]
        ]

    async def read(self, query: str, **params: Any) -> list[neo4j.Record]:
        """Another read-only query (GDS procedures, see `pml_search.gds`)."""
        return await self._read(query, **params)

    async def _read(self, query: str, **params: Any) -> list[neo4j.Record]:
        records, _, _ = await self._driver.execute_query(
            query, params, database_=self._database, routing_=neo4j.RoutingControl.READ
        )
        return list(records)


def _weights(pairs: Sequence[Sequence[Any]]) -> dict[str, float]:
    """[key, weight] pairs as key → weight (a key twice keeps its largest weight)."""
    found: dict[str, float] = {}
    for key, weight in pairs:
        found[str(key)] = max(float(weight or 0.0), found.get(str(key), 0.0))
    return found


def _section_row(row: Sequence[Any]) -> SectionRow:
    context_id, document_id, topic_ids, mentions = row
    return SectionRow(
        context_id=str(context_id),
        document_id=str(document_id or ""),
        topic_ids=tuple(str(t) for t in topic_ids),
        concepts=_weights(mentions),
    )


def _route(key: str, row: Sequence[Any]) -> Route:
    context_id, document_id, weight, via = row
    return Route(key, context_id, document_id, float(weight), via)


def _edge(row: Any) -> Edge:
    context_ids = list(row["context_ids"] or [])
    quotes = list(row["quotes"] or [])
    documents = list(row["document_ids"] or [])
    evidence = tuple(
        Evidence(
            context_id=str(context_id),
            quote=str(quotes[i]) if i < len(quotes) else "",
            document_id=str(documents[i]) if i < len(documents) else "",
        )
        for i, context_id in enumerate(context_ids)
    )
    return Edge(
        source=row["source"],
        relation=row["relation"],
        target=row["target"],
        confidence=float(row["confidence"] or 0.0),
        evidence=evidence,
    )
