"""Corpora planted straight into the real Neo4j and the chunk index, as the ingestion passes
would leave them: each document one section under the topic of its title, with its mentions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import neo4j

from pml_common.concepts import canonical_key
from pml_common.context_id import make_context_id
from pml_common.events import ChunkPayload
from pml_search.chunk_index import ChunkIndex

_PLANT = (
    "MERGE (d:Document {tenant_id: $t, document_id: $doc}) "
    "SET d.title = $title, d.section_count = 1 "
    "MERGE (x:Topic {tenant_id: $t, topic_id: $topic}) SET x.name = $title "
    "MERGE (d)-[h:HAS_TOPIC {tenant_id: $t}]->(x) SET h.salience = 1.0 "
    "MERGE (s:SectionContext {tenant_id: $t, context_id: $cid}) "
    "SET s.document_id = $doc, s.section_path = $title, s.text = $text, "
    "s.topic_ids = [$topic] "
    "MERGE (s)-[:IN_DOC {tenant_id: $t}]->(d) "
    "WITH s UNWIND $mentions AS m "
    "MERGE (c:CanonicalConcept {tenant_id: $t, canonical_name: m[0]}) "
    "SET c.name = m[1], "
    "c.concept_type = CASE WHEN m[3] = '' THEN 'CONCEPT' ELSE 'ENTITY' END, "
    "c.entity_label = CASE WHEN m[3] = '' THEN null ELSE m[3] END "
    "MERGE (c)-[r:MENTIONED_IN {tenant_id: $t}]->(s) "
    "SET r.salience = m[2], r.document_id = $doc"
)


@dataclass(frozen=True)
class Doc:
    doc_id: str
    title: str
    text: str
    #: concept name -> salience
    mentions: Mapping[str, float]
    #: concept name -> NER label, for the named entities among the mentions
    entities: Mapping[str, str] = field(default_factory=dict)

    @property
    def context_id(self) -> str:
        return make_context_id(self.doc_id, self.title)


async def plant(driver: neo4j.AsyncDriver, tenant: str, docs: tuple[Doc, ...]) -> None:
    """The documents' sections, topics and mentions in the graph."""
    for doc in docs:
        mentions = [
            [canonical_key(name), name, salience, doc.entities.get(name, "")]
            for name, salience in doc.mentions.items()
        ]
        await driver.execute_query(
            _PLANT,
            {
                "t": tenant,
                "doc": doc.doc_id,
                "title": doc.title,
                "topic": canonical_key(doc.title),
                "cid": doc.context_id,
                "text": doc.text,
                "mentions": mentions,
            },
        )


async def index(chunks: ChunkIndex, tenant: str, docs: tuple[Doc, ...]) -> None:
    """Each document's text as one chunk of its section."""
    for doc in docs:
        chunk = ChunkPayload(
            chunk_id=f"{doc.context_id}:0",
            context_id=doc.context_id,
            section_path=doc.title,
            text=doc.text,
            char_start=0,
            char_end=len(doc.text),
        )
        await chunks.index_document(tenant, doc.doc_id, [chunk])
