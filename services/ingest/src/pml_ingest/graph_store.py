"""Reads and writes of the knowledge graph (model: `pml_common.knowledge_graph`).

The pass workers are the graph's only writers. Every write is idempotent: nodes and
relationships are MERGEd on their keys (uniqueness constraints in `SCHEMA`), what a document
contributed is replaced as a whole, and orphans are swept by queries that look at the graph as
it is, not at what an earlier, possibly crashed, attempt remembered. A redelivered event after a
crash therefore redoes the same writes and never duplicates anything. Rows are written with
`UNWIND`: a document of ordinary size in one transaction per pass step, a larger one in batches
of `write_batch` rows.

Every query is a constant string with parameters; the twelve relation-writing queries are built
once from the constant whitelist of relation types (Cypher cannot parameterise a type).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import neo4j

from pml_common.events import utcnow
from pml_common.knowledge_graph import SCHEMA, SEMANTIC_RELATION_TYPES
from pml_common.stores import create_schema_rule
from pml_ingest.policy import MAX_CONFIDENCE, MIN_INDEPENDENT, PER_EXTRA_EVIDENCE, Relation
from pml_ingest.verifier import Concept, SectionEvidence


@dataclass(frozen=True)
class DocumentState:
    content_hash: str | None
    completed_hash: str | None
    language: str | None


@dataclass(frozen=True)
class StoredSection:
    context_id: str
    section_path: str
    trail: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class Candidate:
    a: Concept
    b: Concept
    sections: tuple[SectionEvidence, ...]


# --- document and sections ------------------------------------------------------------------

_DOCUMENT_STATES = """
UNWIND $docs AS doc
MATCH (d:Document {tenant_id: $tenant, document_id: doc})
RETURN doc, d.content_hash AS content_hash, d.completed_hash AS completed_hash,
       d.language AS language
"""

_UPSERT_DOCUMENTS = """
UNWIND $docs AS x
MERGE (d:Document {tenant_id: $tenant, document_id: x.document_id})
ON CREATE SET d.submitted_at = $at
SET d:DocumentContext:ContextNode, d.title = x.title, d.format = x.format,
    d.language = x.language, d.section_count = x.section_count, d.updated_at = $at
"""

_WRITE_SECTIONS = """
UNWIND $sections AS s
MATCH (d:Document {tenant_id: $tenant, document_id: s.document_id})
MERGE (n:SectionContext {tenant_id: $tenant, context_id: s.context_id})
SET n:ContextNode, n.document_id = s.document_id, n.section_path = s.section_path,
    n.heading = s.heading, n.level = s.level, n.ordinal = s.ordinal, n.text = s.text,
    n.char_start = s.char_start, n.char_end = s.char_end, n.chunk_ids = s.chunk_ids,
    n.trail = s.trail, n.topic_ids = coalesce(n.topic_ids, [])
MERGE (n)-[r:IN_DOC]->(d)
SET r.tenant_id = $tenant
"""

_STALE_SECTIONS = """
UNWIND $docs AS x
MATCH (n:SectionContext {tenant_id: $tenant, document_id: x.document_id})
WHERE NOT n.context_id IN x.keep
DETACH DELETE n
"""

_MARK_CHUNKED = """
UNWIND $docs AS x
MATCH (d:Document {tenant_id: $tenant, document_id: x.doc})
SET d.content_hash = x.hash, d.completed_hash = null
"""

_MARK_COMPLETED = """
UNWIND $docs AS x
MATCH (d:Document {tenant_id: $tenant, document_id: x.doc})
WHERE d.content_hash = x.hash
SET d.completed_hash = x.hash
"""

_SECTIONS = """
UNWIND $docs AS doc
MATCH (n:SectionContext {tenant_id: $tenant, document_id: doc})
RETURN doc, n.context_id AS context_id, n.section_path AS section_path, n.trail AS trail,
       n.text AS text
ORDER BY n.ordinal
"""

# --- removal of what a document contributed -------------------------------------------------

# Relations whose evidence the document (partly) gave: the evidence it gave is dropped, and the
# relation goes when what is left no longer satisfies the multi-evidence policy.
_RELATIONS_OF_DOCUMENT = """
MATCH (:SectionContext {tenant_id: $tenant, document_id: $doc})<-[:MENTIONED_IN]-
      (:CanonicalConcept)-[r]->(:CanonicalConcept)
