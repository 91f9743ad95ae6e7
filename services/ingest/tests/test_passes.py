"""Every pass against the real Neo4j and Redis: what each writes, and the lifecycle rules."""

from __future__ import annotations

from typing import Any

import neo4j
from opentelemetry import trace
from opentelemetry.context import Context

from pml_common.context_id import make_context_id
from pml_common.events import (
    ChunkingCompleted,
    ChunksExtracted,
    DocumentDeleted,
    DocumentSubmitted,
    Event,
    Pass1Completed,
    Pass3Completed,
    TenantDeleted,
)
from pml_common.knowledge_graph import SEMANTIC_RELATION_TYPES
from pml_common.settings import Settings
from pml_common.telemetry import extract_trace, inject_trace, setup_telemetry

SALES = """# Sales Process

## 1 Quotations

Solution Quotation Management prepares every offer for the customer.
Service Contract Execution requires Solution Quotation Management.

## 2 Contracts

Service Contract Execution requires Solution Quotation Management to have approved the offer.
The signed contract starts Service Contract Execution.
"""

TRANSFORMATION = """# Digital Transformation

Digital Transformation changes how companies work. AI-assisted Cloud Transformation moves
workloads to the cloud.
"""

FRENCH = """# Processus de vente

La gestion des devis prépare chaque offre pour le client. Le contrat de service nécessite la
gestion des devis.
"""


def submitted(tenant: str, doc: str, text: str, title: str = "") -> DocumentSubmitted:
    return DocumentSubmitted.create(tenant_id=tenant, document_id=doc, title=title, text=text)


async def q(driver: neo4j.AsyncDriver, query: str, **params: Any) -> list[dict[str, Any]]:
    records, _, _ = await driver.execute_query(query, params)
    return [r.data() for r in records]


async def counts(driver: neo4j.AsyncDriver, tenant: str) -> dict[str, int]:
    nodes = await q(
        driver,
        "MATCH (n {tenant_id: $t}) UNWIND labels(n) AS l RETURN l, count(*) AS n",
        t=tenant,
    )
    rels = await q(
        driver,
        "MATCH ()-[r {tenant_id: $t}]->() RETURN type(r) AS l, count(*) AS n",
        t=tenant,
    )
    return {row["l"]: row["n"] for row in nodes + rels}


async def test_chunking_writes_sections_with_the_chunks_context_ids(pipeline, tenant, graph_db):
    await pipeline.chunking.on_submitted(submitted(tenant, "sales", SALES))
    [extracted] = pipeline.recorder.of(ChunksExtracted)
    [done] = pipeline.recorder.of(ChunkingCompleted)
    rows = await q(
        graph_db,
        "MATCH (s:SectionContext {tenant_id: $t})-[:IN_DOC]->(d:Document {document_id: 'sales'})"
        " RETURN s.context_id AS id, s.section_path AS path, s.chunk_ids AS chunks",
        t=tenant,
    )
    assert {r["path"] for r in rows} == {
        "Sales Process / 1 Quotations",
        "Sales Process / 2 Contracts",
    }
    for row in rows:
        assert row["id"] == make_context_id("sales", row["path"])
    graph_ids = {r["id"] for r in rows}
    assert {c.context_id for c in extracted.chunks} == graph_ids
    assert {c.chunk_id for c in extracted.chunks} == {c for r in rows for c in r["chunks"]}
    assert done.content_hash
    status = await pipeline.status.get(tenant, "sales")
    assert status is not None and status.passes[0].state == "done"


def _trace_id(event: Event) -> int:
    return trace.get_current_span(extract_trace(event.trace)).get_span_context().trace_id


async def test_a_batch_publishes_each_documents_next_events_in_that_documents_trace(
    pipeline, tenant
):
    setup_telemetry("pml-ingest-test", Settings())
    tracer = trace.get_tracer(__name__)
    submissions = []
    for doc, text in (("sales", SALES), ("digital", TRANSFORMATION)):
        with tracer.start_as_current_span(f"submit {doc}"):
            event = submitted(tenant, doc, text)
            submissions.append(event.model_copy(update={"trace": inject_trace()}))
    trace_of = {e.document_id: _trace_id(e) for e in submissions}
    assert len(set(trace_of.values())) == 2 and 0 not in trace_of.values()

    # The bus runs a batch handler in a span of a new trace (linked to each event's).
    with tracer.start_as_current_span("consume batch", context=Context()) as batch:
        await pipeline.chunking.on_submitted_batch(submissions)
    chunked = pipeline.recorder.of(ChunkingCompleted)
    with tracer.start_as_current_span("consume batch", context=Context()):
        await pipeline.pass1.handle_batch(chunked)

    published = [
        *chunked,
        *pipeline.recorder.of(ChunksExtracted),
        *pipeline.recorder.of(Pass1Completed),
    ]
    assert len(published) == 6
    for event in published:
        assert _trace_id(event) == trace_of[event.document_id] != batch.get_span_context().trace_id


