"""Graph-first Ask in-process against the real Neo4j, Redis and an embedded vector store.

The graph is written here by hand in the model of seed 001 §3 (what the ingest passes write,
see `pml_common.knowledge_graph`), so that shapes ingestion never makes can be planted: a
relation without evidence forming a shorter path than the evidenced one, which the runtime must
never reason on (invariant I2, "No Spurious Edge"). The real pipeline is exercised end to end by
tests/e2e/test_knowledge.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import neo4j
import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pml_common.concepts import canonical_key
from pml_common.context_id import make_context_id
from pml_common.events import ChunkPayload
from pml_common.settings import Settings
from pml_common.telemetry import setup_telemetry
from pml_search import knowledge
from pml_search.chunk_index import ChunkIndex
from pml_search.evidence_plan import PPR_FUSION, EvidencePlan
from pml_search.gds import GdsPaths
from pml_search.knowledge import (
    CYPHER,
    GDS_YEN,
    MIN_PLAN_CHUNKS,
    PLAN_CHUNKS_PER_K,
    KnowledgeEngine,
    invariant_violations,
)
from pml_search.paths import Mode

from . import planted

QUESTION = (
    "What is the process of transformation of a commercial proposal into an executable contract?"
)
EVIDENCED_PATH = (
    "commercial proposal",
    "solution quotation management",
    "service contract execution",
    "executable contract",
)


@dataclass(frozen=True)
class Doc:
    doc_id: str
    title: str
    sections: dict[str, str]  # heading -> text
    mentions: dict[str, dict[str, float]]  # heading -> concept name -> salience


DOCS = (
    Doc(
        "quotation",
        "Solution Quotation Management",
        {
            "Offers": "Solution Quotation Management prepares the commercial proposal. "
            "The commercial proposal is part of Solution Quotation Management.",
            "Approval": "A commercial proposal is part of Solution Quotation Management until "
            "it is signed.",
        },
        {
            "Offers": {"Solution Quotation Management": 0.9, "commercial proposal": 0.8},
            "Approval": {"Solution Quotation Management": 0.7, "commercial proposal": 0.9},
        },
    ),
    Doc(
        "contract",
        "Service Contract Execution",
        {
            "Scope": "Service Contract Execution requires Solution Quotation Management. "
            "The executable contract is part of Service Contract Execution.",
            "Operations": "Service Contract Execution requires Solution Quotation Management "
            "again. Every executable contract is part of Service Contract Execution.",
        },
        {
            "Scope": {
                "Service Contract Execution": 0.9,
                "Solution Quotation Management": 0.5,
                "executable contract": 0.6,
            },
            "Operations": {
                "Service Contract Execution": 0.9,
                "Solution Quotation Management": 0.5,
                "executable contract": 0.6,
            },
        },
    ),
    Doc(
        "digital",
        "Digital Transformation",
        {
            "Process": "Digital Transformation is the process of transformation of a company: "
            "the transformation process changes every process, proposal and contract.",
        },
        {"Process": {"Digital Transformation": 0.9, "transformation": 0.8, "process": 0.7}},
    ),
    Doc(
        "cloud",
        "AI-assisted Cloud Transformation",
        {
            "Overview": "AI-assisted Cloud Transformation is the process of transformation of "
            "legacy systems; each transformation step is planned by AI.",
        },
        {"Overview": {"AI-assisted Cloud Transformation": 0.9, "transformation": 0.7}},
    ),
)

#: (source, type, target, evidence headings as (doc, heading), quote)
RELATIONS = (
    (
        "commercial proposal",
        "PART_OF",
        "Solution Quotation Management",
        [("quotation", "Offers"), ("quotation", "Approval")],
        "The commercial proposal is part of Solution Quotation Management.",
    ),
    (
        "Service Contract Execution",
        "REQUIRES",
        "Solution Quotation Management",
        [("contract", "Scope"), ("contract", "Operations")],
        "Service Contract Execution requires Solution Quotation Management.",
    ),
    (
        "executable contract",
        "PART_OF",
        "Service Contract Execution",
        [("contract", "Scope"), ("contract", "Operations")],
        "The executable contract is part of Service Contract Execution.",
    ),
)
#: Relations nobody proved: a two-hop shortcut through "digital transformation".
UNPROVEN = (
    ("commercial proposal", "ENABLES", "Digital Transformation"),
    ("Digital Transformation", "ENABLES", "executable contract"),
)


def section_path(doc: Doc, heading: str) -> str:
    return f"{doc.title} / {heading}"


def context_of(doc_id: str, heading: str) -> str:
    doc = next(d for d in DOCS if d.doc_id == doc_id)
    return make_context_id(doc_id, section_path(doc, heading))


async def write(driver: neo4j.AsyncDriver, query: str, **params: Any) -> None:
    await driver.execute_query(query, params)


async def build_graph(driver: neo4j.AsyncDriver, tenant: str, unproven: bool = True) -> None:
    for doc in DOCS:
        await write(
            driver,
            "MERGE (d:Document {tenant_id: $t, document_id: $doc}) "
            "SET d.title = $title, d.section_count = $n",
            t=tenant,
            doc=doc.doc_id,
            title=doc.title,
            n=len(doc.sections),
        )
        topic = canonical_key(doc.title)
        await write(
            driver,
            "MATCH (d:Document {tenant_id: $t, document_id: $doc}) "
            "MERGE (x:Topic {tenant_id: $t, topic_id: $topic}) SET x.name = $title "
            "MERGE (d)-[h:HAS_TOPIC {tenant_id: $t}]->(x) SET h.salience = 1.0",
            t=tenant,
            doc=doc.doc_id,
            topic=topic,
            title=doc.title,
        )
        for heading, text in doc.sections.items():
            path = section_path(doc, heading)
            await write(
                driver,
                "MATCH (d:Document {tenant_id: $t, document_id: $doc}) "
                "MERGE (s:SectionContext {tenant_id: $t, context_id: $cid}) "
                "SET s.document_id = $doc, s.section_path = $path, s.text = $text, "
                "s.topic_ids = [$topic] "
                "MERGE (s)-[:IN_DOC {tenant_id: $t}]->(d)",
                t=tenant,
                doc=doc.doc_id,
                cid=make_context_id(doc.doc_id, path),
                path=path,
                text=text,
                topic=topic,
            )
            for name, salience in doc.mentions[heading].items():
                await write(
                    driver,
                    "MATCH (s:SectionContext {tenant_id: $t, context_id: $cid}) "
                    "MERGE (c:CanonicalConcept {tenant_id: $t, canonical_name: $key}) "
                    "SET c.name = $name, c.concept_type = 'CONCEPT' "
                    "MERGE (c)-[m:MENTIONED_IN {tenant_id: $t}]->(s) "
                    "SET m.salience = $salience, m.document_id = $doc",
                    t=tenant,
                    cid=make_context_id(doc.doc_id, path),
                    key=canonical_key(name),
                    name=name,
                    salience=salience,
                    doc=doc.doc_id,
                )
    for source, rtype, target, where, quote in RELATIONS:
        contexts = [context_of(d, h) for d, h in where]
        await relate(driver, tenant, source, rtype, target, contexts, [quote] * len(contexts))
    if unproven:
        for source, rtype, target in UNPROVEN:
            await relate(driver, tenant, source, rtype, target, [], [], confidence=0.95)


async def relate(
    driver: neo4j.AsyncDriver,
    tenant: str,
    source: str,
    rtype: str,
    target: str,
    contexts: Sequence[str],
    quotes: Sequence[str],
    confidence: float = 0.7,
) -> None:
    # Test data only: the relation type comes from the constants above, never from input.
    await write(
        driver,
        "MATCH (a:CanonicalConcept {tenant_id: $t, canonical_name: $a}) "
        "MATCH (b:CanonicalConcept {tenant_id: $t, canonical_name: $b}) "
        f"MERGE (a)-[r:{rtype}]->(b) "
        "SET r.tenant_id = $t, r.relation_type = $rtype, r.confidence = $confidence, "
        "r.evidence_context_ids = $contexts, r.evidence_ids = $contexts, "
        "r.evidence_quotes = $quotes, r.evidence_document_ids = $docs",
        t=tenant,
        a=canonical_key(source),
        b=canonical_key(target),
        rtype=rtype,
        confidence=confidence,
        contexts=list(contexts),
        quotes=list(quotes),
        docs=[c.split(":")[1] for c in contexts],
    )


async def index_chunks(index: ChunkIndex, tenant: str) -> None:
    for doc in DOCS:
        chunks = []
        for heading, text in doc.sections.items():
            path = section_path(doc, heading)
            cid = make_context_id(doc.doc_id, path)
            chunks.append(
                ChunkPayload(
                    chunk_id=f"{cid}:0",
                    context_id=cid,
                    section_path=path,
                    text=text,
                    char_start=0,
                    char_end=len(text),
                )
            )
        await index.index_document(tenant, doc.doc_id, chunks)


class RecordedGds:
    """A GDS reader that answers like the plugin: Yen rows recorded for this graph."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.queries: list[str] = []

    async def __call__(self, query: str, **params: Any) -> list[dict[str, Any]]:
        self.queries.append(query)
        if "SHOW PROCEDURES" in query:
            return [{"found": 1}]
        if "gds.graph.project" in query:
            return [{"nodes": 5, "relationships": 10}]
        if "gds.shortestPath.yens.stream" in query:
            return self.rows
        return []


