"""The five ingestion passes, each the handler of one event in its own consumer group.

    DocumentSubmitted ─chunking→ ChunksExtracted (for search) + ChunkingCompleted
    ChunkingCompleted ─pass1→ Pass1Completed ─pass2a→ Pass2aCompleted ─pass2b→ Pass2bCompleted
    Pass2bCompleted ─pass3→ Pass3Completed
    DocumentDeleted ─chunking group→ the document's contribution removed
    TenantDeleted ─chunking group→ the tenant's knowledge graph and statuses removed

Every `*Completed` event carries the document's content hash; a pass whose event names another
hash than the document's current one skips it (a newer version is on its way, or the document
was deleted). Each pass records its state (running, done, failed with the error) in the status
store; a handler that raises leaves the event to the bus, which retries it and finally
dead-letters it with the reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import structlog
from opentelemetry import trace

from pml_common.bus import EventBus
from pml_common.concepts import detect_language, is_stop_concept
from pml_common.events import (
    ChunkingCompleted,
    ChunkPayload,
    ChunksExtracted,
    DocumentDeleted,
    DocumentSubmitted,
    Event,
    Pass1Completed,
    Pass2aCompleted,
    Pass2bCompleted,
    Pass3Completed,
    TenantDeleted,
    _PassCompleted,
)
from pml_common.latest_wins import LatestWins
from pml_common.settings import Settings
from pml_ingest.chunker import Section, chunk_document
from pml_ingest.classification import fine_type
from pml_ingest.documents import PoisonDocument, content_hash, text_problem
from pml_ingest.extraction import ConceptExtractor, SectionInput
from pml_ingest.graph_store import GraphStore
from pml_ingest.policy import decide
from pml_ingest.status import DONE, FAILED, PASSES, RUNNING, StatusStore
from pml_ingest.topics import SectionOutline, covers, document_topics
from pml_ingest.verifier import Verdict, Verifier, build_verifier

log = structlog.get_logger(__name__)
_tracer = trace.get_tracer("pml_ingest.passes")
T = TypeVar("T")

#: Candidate pairs whose relations are replaced per transaction in Pass 3.
PAIR_BATCH = 50


class Publisher(Protocol):
    async def publish(self, event: Event) -> str: ...


def group_of(pass_name: str) -> str:
    """Consumer group of a pass worker."""
    return f"ingest-{pass_name}"


def batches(rows: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


@dataclass
class PassRuntime:
    """What every pass needs: the graph, the status store, the bus, the settings."""

    store: GraphStore
    status: StatusStore
    publisher: Publisher
    settings: Settings
    #: Orders submissions and deletions of a document by when they were made (chunking only).
    claims: LatestWins

    async def pause_after_first_write(self, pass_name: str, doc: str) -> None:
        """Test hook (`ingest_pause_after_first_write_s`): hold still mid-document."""
        pause = self.settings.ingest_pause_after_first_write_s
        if pause > 0:
            log.warning("ingest.paused_mid_document", pass_name=pass_name, document_id=doc)
            await asyncio.sleep(pause)


class Pass:
    """Base of the passes after chunking: staleness check, status, span, next event."""

    name: str
    consumes: type[_PassCompleted]
    produces: type[_PassCompleted]

    def __init__(self, runtime: PassRuntime) -> None:
        self.rt = runtime

    def subscribe(self, bus: EventBus) -> None:
        bus.subscribe(self.consumes, group_of(self.name), self.handle)

    async def handle(self, event: _PassCompleted) -> None:
        tenant, doc, chash = event.tenant_id, event.document_id, event.content_hash
        state = await self.rt.store.document_state(tenant, doc)
        if state is None or state.content_hash != chash:
            log.info("ingest.stale_event_skipped", pass_name=self.name, document_id=doc)
            return
        await self.rt.status.mark(tenant, doc, chash, self.name, RUNNING)
        with _tracer.start_as_current_span(
            f"ingest.{self.name}", attributes={"pml.tenant_id": tenant, "pml.document_id": doc}
        ):
            try:
                await self.run(tenant, doc, chash, state.language or "en")
            except Exception as exc:
                await self.rt.status.mark(
                    tenant, doc, chash, self.name, FAILED, f"{type(exc).__name__}: {exc}"
                )
                raise
        await self.rt.status.mark(tenant, doc, chash, self.name, DONE)
        await self.rt.publisher.publish(
            self.produces.create(tenant_id=tenant, document_id=doc, content_hash=chash)
        )
        log.info("ingest.pass_done", pass_name=self.name, tenant=tenant, document_id=doc)

    async def run(self, tenant: str, doc: str, chash: str, language: str) -> None:
        raise NotImplementedError


# --- chunking -------------------------------------------------------------------------------


class ChunkingPass:
    """DocumentSubmitted → sections in the graph, chunks to search, ChunkingCompleted.
    Also removes deleted documents and tenants (DocumentDeleted, TenantDeleted, same group)."""

    name = "chunking"

    def __init__(self, runtime: PassRuntime) -> None:
        self.rt = runtime
        # The three subscriptions run concurrently; a deletion must not interleave with the
        # writes of a submission (of the same document or tenant) in this process.
        self._serial = asyncio.Lock()

    def subscribe(self, bus: EventBus) -> None:
        bus.subscribe(DocumentSubmitted, group_of(self.name), self.on_submitted)
        bus.subscribe(DocumentDeleted, group_of(self.name), self.on_deleted)
        bus.subscribe(TenantDeleted, group_of(self.name), self.on_tenant_deleted)

    async def on_submitted(self, event: DocumentSubmitted) -> None:
        async with self._serial:
            await self._submitted(event)

    async def _submitted(self, event: DocumentSubmitted) -> None:
        tenant, doc = event.tenant_id, event.document_id
        if not await self.rt.claims.claim_document(tenant, doc, event.occurred_at):
            log.info("ingest.superseded_submission_skipped", tenant=tenant, document_id=doc)
            return
        chash = content_hash(event.title, event.text, event.format)
        await self.rt.status.ensure(tenant, doc, chash, event.title)
        state = await self.rt.store.document_state(tenant, doc)
        if state is not None and state.content_hash == chash == state.completed_hash:
            await self._unchanged(tenant, doc, chash)
            return
        await self.rt.status.mark(tenant, doc, chash, self.name, RUNNING)
        with _tracer.start_as_current_span(
            "ingest.chunking", attributes={"pml.tenant_id": tenant, "pml.document_id": doc}
        ):
            replacing = state is not None and state.content_hash != chash
            try:
                await self._chunk(event, chash, replacing=replacing)
            except Exception as exc:
                await self.rt.status.mark(
                    tenant, doc, chash, self.name, FAILED, f"{type(exc).__name__}: {exc}"
                )
                raise
        await self.rt.status.mark(tenant, doc, chash, self.name, DONE)
        await self.rt.publisher.publish(
            ChunkingCompleted.create(tenant_id=tenant, document_id=doc, content_hash=chash)
        )

    async def _unchanged(self, tenant: str, doc: str, chash: str) -> None:
        """The same content again: the graph already holds it, every pass is done."""
        for name in PASSES:
            await self.rt.status.mark(tenant, doc, chash, name, DONE)
        log.info("ingest.unchanged_document", tenant=tenant, document_id=doc)

    async def _chunk(self, event: DocumentSubmitted, chash: str, *, replacing: bool) -> None:
        tenant, doc = event.tenant_id, event.document_id
        problem = text_problem(event.text, self.rt.settings.ingest_max_document_chars)
        if problem:
            raise PoisonDocument(f"document {doc!r}: {problem}")
        sections = chunk_document(
            doc, event.title, event.text, event.format, self.rt.settings.ingest_chunk_chars
        )
        if not sections:
            raise PoisonDocument(f"document {doc!r}: no section with text")
        store = self.rt.store
        if replacing:
            # A changed document: what the old version contributed goes first.
            await store.remove_document(tenant, doc, keep_document=True)
        language = detect_language(f"{event.title}\n{event.text}")
        rows = [_section_row(s) for s in sections]
        batch_size = self.rt.settings.ingest_write_batch
        if len(rows) <= batch_size:
            await store.write_document(tenant, doc, event.title, event.format, language, rows)
            await self.rt.pause_after_first_write(self.name, doc)
        else:
            await store.upsert_document(tenant, doc, event.title, event.format, language, len(rows))
            for i, batch in enumerate(batches(rows, batch_size)):
                await store.write_sections(tenant, doc, batch)
                if i == 0:
                    await self.rt.pause_after_first_write(self.name, doc)
            await store.drop_stale_sections(tenant, doc, [s.context_id for s in sections])
        await self.rt.publisher.publish(
            ChunksExtracted.create(
                tenant_id=tenant,
                document_id=doc,
                chunks=_flatten_chunks(sections),
                submitted_at=event.occurred_at,
            )
        )
        # Last: until this is set, a redelivery redoes the whole pass.
        await store.mark_chunked(tenant, doc, chash)
        log.info("ingest.chunked", tenant=tenant, document_id=doc, sections=len(sections))

    async def on_deleted(self, event: DocumentDeleted) -> None:
        async with self._serial:
            await self._deleted(event)

    async def _deleted(self, event: DocumentDeleted) -> None:
        tenant, doc = event.tenant_id, event.document_id
        if not await self.rt.claims.claim_document(tenant, doc, event.occurred_at):
            log.info("ingest.superseded_deletion_skipped", tenant=tenant, document_id=doc)
            return
        with _tracer.start_as_current_span(
            "ingest.delete", attributes={"pml.tenant_id": tenant, "pml.document_id": doc}
        ):
            await self.rt.store.remove_document(tenant, doc, keep_document=False)
            await self.rt.status.forget(tenant, doc)
        log.info("ingest.deleted", tenant=tenant, document_id=doc)

    async def on_tenant_deleted(self, event: TenantDeleted) -> None:
        async with self._serial:
            # Requests about its documents made before this one are refused from now on.
            await self.rt.claims.claim_tenant_deletion(event.tenant_id, event.occurred_at)
            nodes = await self.rt.store.delete_tenant(event.tenant_id)
            documents = await self.rt.status.forget_tenant(event.tenant_id)
        log.info("ingest.tenant_deleted", tenant=event.tenant_id, nodes=nodes, documents=documents)


def _section_row(section: Section) -> dict[str, Any]:
    return {
        "context_id": section.context_id,
        "section_path": section.section_path,
        "heading": section.heading,
        "level": section.level,
        "ordinal": section.ordinal,
        "text": section.text,
        "char_start": section.char_start,
        "char_end": section.char_end,
        "chunk_ids": [c.chunk_id for c in section.chunks],
        "trail": list(section.trail),
    }


def _chunk_payload(section: Section) -> list[ChunkPayload]:
    return [
        ChunkPayload(
            chunk_id=c.chunk_id,
            context_id=c.context_id,
            section_path=c.section_path,
            text=c.text,
            char_start=c.char_start,
            char_end=c.char_end,
        )
        for c in section.chunks
    ]


def _flatten_chunks(sections: Sequence[Section]) -> list[ChunkPayload]:
    return [p for s in sections for p in _chunk_payload(s)]


# --- pass 1 ---------------------------------------------------------------------------------


class ConceptPass(Pass):
    """Pass 1: concepts and MENTIONED_IN with salience; no semantic relation."""

    name = "pass1"
    consumes = ChunkingCompleted
    produces = Pass1Completed

    def __init__(self, runtime: PassRuntime, extractor: ConceptExtractor | None = None) -> None:
        super().__init__(runtime)
        self.extractor = extractor or ConceptExtractor()

    async def run(self, tenant: str, doc: str, chash: str, language: str) -> None:
        store = self.rt.store
        sections = await store.sections(tenant, doc)
        inputs = [SectionInput(s.context_id, s.section_path, s.text) for s in sections]
        # spaCy is CPU-bound: off the event loop, so health checks and the bus keep going.
        per_section = await asyncio.to_thread(self.extractor.extract, inputs, language)
        rows = [
            {
                "context_id": section.context_id,
                "key": m.key,
                "name": m.name,
                "concept_type": m.concept_type,
                "entity_label": m.entity_label,
                "salience": m.salience,
                "positions": list(m.positions),
                "count": m.count,
            }
            for section, mentions in zip(sections, per_section, strict=True)
            for m in mentions
        ]
        batch_size = self.rt.settings.ingest_write_batch
        if len(rows) <= batch_size:
            await store.replace_mentions(tenant, doc, language, rows)
            await self.rt.pause_after_first_write(self.name, doc)
        else:
            previous = await store.drop_mentions(tenant, doc)
            for i, batch in enumerate(batches(rows, batch_size)):
                await store.write_mentions(tenant, doc, language, batch)
                if i == 0:
                    await self.rt.pause_after_first_write(self.name, doc)
            # Concepts only this document named, and no longer names; a crash before this
            # line loses nothing: the redelivery drops and rewrites the same mentions.
            await store.sweep_concepts(tenant, previous)
        log.info("ingest.concepts", tenant=tenant, document_id=doc, mentions=len(rows))


# --- pass 2a --------------------------------------------------------------------------------


class TopicPass(Pass):
    """Pass 2a: structural topics, HAS_TOPIC and COVERS (scope, never evidence)."""

    name = "pass2a"
    consumes = Pass1Completed
    produces = Pass2aCompleted

    async def run(self, tenant: str, doc: str, chash: str, language: str) -> None:
        store = self.rt.store
        sections = await store.sections(tenant, doc)
        outlines = [SectionOutline(s.context_id, s.trail, len(s.text)) for s in sections]
        topics = document_topics(outlines)
        mentions = await store.mentions(tenant, doc)
        covered = covers(topics, mentions, self.rt.settings.covers_min_salience)
        attached: dict[str, list[str]] = {s.context_id: [] for s in sections}
        for topic in topics:
            for context_id in topic.context_ids:
                attached[context_id].append(topic.topic_id)
        await store.replace_topics(
            tenant,
            doc,
            [{"topic_id": t.topic_id, "name": t.name, "salience": t.salience} for t in topics],
            [{"context_id": c, "topic_ids": ids} for c, ids in attached.items()],
            [
                {"topic_id": c.topic_id, "key": c.concept_key, "confidence": c.confidence}
                for c in covered
            ],
        )
        log.info(
            "ingest.topics", tenant=tenant, document_id=doc, topics=len(topics), covers=len(covered)
        )


# --- pass 2b --------------------------------------------------------------------------------


class ClassifyPass(Pass):
    """Pass 2b: fine types of the document's concepts (deterministic)."""

    name = "pass2b"
    consumes = Pass2aCompleted
    produces = Pass2bCompleted

    async def run(self, tenant: str, doc: str, chash: str, language: str) -> None:
        concepts = await self.rt.store.document_concepts(tenant, doc)
        rows = [{"key": key, "fine_type": fine_type(key, label)} for key, label in concepts]
        for batch in batches(rows, self.rt.settings.ingest_write_batch):
            await self.rt.store.write_fine_types(tenant, batch)