async def test_all_passes_build_the_graph_with_evidence(pipeline, tenant, graph_db):
    await pipeline.run(submitted(tenant, "sales", SALES))
    await pipeline.run(submitted(tenant, "digital", TRANSFORMATION))
    assert len(pipeline.recorder.of(Pass3Completed)) == 2
    status = await pipeline.status.get(tenant, "sales")
    assert status is not None and status.done

    mentions = await q(
        graph_db,
        "MATCH (c:CanonicalConcept {tenant_id: $t})-[m:MENTIONED_IN]->(s:SectionContext)"
        " RETURN c.canonical_name AS key, m.salience AS salience, s.document_id AS doc",
        t=tenant,
    )
    keys = {m["key"] for m in mentions}
    assert {"solution quotation management", "service contract execution"} <= keys
    assert all(0 <= m["salience"] <= 1 for m in mentions)

    topics = await q(
        graph_db,
        "MATCH (:Document {tenant_id: $t, document_id: 'sales'})-[h:HAS_TOPIC]->(t:Topic)"
        " OPTIONAL MATCH (t)-[c:COVERS]->(k:CanonicalConcept)"
        " RETURN t.topic_id AS topic, collect(k.canonical_name) AS covered",
        t=tenant,
    )
    by_topic = {row["topic"]: set(row["covered"]) for row in topics}
    assert set(by_topic) == {"sale process", "quotation", "contract"}
    assert "solution quotation management" in by_topic["quotation"]

    [relation] = await q(
        graph_db,
        "MATCH (a:CanonicalConcept {tenant_id: $t})-[r]->(b:CanonicalConcept)"
        " RETURN type(r) AS type, a.canonical_name AS a, b.canonical_name AS b, properties(r) AS r",
        t=tenant,
    )
    assert relation["type"] == "REQUIRES"
    assert (relation["a"], relation["b"]) == (
        "service contract execution",
        "solution quotation management",
    )
    r = relation["r"]
    assert len(r["evidence_context_ids"]) == 2 and r["multi_evidence"]
    assert r["evidence_ids"] == r["evidence_context_ids"]
    sections = await q(
        graph_db,
        "MATCH (s:SectionContext {tenant_id: $t}) WHERE s.context_id IN $ids"
        " RETURN s.context_id AS id, s.text AS text",
        t=tenant,
        ids=r["evidence_context_ids"],
    )
    text_of = {s["id"]: s["text"] for s in sections}
    for context_id, quote in zip(r["evidence_context_ids"], r["evidence_quotes"], strict=True):
        assert quote in text_of[context_id]
    fine = await q(
        graph_db,
        "MATCH (c:CanonicalConcept {tenant_id: $t}) WHERE c.fine_type IS NULL RETURN c",
        t=tenant,
    )
    assert fine == []
    # topics are scope only: no semantic relation ever touches a Topic
    assert (
        await q(
            graph_db,
            "MATCH (:Topic {tenant_id: $t})-[r]-() WHERE type(r) IN $types RETURN r",
            t=tenant,
            types=sorted(SEMANTIC_RELATION_TYPES),
        )
        == []
    )


async def test_french_document_gets_french_concepts(pipeline, tenant, graph_db):
    await pipeline.run(submitted(tenant, "fr", FRENCH))
    [doc] = await q(
        graph_db, "MATCH (d:Document {tenant_id: $t}) RETURN d.language AS language", t=tenant
    )
    assert doc["language"] == "fr"
    keys = {
        r["key"]
        for r in await q(
            graph_db,
            "MATCH (c:CanonicalConcept {tenant_id: $t}) RETURN c.canonical_name AS key",
            t=tenant,
        )
    }
    assert "gestion des devis" in keys