@pytest.fixture
async def built(engine: KnowledgeEngine, graph_db, tenant: str) -> str:
    await build_graph(graph_db, tenant)
    await index_chunks(engine.chunks, tenant)
    return tenant


#: Both graph methods (the bridge hop of `evidence_plan`, the walk of `propagation`) search the
#: same paths and must hold the same invariants.
GRAPH_METHODS = pytest.mark.parametrize("method", ["graph-first", "graph-ppr"])


@GRAPH_METHODS
async def test_reasoned_answer_follows_the_evidenced_path_not_the_unproven_shortcut(
    engine: KnowledgeEngine, built: str, method: str
) -> None:
    answer = await engine.ask(built, QUESTION, 4, method)
    assert answer.method == method
    assert answer.mode is Mode.REASONED
    assert answer.path_finder == CYPHER  # community Neo4j here: no GDS
    assert {"commercial proposal", "executable contract"} <= {s.key for s in answer.seeds}
    [path] = answer.paths
    # Path Recovery: exactly the chain stored in Neo4j, edge by edge.
    assert path.nodes == EVIDENCED_PATH
    assert [(e.source, e.relation, e.target) for e in path.edges] == [
        ("commercial proposal", "PART_OF", "solution quotation management"),
        ("service contract execution", "REQUIRES", "solution quotation management"),
        ("executable contract", "PART_OF", "service contract execution"),
    ]
    # Evidence Alignment and No Spurious Edge: every REASONED edge has evidence; the shorter
    # unproven shortcut through "digital transformation" is never a path.
    assert all(e.evidenced and len(e.evidence) == 2 for e in path.edges)
    assert path.evidence_coverage == 1.0
    assert invariant_violations(answer) == []
    # The evidence chunks are the path's sections, not the "transformation" documents.
    assert {c.hit.document_id for c in answer.chunks[:3]} <= {"quotation", "contract"}
    evidence_sections = set(path.context_ids())
    assert evidence_sections <= set(answer.plan.weights)
    assert all(c.hit.context_id in answer.plan.weights for c in answer.chunks)


