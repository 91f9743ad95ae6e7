"""The knowledge graph of seed 001 §3 in Neo4j: labels, properties, relations, constraints.

The ingest pass workers are its only writers (`pml_ingest.graph_store`); the knowledge service
reads it. Every node and every relationship carries `tenant_id`, and every query matches on
it, so tenants never see each other. Keys below are unique per tenant (constraints).

Nodes
-----
``(:Document:DocumentContext:ContextNode {tenant_id, document_id, title, format, language,
content_hash, completed_hash, section_count, submitted_at, updated_at})``
    One submitted document. `content_hash` is the hash of what was submitted last (title, text,
    format); `completed_hash` equals it once Pass 3 finished on that content. Key:
    (tenant_id, document_id).

``(:SectionContext:ContextNode {tenant_id, context_id, document_id, section_path, heading,
level, ordinal, trail, text, char_start, char_end, chunk_ids, topic_ids})``
    One section of a document: the granularity of evidence (invariant I3). `context_id` is made
    by `pml_common.context_id.make_context_id(document_id, section_path)` and is equal to the
    `context_id` of every chunk of the section in the vector store; `chunk_ids` are those
    chunks' ids (the bridge to the vector store; there is no Chunk node). `section_path` joins
    the heading trail with " / " (e.g. "Guide / 1.2 Security Architecture"), `trail` is that
    list of headings, `heading` its last one and `level` its length; `text` is the
    section's body as submitted (what verifiers quote from); `topic_ids` name the topics the
    section is attached to. Key: (tenant_id, context_id).

``(:CanonicalConcept {tenant_id, canonical_name, name, concept_type, fine_type, entity_label,
languages})``
    A concept, merged across documents by its canonical key: `canonical_name` is
    `pml_common.concepts.canonical_key(surface form)` (the key questions are mapped to with
    `ngram_keys`); `name` is a surface form for display. `concept_type` is "ENTITY" (a named
    entity) or "CONCEPT" (a noun phrase); `entity_label` the NER label seen first, if any;
    `fine_type` is set by Pass 2b (person, organization, place, work, event, process,
    regulation, system, concept...). Key: (tenant_id, canonical_name).

``(:Topic {tenant_id, topic_id, name, concept_type: "TOPIC"})``
    A structural topic from a document's headers (H1/H2 or numbering), merged across
    documents by `topic_id` = canonical key of the header without its numbering. A separate
    label (seed §3.3 option A) so that no query over `CanonicalConcept` ever meets a topic:
    topics are scope, never evidence. Key: (tenant_id, topic_id).

Relationships
-------------
``(:SectionContext)-[:IN_DOC {tenant_id}]->(:Document)``

``(:CanonicalConcept)-[:MENTIONED_IN {tenant_id, document_id, salience, positions, count}]->
(:SectionContext)``
    Pass 1. `salience` in [0, 1] (`pml_ingest.salience`); `positions` are character offsets of
    the mentions in the section text; `count` how many there are.

``(:Document)-[:HAS_TOPIC {tenant_id, salience}]->(:Topic)``
    Pass 2a. `salience` is the share of the document's text under the topic.

``(:Topic)-[:COVERS {tenant_id, confidence, document_ids}]->(:CanonicalConcept)``
    Pass 2a, by the deterministic rules of seed §4: the concept is MENTIONED_IN a section
    attached to the topic with salience >= `covers_min_salience`, and is no stop-concept.
    `document_ids` are the documents that support it (deleting the last one deletes it).
    Scope only: never a semantic link between the concepts a topic covers.

``(:CanonicalConcept)-[r:<TYPE> {tenant_id, relation_type, confidence, evidence_context_ids,
evidence_ids, evidence_quotes, evidence_strong, evidence_confidences, evidence_document_ids,
evidence_quote, document_ids, multi_evidence, strong_evidence, verifier, updated_at}]->
(:CanonicalConcept)``
    Pass 3 only; `<TYPE>` is one of `SEMANTIC_RELATION_TYPES` (seed §11). Written only when the
    multi-evidence policy holds (one strong evidence, or at least two from different sections)
    and never without evidence (invariant I2): `evidence_context_ids` (also stored as
    `evidence_ids`, the name seed §3.2 and §8bis use) lists the SectionContexts whose text
    contains the quote; `evidence_quotes[i]` is the exact quote found in section
    `evidence_context_ids[i]`, `evidence_strong[i]` whether it is a strong source,
    `evidence_confidences[i]` the verifier's confidence, `evidence_document_ids[i]` the
    section's document;
    `evidence_quote` is the first quote. `confidence` grows with the number of evidences.
    `document_ids` are the documents the evidence comes from.

Constraints and indexes: see `SCHEMA`.
"""

from __future__ import annotations

DOCUMENT = "Document"
SECTION = "SectionContext"
CONCEPT = "CanonicalConcept"
TOPIC = "Topic"

IN_DOC = "IN_DOC"
MENTIONED_IN = "MENTIONED_IN"
HAS_TOPIC = "HAS_TOPIC"
COVERS = "COVERS"

#: Concept types (pass 1) and the type of every Topic node.
ENTITY = "ENTITY"
NOUN_PHRASE = "CONCEPT"
TOPIC_TYPE = "TOPIC"

#: The only relationship types Pass 3 writes between concepts (seed 001 §11, annex A).
SEMANTIC_RELATION_TYPES: frozenset[str] = frozenset(
    {
        "REQUIRES",
        "ENABLES",
        "PREVENTS",
        "CAUSES",
        "APPLIES_TO",
        "DEPENDS_ON",
        "PART_OF",
        "MITIGATES",
        "CONFLICTS_WITH",
        "DEFINES",
        "EXAMPLE_OF",
        "GOVERNED_BY",
    }
)

SCHEMA: tuple[str, ...] = (
    "CREATE CONSTRAINT pml_document_key IF NOT EXISTS "
    "FOR (n:Document) REQUIRE (n.tenant_id, n.document_id) IS UNIQUE",
    "CREATE CONSTRAINT pml_section_key IF NOT EXISTS "
    "FOR (n:SectionContext) REQUIRE (n.tenant_id, n.context_id) IS UNIQUE",
    "CREATE CONSTRAINT pml_concept_key IF NOT EXISTS "
    "FOR (n:CanonicalConcept) REQUIRE (n.tenant_id, n.canonical_name) IS UNIQUE",
    "CREATE CONSTRAINT pml_topic_key IF NOT EXISTS "
    "FOR (n:Topic) REQUIRE (n.tenant_id, n.topic_id) IS UNIQUE",
    "CREATE INDEX pml_section_document IF NOT EXISTS "
    "FOR (n:SectionContext) ON (n.tenant_id, n.document_id)",
    "CREATE INDEX pml_mentioned_in_document IF NOT EXISTS "
    "FOR ()-[r:MENTIONED_IN]-() ON (r.document_id)",
)