async def test_reingest_is_idempotent_and_a_change_replaces(pipeline, tenant, graph_db):
    await pipeline.run(submitted(tenant, "sales", SALES))
    first = await counts(graph_db, tenant)
    await pipeline.run(submitted(tenant, "sales", SALES))
    assert await counts(graph_db, tenant) == first

    changed = SALES.replace("Service Contract Execution requires", "Billing follows")
    await pipeline.run(submitted(tenant, "sales", changed))
    assert (
        await q(
            graph_db,
            "MATCH (:CanonicalConcept {tenant_id: $t})-[r:REQUIRES]->() RETURN r",
            t=tenant,
        )
        == []
    )
    texts = await q(
        graph_db, "MATCH (s:SectionContext {tenant_id: $t}) RETURN s.text AS text", t=tenant
    )
    assert all("requires" not in row["text"] for row in texts)


async def test_delete_keeps_what_other_documents_support(pipeline, tenant, graph_db):
    await pipeline.run(submitted(tenant, "sales", SALES))
    await pipeline.run(submitted(tenant, "digital", TRANSFORMATION))
    other = """# Support

Service Contract Execution requires Solution Quotation Management in every region.
"""
    await pipeline.run(submitted(tenant, "support", other))
    [before] = await q(
        graph_db,
        "MATCH ()-[r:REQUIRES {tenant_id: $t}]->() RETURN r.document_ids AS docs",
        t=tenant,
    )
    assert set(before["docs"]) == {"sales", "support"}

    await pipeline.run(DocumentDeleted.create(tenant_id=tenant, document_id="sales"))
    # one weak evidence left: the relation goes, the concepts stay (support mentions them)
    assert await q(graph_db, "MATCH ()-[r:REQUIRES {tenant_id: $t}]->() RETURN r", t=tenant) == []
    keys = {
        r["key"]
        for r in await q(
            graph_db,
            "MATCH (c:CanonicalConcept {tenant_id: $t}) RETURN c.canonical_name AS key",
            t=tenant,
        )
    }
    assert "service contract execution" in keys
    assert "signed contract" not in keys  # only the deleted document mentioned it
    assert (
        await q(
            graph_db,
            "MATCH (n {tenant_id: $t}) WHERE n.document_id = 'sales' RETURN n",
            t=tenant,
        )
        == []
    )
    assert await pipeline.status.get(tenant, "sales") is None

    await pipeline.run(DocumentDeleted.create(tenant_id=tenant, document_id="support"))
    await pipeline.run(DocumentDeleted.create(tenant_id=tenant, document_id="digital"))
    assert await counts(graph_db, tenant) == {}


async def test_requests_handled_out_of_order_apply_in_the_order_made(pipeline, tenant, graph_db):
    """A submission and a deletion travel on different streams: whichever is handled first, the
    one requested last wins, and an older version never replaces a newer one."""
    first = submitted(tenant, "sales", SALES)
    deleted = DocumentDeleted.create(tenant_id=tenant, document_id="sales")
    await pipeline.run(deleted)  # handled before the submission it follows
    await pipeline.run(first)
    assert await counts(graph_db, tenant) == {}
    assert await pipeline.status.get(tenant, "sales") is None
    assert not any(isinstance(e, ChunksExtracted) for e in pipeline.recorder.events)

    changed = SALES.replace("Service Contract Execution requires", "Billing follows")
    newer = submitted(tenant, "sales", changed)
    await pipeline.run(newer)
    state = await counts(graph_db, tenant)
    await pipeline.run(first)  # the older version, late
    await pipeline.run(deleted)  # the deletion, later still
    assert await counts(graph_db, tenant) == state
    texts = await q(
        graph_db, "MATCH (s:SectionContext {tenant_id: $t}) RETURN s.text AS text", t=tenant
    )
    assert texts and all("requires" not in row["text"] for row in texts)
    [chunks] = [e for e in pipeline.recorder.events if isinstance(e, ChunksExtracted)]
    assert chunks.submitted_at == newer.occurred_at  # search orders the chunks by it


async def test_tenants_are_isolated(pipeline, tenant, graph_db):
    other = f"{tenant}-other"
    await pipeline.run(submitted(tenant, "sales", SALES))
    await pipeline.run(submitted(other, "sales", SALES))
    mine = await counts(graph_db, tenant)
    assert await counts(graph_db, other) == mine
    await pipeline.run(DocumentDeleted.create(tenant_id=other, document_id="sales"))
    assert await counts(graph_db, tenant) == mine
    assert await counts(graph_db, other) == {}
    await pipeline.chunking.on_tenant_deleted(TenantDeleted.create(tenant_id=tenant))
    assert await counts(graph_db, tenant) == {}
    assert await pipeline.status.documents(tenant) == []
    assert await pipeline.status.get(tenant, "sales") is None