async def test_vector_only_is_pulled_to_the_transformation_documents(
    engine: KnowledgeEngine, built: str
) -> None:
    answer = await engine.ask(built, QUESTION, 2, "vector")
    assert answer.mode is Mode.TEXT_ONLY and answer.reads == ["vector"]
    assert answer.seeds == [] and answer.paths == []
    assert {c.hit.document_id for c in answer.chunks} & {"digital", "cloud"}


@GRAPH_METHODS
async def test_unproven_relations_alone_never_make_an_answer_reasoned(
    engine: KnowledgeEngine, graph_db, tenant: str, method: str
) -> None:
    await build_graph(graph_db, tenant)
    await index_chunks(engine.chunks, tenant)
    # Only the unproven shortcut joins these two: the answer is anchored, not reasoned.
    question = "How does digital transformation relate to an executable contract?"
    answer = await engine.ask(tenant, question, 4, method)
    assert answer.mode is Mode.ANCHORED
    assert answer.paths == []
    assert invariant_violations(answer) == []
    assert answer.chunks and all(c.hit.context_id for c in answer.chunks)


@GRAPH_METHODS
async def test_paths_follow_no_relation_below_the_minimum_confidence(
    engine: KnowledgeEngine, built: str, method: str
) -> None:
    engine.reads.min_confidence = 0.8  # the evidenced chain is stored at 0.7
    answer = await engine.ask(built, QUESTION, 4, method)
    assert answer.paths == [] and answer.mode is Mode.ANCHORED
    assert invariant_violations(answer) == []
    engine.reads.min_confidence = 0.7
    assert (await engine.ask(built, QUESTION, 4, method)).mode is Mode.REASONED


async def test_chunks_from_outside_a_short_plan_are_counted_and_never_weighted(
    engine: KnowledgeEngine, built: str
) -> None:
    question = "Where is the commercial proposal signed?"  # the plan: quotes and contracts
    assert (await engine.ask(built, question, 2, "graph-first")).topped_up == 0
    total = sum(len(doc.sections) for doc in DOCS)
    every = await engine.ask(built, question, total, "graph-first")
    outside = [c for c in every.chunks if c.hit.context_id not in every.plan.weights]
    assert len(every.chunks) == total
    assert every.topped_up == len(outside) > 0
    assert all(c.plan_weight == 0 for c in outside)
    assert every.chunks[-len(outside) :] == outside  # after every chunk of the plan
    assert invariant_violations(every) == []