WHERE r.tenant_id = $tenant AND r.relation_type IS NOT NULL AND $doc IN r.document_ids
WITH DISTINCT r
WITH r, [i IN range(0, size(r.evidence_context_ids) - 1)
         WHERE r.evidence_document_ids[i] <> $doc] AS keep
"""

_DROP_UNSUPPORTED = (
    _RELATIONS_OF_DOCUMENT
    + """
WHERE size(keep) = 0
   OR (size(keep) < $min_evidence AND NOT any(i IN keep WHERE r.evidence_strong[i]))
DELETE r
"""
)

_PRUNE_EVIDENCE = (
    _RELATIONS_OF_DOCUMENT
    + """
WITH r, [i IN keep | r.evidence_context_ids[i]] AS ctx, [i IN keep | r.evidence_quotes[i]] AS q,
     [i IN keep | r.evidence_strong[i]] AS strong, [i IN keep | r.evidence_confidences[i]] AS conf,
     [i IN keep | r.evidence_document_ids[i]] AS docs
SET r.evidence_context_ids = ctx, r.evidence_ids = ctx, r.evidence_quotes = q,
    r.evidence_quote = q[0], r.evidence_strong = strong, r.evidence_confidences = conf,
    r.evidence_document_ids = docs,
    r.document_ids = reduce(acc = [], d IN docs | CASE WHEN d IN acc THEN acc ELSE acc + d END),
    r.strong_evidence = any(s IN strong WHERE s),
    r.multi_evidence = size(ctx) >= $min_evidence,
    r.confidence = CASE
        WHEN reduce(m = 0.0, c IN conf | CASE WHEN c > m THEN c ELSE m END)
             + $per_extra * (size(conf) - 1) > $max_confidence THEN $max_confidence
        ELSE reduce(m = 0.0, c IN conf | CASE WHEN c > m THEN c ELSE m END)
             + $per_extra * (size(conf) - 1) END,
    r.updated_at = $at
"""
)

# Each COVERS once, whichever of the documents reach it: what they gave goes in one SET.
_DROP_DOCUMENT_COVERS = """
UNWIND $docs AS doc
MATCH (:Document {tenant_id: $tenant, document_id: doc})-[:HAS_TOPIC]->(t:Topic)
      -[c:COVERS]->(:CanonicalConcept)
WHERE doc IN c.document_ids
WITH DISTINCT c
SET c.document_ids = [x IN c.document_ids WHERE NOT x IN $docs]
WITH c WHERE size(c.document_ids) = 0
DELETE c
"""

_DROP_HAS_TOPIC = """
UNWIND $docs AS doc
MATCH (:Document {tenant_id: $tenant, document_id: doc})-[h:HAS_TOPIC]->(t:Topic)
WITH h, t.topic_id AS topic_id
DELETE h
RETURN collect(topic_id) AS topic_ids
"""

_SWEEP_NAMED_TOPICS = """
MATCH (t:Topic {tenant_id: $tenant})
WHERE t.topic_id IN $topic_ids AND NOT (t)<-[:HAS_TOPIC]-()
DETACH DELETE t
"""

_SWEEP_TOPICS = """
MATCH (t:Topic {tenant_id: $tenant})
WHERE NOT (t)<-[:HAS_TOPIC]-()
DETACH DELETE t
"""

_DROP_SECTIONS = """
MATCH (n:SectionContext {tenant_id: $tenant, document_id: $doc})
DETACH DELETE n
"""

_DROP_MENTIONS = """
UNWIND $docs AS doc
MATCH (:SectionContext {tenant_id: $tenant, document_id: doc})<-[m:MENTIONED_IN]-(c)
WITH m, c.canonical_name AS key
DELETE m
RETURN collect(DISTINCT key) AS keys
"""

_SWEEP_NAMED_CONCEPTS = """
MATCH (c:CanonicalConcept {tenant_id: $tenant})
WHERE c.canonical_name IN $keys AND NOT (c)-[:MENTIONED_IN]->()
DETACH DELETE c
"""

# A concept lives as long as some section mentions it (its COVERS and relations go with it).
_SWEEP_CONCEPTS = """
MATCH (c:CanonicalConcept {tenant_id: $tenant})
WHERE NOT (c)-[:MENTIONED_IN]->()
DETACH DELETE c
"""

_DROP_DOCUMENT = """
MATCH (d:Document {tenant_id: $tenant, document_id: $doc})
DETACH DELETE d
"""

_DELETE_TENANT = tuple(
    f"MATCH (n:{label} {{tenant_id: $tenant}}) "
    "CALL (n) { DETACH DELETE n } IN TRANSACTIONS OF 1000 ROWS"
    for label in ("SectionContext", "Document", "CanonicalConcept", "Topic")
)

# --- pass 1 ---------------------------------------------------------------------------------

# Rows in document order: a concept first met in the batch takes the name the first document
# gives it, as when the documents come one after the other.
_WRITE_MENTIONS = """
UNWIND $rows AS m
MATCH (s:SectionContext {tenant_id: $tenant, context_id: m.context_id})
MERGE (c:CanonicalConcept {tenant_id: $tenant, canonical_name: m.key})
ON CREATE SET c.name = m.name, c.concept_type = m.concept_type, c.entity_label = m.entity_label,
              c.languages = [m.language], c.created_at = $at