# --- pass 3 ---------------------------------------------------------------------------------


class RelationPass(Pass):
    """Pass 3: the only source of semantic relations, each backed by quoted evidence."""

    name = "pass3"
    consumes = Pass2bCompleted
    produces = Pass3Completed

    def __init__(self, runtime: PassRuntime, verifier: Verifier | None = None) -> None:
        super().__init__(runtime)
        self.verifier = verifier or build_verifier(runtime.settings)

    async def run(self, tenant: str, doc: str, chash: str, language: str) -> None:
        settings = self.rt.settings
        candidates = await self.rt.store.candidates(
            tenant, doc, settings.pass3_min_sections, settings.pass3_max_candidates
        )
        candidates = [
            c for c in candidates if not (is_stop_concept(c.a.key) or is_stop_concept(c.b.key))
        ]
        written = 0
        for i, batch in enumerate(batches(candidates, PAIR_BATCH)):
            verdicts: list[Verdict] = []
            for candidate in batch:
                for section in candidate.sections:
                    verdict = await self.verifier.verify(candidate.a, candidate.b, section)
                    if verdict is not None:
                        verdicts.append(verdict)
            relations = decide(verdicts)
            pairs = [(c.a.key, c.b.key) for c in batch]
            await self.rt.store.replace_pair_relations(tenant, pairs, relations)
            written += len(relations)
            if i == 0:
                await self.rt.pause_after_first_write(self.name, doc)
        await self.rt.store.mark_completed(tenant, doc, chash)
        log.info(
            "ingest.relations",
            tenant=tenant,
            document_id=doc,
            candidates=len(candidates),
            relations=written,
        )


PASS_TYPES: dict[str, Callable[[PassRuntime], Any]] = {
    "chunking": ChunkingPass,
    "pass1": ConceptPass,
    "pass2a": TopicPass,
    "pass2b": ClassifyPass,
    "pass3": RelationPass,
}


def build_pass(name: str, runtime: PassRuntime) -> ChunkingPass | Pass:
    if name not in PASS_TYPES:
        raise ValueError(f"unknown pass {name!r}; choose one of {', '.join(PASS_TYPES)}")
    handler: ChunkingPass | Pass = PASS_TYPES[name](runtime)
    return handler