async def test_every_chunk_of_the_plan_is_weighed_not_only_the_nearest(
    engine: KnowledgeEngine, tenant: str
) -> None:
    # 80 planned sections near the question by cosine, and the plan's heaviest far from it:
    # more than the plan chunks a question of k = 2 reads by cosine alone (MIN_PLAN_CHUNKS)
    near = {
        f"near{i}": f"Clause {i} of the service contract sets when the contract is signed."
        for i in range(80)
    }
    chunks = {**near, "far": "Zebras graze quietly at dawn on the savannah."}
    await engine.chunks.index_documents(
        tenant,
        {
            doc: [
                ChunkPayload(
                    chunk_id=doc,
                    context_id=doc,
                    section_path="",
                    text=text,
                    char_start=0,
                    char_end=len(text),
                )
            ]
            for doc, text in chunks.items()
        },
    )
    assert len(chunks) > max(MIN_PLAN_CHUNKS, PLAN_CHUNKS_PER_K * 2)
    plan = EvidencePlan(weights={**dict.fromkeys(near, 0.01), "far": 1.0}, fusion=PPR_FUSION)
    (vector,) = await engine.chunks.embedder.embed_queries(["When is the service contract signed?"])
    ranked = await engine._plan_chunks(tenant, np.asarray(vector), 2, plan)
    assert ranked[0].hit.chunk_id == "far" and ranked[0].plan_weight == 1.0
    assert ranked[0].semantic < min(c.semantic for c in ranked[1:])


@pytest.mark.parametrize("method", ["", "graph-ppr"])
async def test_modes_degrade_gracefully(engine: KnowledgeEngine, built: str, method: str) -> None:
    anchored = await engine.ask(built, "Tell me about AI-assisted cloud transformation", 3, method)
    assert anchored.mode is Mode.ANCHORED
    assert anchored.chunks[0].hit.document_id == "cloud"
    assert anchored.chunks[0].plan_weight > 0
    nothing = await engine.ask(built, "Zebras graze quietly at dawn", 3, method or "graph-first")
    assert nothing.mode is Mode.TEXT_ONLY
    assert nothing.reads == ["graph", "vector"]  # I1: the graph was asked first, even here
    assert nothing.seeds == [] and not nothing.plan
    assert len(nothing.chunks) == 3 and all(c.plan_weight == 0 for c in nothing.chunks)
    assert nothing.topped_up == 3
    propagate = ["propagate"] if method == "graph-ppr" else []
    links = ["links"] if method == "graph-ppr" else []
    for answer in (anchored, nothing):
        assert invariant_violations(answer) == []
        assert [s for s, _ in answer.stages.timings] == [
            "seeds",
            "paths",
            *propagate,
            "plan",
            "embed",
            "vector",
            *links,
        ]


@GRAPH_METHODS
async def test_tenants_never_see_each_other(
    engine: KnowledgeEngine, built: str, method: str
) -> None:
    other = f"{built}-other"
    answer = await engine.ask(other, QUESTION, 4, method)
    assert answer.mode is Mode.TEXT_ONLY
    assert answer.seeds == [] and answer.paths == [] and answer.chunks == []


async def test_gds_yen_rows_drive_the_same_scoring_and_selection(
    engine: KnowledgeEngine, built: str
) -> None:
    """GDS cannot run on this machine's community Neo4j: the plugin's rows for this graph are
    recorded, and everything after them (edges, §8bis score, selection, plan) runs for real."""
    rows = [
        {
            "source": "commercial proposal",
            "target": "executable contract",
            "index": 1,
            "totalCost": 0.1,
            "nodes": ["commercial proposal", "digital transformation", "executable contract"],
        },
        {
            "source": "commercial proposal",
            "target": "executable contract",
            "index": 2,
            "totalCost": 1.07,
            "nodes": list(EVIDENCED_PATH),
        },
    ]
    recorded = RecordedGds(rows)
    engine.gds = GdsPaths(recorded, "test")
    answer = await engine.ask(built, QUESTION, 4, "graph-first")
    assert answer.path_finder == GDS_YEN
    assert [p.nodes for p in answer.paths] == [EVIDENCED_PATH]  # the unproven one is rejected
    assert answer.mode is Mode.REASONED
    assert invariant_violations(answer) == []
    assert sum("gds.graph.project" in q for q in recorded.queries) == 1