SET c.languages = CASE WHEN m.language IN c.languages THEN c.languages
                       ELSE c.languages + m.language END,
    c.concept_type = CASE WHEN m.concept_type = 'ENTITY' THEN 'ENTITY' ELSE c.concept_type END,
    c.entity_label = CASE WHEN coalesce(c.entity_label, '') = '' THEN m.entity_label
                          ELSE c.entity_label END
MERGE (c)-[r:MENTIONED_IN]->(s)
SET r.tenant_id = $tenant, r.document_id = m.document_id, r.salience = m.salience,
    r.positions = m.positions, r.count = m.count
"""

_MENTIONS_OF_DOCUMENTS = """
UNWIND $docs AS doc
MATCH (s:SectionContext {tenant_id: $tenant, document_id: doc})<-[m:MENTIONED_IN]-(c)
RETURN s.context_id AS context_id, c.canonical_name AS key, m.salience AS salience
"""

# --- pass 2a --------------------------------------------------------------------------------

_WRITE_TOPICS = """
UNWIND $topics AS x
MATCH (d:Document {tenant_id: $tenant, document_id: x.document_id})
MERGE (t:Topic {tenant_id: $tenant, topic_id: x.topic_id})
ON CREATE SET t.name = x.name, t.concept_type = 'TOPIC', t.created_at = $at
MERGE (d)-[h:HAS_TOPIC]->(t)
SET h.tenant_id = $tenant, h.salience = x.salience
"""

_ATTACH_SECTIONS = """
UNWIND $sections AS x
MATCH (s:SectionContext {tenant_id: $tenant, context_id: x.context_id})
SET s.topic_ids = x.topic_ids
"""

_WRITE_COVERS = """
UNWIND $covers AS x
MATCH (t:Topic {tenant_id: $tenant, topic_id: x.topic_id})
MATCH (c:CanonicalConcept {tenant_id: $tenant, canonical_name: x.key})
MERGE (t)-[r:COVERS]->(c)
ON CREATE SET r.document_ids = [], r.confidence = x.confidence
SET r.tenant_id = $tenant,
    r.document_ids = CASE WHEN x.document_id IN r.document_ids THEN r.document_ids
                          ELSE r.document_ids + x.document_id END,
    r.confidence = CASE WHEN x.confidence > r.confidence THEN x.confidence
                        ELSE r.confidence END
"""

# --- pass 2b --------------------------------------------------------------------------------

_CONCEPTS_OF_DOCUMENTS = """
UNWIND $docs AS doc
MATCH (:SectionContext {tenant_id: $tenant, document_id: doc})<-[:MENTIONED_IN]-
      (c:CanonicalConcept)
RETURN DISTINCT c.canonical_name AS key, coalesce(c.entity_label, '') AS entity_label
"""

_WRITE_FINE_TYPES = """
UNWIND $rows AS x
MATCH (c:CanonicalConcept {tenant_id: $tenant, canonical_name: x.key})
SET c.fine_type = x.fine_type
"""

# --- pass 3 ---------------------------------------------------------------------------------

# Each document's candidates alone (its own order and limit), all documents in one query.
_CANDIDATES = """
UNWIND $docs AS doc
CALL (doc) {
  MATCH (:SectionContext {tenant_id: $tenant, document_id: doc})<-[:MENTIONED_IN]-
        (a:CanonicalConcept)
  WITH DISTINCT a
  MATCH (a)-[:MENTIONED_IN]->(t:SectionContext)<-[:MENTIONED_IN]-(b:CanonicalConcept)
  WHERE b <> a
  // sections in reading order, so the ones kept below $max_sections (the evidence) do not
  // depend on the order the store happens to return them in
  WITH a, b, t ORDER BY t.document_id, t.ordinal, t.context_id
  WITH a, b, collect(t) AS shared
  WHERE size(shared) >= $min_sections AND any(x IN shared WHERE x.document_id = doc)
  RETURN a.canonical_name AS a_key, a.name AS a_name, b.canonical_name AS b_key,
         b.name AS b_name, size(shared) AS n,
         [x IN shared | {context_id: x.context_id, document_id: x.document_id,
                         section_path: x.section_path, text: x.text}][0..$max_sections]
           AS sections
  ORDER BY n DESC, a_key, b_key
  LIMIT $limit
}
RETURN doc, a_key, a_name, b_key, b_name, n, sections
"""

_DROP_PAIR_RELATIONS = """
UNWIND $pairs AS p
MATCH (a:CanonicalConcept {tenant_id: $tenant, canonical_name: p.a})
      -[r]-(b:CanonicalConcept {tenant_id: $tenant, canonical_name: p.b})