async def test_each_stage_is_a_span_of_the_request(engine: KnowledgeEngine, built: str) -> None:
    exporter = InMemorySpanExporter()
    setup_telemetry("search-test", Settings(), span_exporter=exporter)
    with trace.get_tracer("test").start_as_current_span("request") as request:
        answer = await engine.ask(built, QUESTION, 4, "graph-first")
    stages = [s for s in exporter.get_finished_spans() if s.name.startswith("ask.")]
    assert [s.name for s in stages] == [f"ask.{name}" for name, _ in answer.stages.timings]
    parent = request.get_span_context()
    assert all(s.parent is not None and s.parent.span_id == parent.span_id for s in stages)
    assert all(s.context.trace_id == parent.trace_id for s in stages)
    by_name = {s.name: s for s in stages}
    assert by_name["ask.paths"].attributes["pml.path_finder"] == CYPHER
    assert by_name["ask.vector"].attributes["pml.mode"] == "REASONED"


# --- graph-ppr follows the names its best answers write (`LINK_BONUS`) ------------------------

#: The shape of a bridge question: the question names a character and asks who created the
#: series she is from. The character's own text names the series, whose text shares none of
#: the question's words; three other characters' texts mention her, and hers names none of them.
KATE = planted.Doc(
    "kate",
    "Kate Ramsay",
    "Kate Ramsay is a fictional character from the Australian soap opera Neighbours.",
    {
        "Kate Ramsay": 0.9,
        "fictional character": 0.5,
        "Australian soap opera": 0.6,
        "Neighbours": 0.5,
    },
)
NEIGHBOURS = planted.Doc(
    "neighbours",
    "Neighbours",
    "Neighbours is a serial first broadcast in 1985; Reg Watson devised it for Seven.",
    {"Neighbours": 0.9, "Reg Watson": 0.6, "Seven": 0.4},
)
SIBLINGS = tuple(
    planted.Doc(
        f"sibling{i}",
        name,
        f"{name} is a cousin of Kate Ramsay who left Erinsborough in 2003.",
        {name: 0.9, "Kate Ramsay": 0.6, "Erinsborough": 0.4},
    )
    for i, name in enumerate(("Sophie Ramsay", "Max Ramsay", "Madge Bishop"))
)
LINK_QUESTION = "Kate Ramsay is a fictional character from an Australian soap opera created by who?"


@pytest.fixture
async def bridged(engine: KnowledgeEngine, graph_db, tenant: str) -> str:
    corpus = (KATE, NEIGHBOURS, *SIBLINGS)
    await planted.plant(graph_db, tenant, corpus)
    await planted.index(engine.chunks, tenant, corpus)
    return tenant


async def test_the_document_a_best_answer_names_ranks_above_those_that_mention_it(
    engine: KnowledgeEngine, bridged: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = await engine.ask(bridged, LINK_QUESTION, 5, "graph-ppr")
    documents = [c.hit.document_id for c in answer.chunks]
    assert documents[:2] == ["kate", "neighbours"], documents
    series = answer.chunks[1]
    assert series.named_by == KATE.context_id and series.plan_weight > 0
    assert not any(c.named_by for c in answer.chunks if c.hit.document_id != "neighbours")
    assert [s for s, _ in answer.stages.timings][-1] == "links"
    assert invariant_violations(answer) == []
    # what the link does: without it, characters that mention Kate Ramsay rank above
    monkeypatch.setattr(knowledge, "LINK_BONUS", 0.0)
    unlinked = await engine.ask(bridged, LINK_QUESTION, 5, "graph-ppr")
    documents = [c.hit.document_id for c in unlinked.chunks]
    assert documents.index("neighbours") > documents.index("sibling1"), documents
    # graph-first plans its own bridge hop and follows no link
    first = await engine.ask(bridged, LINK_QUESTION, 5, "graph-first")
    assert "links" not in {s for s, _ in first.stages.timings}


async def test_the_reads_of_links_stay_within_the_tenant(
    engine: KnowledgeEngine, bridged: str
) -> None:
    within = [KATE.context_id, NEIGHBOURS.context_id, "sec:nowhere"]
    mentioned, topics = await engine.reads.link_rows(bridged, [KATE.context_id], within)
    assert set(mentioned[KATE.context_id]) == {canonical_key(n) for n in KATE.mentions}
    assert topics == {
        KATE.context_id: [canonical_key(KATE.title)],
        NEIGHBOURS.context_id: [canonical_key(NEIGHBOURS.title)],
    }
    assert await engine.reads.link_rows(f"{bridged}-other", [KATE.context_id], within) == ({}, {})