WHERE r.relation_type IS NOT NULL
DELETE r
"""

_RELATION_TEMPLATE = """
UNWIND $rows AS x
MATCH (a:CanonicalConcept {tenant_id: $tenant, canonical_name: x.source})
MATCH (b:CanonicalConcept {tenant_id: $tenant, canonical_name: x.target})
MERGE (a)-[r:%s]->(b)
SET r += x.props, r.tenant_id = $tenant, r.updated_at = $at
"""

#: One query per whitelisted type, built once from the constant whitelist.
_WRITE_RELATION = {t: _RELATION_TEMPLATE % t for t in sorted(SEMANTIC_RELATION_TYPES)}


class GraphStore:
    """The knowledge graph of one Neo4j database."""

    def __init__(self, driver: neo4j.AsyncDriver, database: str, write_batch: int = 500) -> None:
        self._driver = driver
        self._database = database
        self.write_batch = write_batch

    async def ensure_schema(self) -> None:
        """Constraints and indexes (idempotent, safe for workers starting together)."""
        for statement in SCHEMA:
            await create_schema_rule(self._driver, statement, self._database)

    # --- documents ------------------------------------------------------------------------

    async def document_state(self, tenant: str, doc: str) -> DocumentState | None:
        return (await self.document_states(tenant, [doc])).get(doc)

    async def document_states(self, tenant: str, docs: Sequence[str]) -> dict[str, DocumentState]:
        """The state of each of `docs` that exists, in one read."""
        records = await self._read(_DOCUMENT_STATES, tenant=tenant, docs=list(docs))
        return {
            r["doc"]: DocumentState(r["content_hash"], r["completed_hash"], r["language"])
            for r in records
        }

    async def upsert_documents(self, tenant: str, docs: Sequence[dict[str, Any]]) -> None:
        """Document nodes: rows of `document_id`, `title`, `format`, `language`,
        `section_count`."""
        await self._run(_UPSERT_DOCUMENTS, tenant=tenant, docs=list(docs), at=utcnow())

    async def write_documents(
        self, tenant: str, docs: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]
    ) -> None:
        """Document nodes (`upsert_documents` rows) and all their sections (`rows`, each naming
        its `document_id`; stale ones dropped) in one transaction: for documents of ordinary
        size, instead of the batched steps below."""

        async def work(tx: neo4j.AsyncManagedTransaction) -> None:
            await _consume(tx, _UPSERT_DOCUMENTS, tenant=tenant, docs=list(docs), at=utcnow())
            await _consume(tx, _WRITE_SECTIONS, tenant=tenant, sections=list(rows))
            await _consume(tx, _STALE_SECTIONS, tenant=tenant, docs=_kept(docs, rows))

        await self._write(work)

    async def write_sections(self, tenant: str, rows: Sequence[dict[str, Any]]) -> None:
        await self._run(_WRITE_SECTIONS, tenant=tenant, sections=list(rows))

    async def drop_stale_sections(self, tenant: str, doc: str, keep: Sequence[str]) -> None:
        docs = [{"document_id": doc, "keep": list(keep)}]
        await self._run(_STALE_SECTIONS, tenant=tenant, docs=docs)

    async def mark_chunked(self, tenant: str, hashes: Sequence[tuple[str, str]]) -> None:
        """Each (document, content hash): the content the later passes work on."""
        rows = [{"doc": doc, "hash": content_hash} for doc, content_hash in hashes]
        await self._run(_MARK_CHUNKED, tenant=tenant, docs=rows)

    async def mark_completed(self, tenant: str, hashes: Sequence[tuple[str, str]]) -> None:
        """Each (document, content hash) completed, if that is still the document's content."""
        rows = [{"doc": doc, "hash": content_hash} for doc, content_hash in hashes]
        await self._run(_MARK_COMPLETED, tenant=tenant, docs=rows)

    async def sections(self, tenant: str, docs: Sequence[str]) -> dict[str, list[StoredSection]]:
        """The sections of each of `docs`, in document order, in one read."""
        found: dict[str, list[StoredSection]] = {doc: [] for doc in docs}
        for r in await self._read(_SECTIONS, tenant=tenant, docs=list(docs)):
            trail = tuple(r["trail"] or ())
            found[r["doc"]].append(
                StoredSection(r["context_id"], r["section_path"], trail, r["text"])
            )
        return found

    async def remove_document(self, tenant: str, doc: str, *, keep_document: bool) -> None:
        """Remove what the document contributed (sections, mentions, topics, evidence) and
        everything only it supported; the Document node too unless `keep_document`.

        One transaction: concepts, topics and relations that other documents support stay.
        """

        async def work(tx: neo4j.AsyncManagedTransaction) -> None:
            params = {"tenant": tenant, "doc": doc}
            policy = {
                "min_evidence": MIN_INDEPENDENT,
                "per_extra": PER_EXTRA_EVIDENCE,
                "max_confidence": MAX_CONFIDENCE,
                "at": utcnow(),
            }
            await _consume(tx, _DROP_UNSUPPORTED, **params, **policy)
            await _consume(tx, _PRUNE_EVIDENCE, **params, **policy)
            await _consume(tx, _DROP_DOCUMENT_COVERS, tenant=tenant, docs=[doc])
            await _consume(tx, _DROP_HAS_TOPIC, tenant=tenant, docs=[doc])
            await _consume(tx, _DROP_SECTIONS, **params)
            if not keep_document:
                await _consume(tx, _DROP_DOCUMENT, **params)
            await _consume(tx, _SWEEP_TOPICS, tenant=tenant)
            await _consume(tx, _SWEEP_CONCEPTS, tenant=tenant)

        await self._write(work)

    async def delete_tenant(self, tenant: str) -> int:
        """Delete every node (and so every relationship) of the tenant's knowledge graph."""
        deleted = 0
        async with self._driver.session(database=self._database) as session:
            for statement in _DELETE_TENANT:
                result = await session.run(statement, tenant=tenant)
                deleted += (await result.consume()).counters.nodes_deleted
        return deleted

    # --- pass 1 ---------------------------------------------------------------------------

    async def drop_mentions(self, tenant: str, docs: Sequence[str]) -> list[str]:
        """Delete the documents' mentions; returns the keys of the concepts they named."""
        records, _, _ = await self._driver.execute_query(
            _DROP_MENTIONS, {"tenant": tenant, "docs": list(docs)}, database_=self._database
        )
        return list(records[0]["keys"]) if records else []

    async def replace_mentions(
        self, tenant: str, docs: Sequence[str], rows: Sequence[dict[str, Any]]
    ) -> None:
        """The documents' mentions replaced by `rows` (each with its `document_id` and
        `language`, in document order) and the concepts only the old ones named swept, in one
        transaction: for documents of ordinary size, instead of `drop_mentions` + batches of
        `write_mentions` + `sweep_concepts`."""

        async def work(tx: neo4j.AsyncManagedTransaction) -> None:
            result = await tx.run(_DROP_MENTIONS, tenant=tenant, docs=list(docs))
            previous = (await result.single(strict=True))["keys"]
            await _consume(tx, _WRITE_MENTIONS, tenant=tenant, rows=list(rows), at=utcnow())
            await _consume(tx, _SWEEP_NAMED_CONCEPTS, tenant=tenant, keys=previous)

        await self._write(work)

    async def write_mentions(self, tenant: str, rows: Sequence[dict[str, Any]]) -> None:
        await self._run(_WRITE_MENTIONS, tenant=tenant, rows=list(rows), at=utcnow())

    async def sweep_concepts(self, tenant: str, keys: Sequence[str] | None = None) -> None:
        """Delete concepts no section mentions: those named by `keys`, or all of the tenant's
        (a scan: for removals, where what was mentioned is not known any more)."""
        if keys is None:
            await self._run(_SWEEP_CONCEPTS, tenant=tenant)
        else:
            await self._run(_SWEEP_NAMED_CONCEPTS, tenant=tenant, keys=list(keys))

    async def mentions(
        self, tenant: str, docs: Sequence[str]
    ) -> dict[str, list[tuple[str, float]]]:
        """Context id → (concept key, salience) of the documents' mentions (context ids name
        their document)."""
        by_section: dict[str, list[tuple[str, float]]] = {}
        for r in await self._read(_MENTIONS_OF_DOCUMENTS, tenant=tenant, docs=list(docs)):
            by_section.setdefault(r["context_id"], []).append((r["key"], float(r["salience"])))
        return by_section

    # --- pass 2a --------------------------------------------------------------------------

    async def replace_topics(
        self,
        tenant: str,
        docs: Sequence[str],
        topics: Sequence[dict[str, Any]],
        sections: Sequence[dict[str, Any]],
        covers: Sequence[dict[str, Any]],
    ) -> None:
        """The documents' HAS_TOPIC and COVERS contributions, replaced in one transaction;
        `topics` and `covers` rows name their `document_id`, in document order."""

        async def work(tx: neo4j.AsyncManagedTransaction) -> None:
            at = utcnow()
            await _consume(tx, _DROP_DOCUMENT_COVERS, tenant=tenant, docs=list(docs))
            result = await tx.run(_DROP_HAS_TOPIC, tenant=tenant, docs=list(docs))
            previous = (await result.single(strict=True))["topic_ids"]
            await _consume(tx, _WRITE_TOPICS, tenant=tenant, topics=list(topics), at=at)
            await _consume(tx, _ATTACH_SECTIONS, tenant=tenant, sections=list(sections))
            for start in range(0, len(covers), self.write_batch):
                batch = list(covers[start : start + self.write_batch])
                await _consume(tx, _WRITE_COVERS, tenant=tenant, covers=batch)
            # Only topics these documents held can have lost their last document here.
            await _consume(tx, _SWEEP_NAMED_TOPICS, tenant=tenant, topic_ids=previous)

        await self._write(work)

    # --- pass 2b --------------------------------------------------------------------------

    async def document_concepts(self, tenant: str, docs: Sequence[str]) -> list[tuple[str, str]]:
        """(key, entity label) of the concepts the documents mention, each once."""
        records = await self._read(_CONCEPTS_OF_DOCUMENTS, tenant=tenant, docs=list(docs))
        return [(r["key"], r["entity_label"]) for r in records]

    async def write_fine_types(self, tenant: str, rows: Sequence[dict[str, Any]]) -> None:
        await self._run(_WRITE_FINE_TYPES, tenant=tenant, rows=list(rows))

    # --- pass 3 ---------------------------------------------------------------------------

    async def candidates(
        self,
        tenant: str,
        docs: Sequence[str],
        min_sections: int,
        limit: int,
        max_sections: int = 20,
    ) -> dict[str, list[Candidate]]:
        """For each of `docs`, the concept pairs co-present in at least `min_sections`
        sections, one of them in the document, most co-present first; each pair once per
        document, at most `limit` per document; one read for all."""
        records = await self._read(
            _CANDIDATES,
            tenant=tenant,
            docs=list(docs),
            min_sections=min_sections,
            limit=2 * limit,  # both orders of a pair within the document come back
            max_sections=max_sections,
        )
        by_doc: dict[str, list[neo4j.Record]] = {doc: [] for doc in docs}
        for r in records:
            by_doc[r["doc"]].append(r)
        return {doc: _candidates(rows, limit) for doc, rows in by_doc.items()}

    async def replace_pair_relations(
        self, tenant: str, pairs: Sequence[tuple[str, str]], relations: Sequence[Relation]
    ) -> None:
        """Semantic relations between each pair replaced by `relations`, in one transaction."""

        async def work(tx: neo4j.AsyncManagedTransaction) -> None:
            at = utcnow()
            rows = [{"a": a, "b": b} for a, b in pairs]
            await _consume(tx, _DROP_PAIR_RELATIONS, tenant=tenant, pairs=rows)
            by_type: dict[str, list[dict[str, Any]]] = {}
            for relation in relations:
                by_type.setdefault(relation.relation_type, []).append(_relation_row(relation))
            for relation_type, typed in by_type.items():
                await _consume(tx, _WRITE_RELATION[relation_type], tenant=tenant, rows=typed, at=at)

        await self._write(work)

    # --- plumbing -------------------------------------------------------------------------

    async def _read(self, query: str, **params: Any) -> list[neo4j.Record]:
        records, _, _ = await self._driver.execute_query(
            query, params, database_=self._database, routing_=neo4j.RoutingControl.READ
        )
        return list(records)

    async def _run(self, query: str, **params: Any) -> None:
        await self._driver.execute_query(query, params, database_=self._database)

    async def _write(self, work: Any) -> None:
        async with self._driver.session(database=self._database) as session:
            await session.execute_write(work)


def _kept(docs: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each document, the context ids of its sections (the others are stale)."""
    keep: dict[str, list[str]] = {d["document_id"]: [] for d in docs}
    for row in rows:
        keep[row["document_id"]].append(row["context_id"])
    return [{"document_id": doc, "keep": ids} for doc, ids in keep.items()]


def _candidates(records: Sequence[neo4j.Record], limit: int) -> list[Candidate]:
    """One document's candidate rows, most co-present first, each pair once."""
    ordered = sorted(records, key=lambda r: (-r["n"], r["a_key"], r["b_key"]))
    seen: set[tuple[str, str]] = set()
    found = []
    for r in ordered:
        pair = tuple(sorted((r["a_key"], r["b_key"])))
        if pair in seen:
            continue
        seen.add((pair[0], pair[1]))
        sections = tuple(
            SectionEvidence(s["context_id"], s["document_id"], s["section_path"], s["text"])
            for s in r["sections"]
        )
        a, b = Concept(r["a_key"], r["a_name"]), Concept(r["b_key"], r["b_name"])
        found.append(Candidate(a, b, sections))
    return found[:limit]


async def _consume(tx: neo4j.AsyncManagedTransaction, query: str, **params: Any) -> None:
    result = await tx.run(query, params)
    await result.consume()


def _relation_row(relation: Relation) -> dict[str, Any]:
    context_ids = relation.context_ids
    quotes = [v.quote for v in relation.evidence]
    return {
        "source": relation.source,
        "target": relation.target,
        "props": {
            "relation_type": relation.relation_type,
            "confidence": relation.confidence,
            "evidence_context_ids": context_ids,
            "evidence_ids": context_ids,
            "evidence_quotes": quotes,
            "evidence_quote": quotes[0],
            "evidence_strong": [v.strong for v in relation.evidence],
            "evidence_confidences": [v.confidence for v in relation.evidence],
            "evidence_document_ids": [v.document_id for v in relation.evidence],
            "document_ids": relation.document_ids,
            "multi_evidence": relation.multi_evidence,
            "strong_evidence": relation.strong,
            "verifier": relation.evidence[0].verifier,
        },
    }
