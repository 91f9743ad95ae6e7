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

The passes after chunking handle the events of a read batch together (`EventBus.subscribe_batch`):
one read of the documents' states, one status write per state change, one spaCy `pipe` and one
Neo4j transaction per step for all the batch's documents, instead of one each per document. One
event is a batch of one, through the same code. When a batch fails, the bus hands each of its
events to the pass alone, so a document that fails is retried and dead-lettered alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from pml_common.telemetry import in_trace_of
from pml_ingest.chunker import Section, chunk_document
from pml_ingest.classification import fine_type
from pml_ingest.documents import PoisonDocument, content_hash, text_problem
from pml_ingest.extraction import ConceptExtractor, ConceptMention, SectionInput
from pml_ingest.graph_store import Candidate, DocumentState, GraphStore, StoredSection
from pml_ingest.policy import decide
from pml_ingest.status import DONE, FAILED, PASSES, RUNNING, StatusStore
from pml_ingest.topics import SectionOutline, covers, document_topics
from pml_ingest.verifier import Verdict, Verifier, build_verifier

log = structlog.get_logger(__name__)
_tracer = trace.get_tracer("pml_ingest.passes")
T = TypeVar("T")

#: Candidate pairs whose relations are replaced per transaction in Pass 3.
PAIR_BATCH = 500
#: Events a pass worker reads and handles together (documents per transaction).
DOCUMENT_BATCH = 32


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


@dataclass(frozen=True)
class Doc:
    """A document a pass works on: its content hash is the document's current one."""

    id: str
    content_hash: str
    language: str


class Pass:
    """Base of the passes after chunking: staleness check, status, span, next events; for a
    batch of events at once."""

    name: str
    consumes: type[_PassCompleted]
    produces: type[_PassCompleted]

    def __init__(self, runtime: PassRuntime) -> None:
        self.rt = runtime

    def subscribe(self, bus: EventBus) -> None:
        bus.subscribe_batch(
            self.consumes, group_of(self.name), self.handle_batch, batch_size=DOCUMENT_BATCH
        )

    async def handle(self, event: _PassCompleted) -> None:
        await self.handle_batch([event])

    async def handle_batch(self, events: Sequence[_PassCompleted]) -> None:
        by_tenant: dict[str, list[_PassCompleted]] = {}
        for event in events:
            by_tenant.setdefault(event.tenant_id, []).append(event)
        for tenant, mine in by_tenant.items():
            await self._handle_tenant(tenant, mine)

    async def _handle_tenant(self, tenant: str, events: Sequence[_PassCompleted]) -> None:
        docs = await self._current(tenant, events)
        if not docs:
            return
        hashes = [(d.id, d.content_hash) for d in docs]
        await self.rt.status.mark_many(tenant, hashes, self.name, RUNNING)
        attributes: dict[str, Any] = {"pml.tenant_id": tenant, "pml.document_count": len(docs)}
        if len(docs) == 1:
            attributes["pml.document_id"] = docs[0].id
        with _tracer.start_as_current_span(f"ingest.{self.name}", attributes=attributes):
            try:
                await self.run(tenant, docs)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                await self.rt.status.mark_many(tenant, hashes, self.name, FAILED, error)
                raise
        await self.rt.status.mark_many(tenant, hashes, self.name, DONE)
        carried = {e.document_id: e.trace for e in events}
        for d in docs:
            done = self.produces.create(
                tenant_id=tenant, document_id=d.id, content_hash=d.content_hash
            )
            with in_trace_of(carried[d.id]):
                await self.rt.publisher.publish(done)
        log.info("ingest.pass_done", pass_name=self.name, tenant=tenant, documents=len(docs))

    async def _current(self, tenant: str, events: Sequence[_PassCompleted]) -> list[Doc]:
        """The events' documents whose content is still the one the event names, each once, in
        event order; the others are skipped (a newer version is on its way, or it was deleted)."""
        states = await self.rt.store.document_states(tenant, list({e.document_id for e in events}))
        docs: dict[str, Doc] = {}
        for event in events:
            doc, chash = event.document_id, event.content_hash
            state = states.get(doc)
            if state is None or state.content_hash != chash:
                log.info("ingest.stale_event_skipped", pass_name=self.name, document_id=doc)
                continue
            docs.setdefault(doc, Doc(doc, chash, state.language or "en"))
        return list(docs.values())

    async def run(self, tenant: str, docs: Sequence[Doc]) -> None:
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
        bus.subscribe_batch(
            DocumentSubmitted,
            group_of(self.name),
            self.on_submitted_batch,
            batch_size=DOCUMENT_BATCH,
        )
        bus.subscribe(DocumentDeleted, group_of(self.name), self.on_deleted)
        bus.subscribe(TenantDeleted, group_of(self.name), self.on_tenant_deleted)

    async def on_submitted(self, event: DocumentSubmitted) -> None:
        await self.on_submitted_batch([event])

    async def on_submitted_batch(self, events: Sequence[DocumentSubmitted]) -> None:
        async with self._serial:
            # Two submissions of one document apply one after the other, as they were made.
            for run in _distinct_runs(events):
                by_tenant: dict[str, list[DocumentSubmitted]] = {}
                for event in run:
                    by_tenant.setdefault(event.tenant_id, []).append(event)
                for tenant, mine in by_tenant.items():
                    await self._submitted(tenant, mine)

    async def _submitted(self, tenant: str, events: Sequence[DocumentSubmitted]) -> None:
        claimed = []
        for event in events:
            doc = event.document_id
            if await self.rt.claims.claim_document(tenant, doc, event.occurred_at):
                claimed.append(
                    _Submission(event, content_hash(event.title, event.text, event.format))
                )
            else:
                log.info("ingest.superseded_submission_skipped", tenant=tenant, document_id=doc)
        if not claimed:
            return
        await self.rt.status.ensure_many(
            tenant, [(c.event.document_id, c.content_hash, c.event.title) for c in claimed]
        )
        states = await self.rt.store.document_states(tenant, [c.event.document_id for c in claimed])
        todo = []
        for c in claimed:
            state = states.get(c.event.document_id)
            if state is not None and state.content_hash == c.content_hash == state.completed_hash:
                await self._unchanged(tenant, c.event.document_id, c.content_hash)
                continue
            todo.append(c.replacing(state))
        if not todo:
            return
        hashes = [(c.event.document_id, c.content_hash) for c in todo]
        await self.rt.status.mark_many(tenant, hashes, self.name, RUNNING)
        attributes: dict[str, Any] = {"pml.tenant_id": tenant, "pml.document_count": len(todo)}
        if len(todo) == 1:
            attributes["pml.document_id"] = todo[0].event.document_id
        with _tracer.start_as_current_span("ingest.chunking", attributes=attributes):
            try:
                await self._chunk(tenant, todo)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                await self.rt.status.mark_many(tenant, hashes, self.name, FAILED, error)
                raise
        await self.rt.status.mark_many(tenant, hashes, self.name, DONE)
        for submission in todo:
            done = ChunkingCompleted.create(
                tenant_id=tenant,
                document_id=submission.event.document_id,
                content_hash=submission.content_hash,
            )
            with in_trace_of(submission.event.trace):
                await self.rt.publisher.publish(done)

    async def _unchanged(self, tenant: str, doc: str, chash: str) -> None:
        """The same content again: the graph already holds it, every pass is done."""
        for name in PASSES:
            await self.rt.status.mark(tenant, doc, chash, name, DONE)
        log.info("ingest.unchanged_document", tenant=tenant, document_id=doc)

    async def _chunk(self, tenant: str, todo: Sequence[_Submission]) -> None:
        # Every document checked and cut first: a poison one fails the batch before any write.
        chunked = [self._sections(c) for c in todo]
        store = self.rt.store
        for submission in todo:
            if submission.replacing_old:
                # A changed document: what the old version contributed goes first.
                doc = submission.event.document_id
                await store.remove_document(tenant, doc, keep_document=True)
        batch_size = self.rt.settings.ingest_write_batch
        first = True
        for group in fitting(chunked, lambda c: len(c.sections), batch_size):
            if len(group) == 1 and len(group[0].sections) > batch_size:
                await self._write_large(tenant, group[0])
            else:
                docs = [c.document_row() for c in group]
                rows = [row for c in group for row in c.section_rows()]
                await store.write_documents(tenant, docs, rows)
                if first:
                    await self.rt.pause_after_first_write(self.name, group[0].doc)
            first = False
        for item in chunked:
            extracted = ChunksExtracted.create(
                tenant_id=tenant,
                document_id=item.doc,
                chunks=_flatten_chunks(item.sections),
                submitted_at=item.submission.event.occurred_at,
            )
            with in_trace_of(item.submission.event.trace):
                await self.rt.publisher.publish(extracted)
        # Last: until this is set, a redelivery redoes the whole pass.
        hashes = [(item.doc, item.submission.content_hash) for item in chunked]
        await store.mark_chunked(tenant, hashes)
        log.info("ingest.chunked", tenant=tenant, documents=len(chunked))

    def _sections(self, submission: _Submission) -> _Chunked:
        event = submission.event
        doc = event.document_id
        problem = text_problem(event.text, self.rt.settings.ingest_max_document_chars)
        if problem:
            raise PoisonDocument(f"document {doc!r}: {problem}")
        sections = chunk_document(
            doc, event.title, event.text, event.format, self.rt.settings.ingest_chunk_chars
        )
        if not sections:
            raise PoisonDocument(f"document {doc!r}: no section with text")
        language = detect_language(f"{event.title}\n{event.text}")
        return _Chunked(submission, sections, language)

    async def _write_large(self, tenant: str, chunked: _Chunked) -> None:
        """A document with more sections than one transaction takes: in several."""
        store = self.rt.store
        await store.upsert_documents(tenant, [chunked.document_row()])
        rows = chunked.section_rows()
        for i, batch in enumerate(batches(rows, self.rt.settings.ingest_write_batch)):
            await store.write_sections(tenant, batch)
            if i == 0:
                await self.rt.pause_after_first_write(self.name, chunked.doc)
        await store.drop_stale_sections(tenant, chunked.doc, [r["context_id"] for r in rows])

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


@dataclass(frozen=True)
class _Submission:
    event: DocumentSubmitted
    content_hash: str
    #: The graph holds another version of the document.
    replacing_old: bool = False

    def replacing(self, state: DocumentState | None) -> _Submission:
        changed = state is not None and state.content_hash != self.content_hash
        return _Submission(self.event, self.content_hash, changed)


@dataclass(frozen=True)
class _Chunked:
    submission: _Submission
    sections: list[Section]
    language: str

    @property
    def doc(self) -> str:
        return self.submission.event.document_id

    def document_row(self) -> dict[str, Any]:
        event = self.submission.event
        return {
            "document_id": self.doc,
            "title": event.title,
            "format": event.format,
            "language": self.language,
            "section_count": len(self.sections),
        }

    def section_rows(self) -> list[dict[str, Any]]:
        return [{"document_id": self.doc, **_section_row(s)} for s in self.sections]


def _distinct_runs(events: Sequence[DocumentSubmitted]) -> Iterator[list[DocumentSubmitted]]:
    """Consecutive runs of `events` in which no document comes twice."""
    run: list[DocumentSubmitted] = []
    seen: set[tuple[str, str]] = set()
    for event in events:
        key = (event.tenant_id, event.document_id)
        if key in seen:
            yield run
            run, seen = [], set()
        run.append(event)
        seen.add(key)
    if run:
        yield run


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

    async def run(self, tenant: str, docs: Sequence[Doc]) -> None:
        store = self.rt.store
        sections = await store.sections(tenant, [d.id for d in docs])
        # spaCy is CPU-bound: off the event loop, so health checks and the bus keep going.
        per_doc = await asyncio.to_thread(self._extract, docs, sections)
        batch_size = self.rt.settings.ingest_write_batch
        first = True
        for group in fitting(per_doc, lambda rows: len(rows[1]), batch_size):
            if len(group) == 1 and len(group[0][1]) > batch_size:
                await self._write_large(tenant, *group[0])
            else:
                rows = [row for _, doc_rows in group for row in doc_rows]
                await store.replace_mentions(tenant, [d.id for d, _ in group], rows)
                if first:
                    await self.rt.pause_after_first_write(self.name, group[0][0].id)
            first = False
        log.info(
            "ingest.concepts",
            tenant=tenant,
            documents=len(docs),
            mentions=sum(len(rows) for _, rows in per_doc),
        )

    def _extract(
        self, docs: Sequence[Doc], sections: Mapping[str, Sequence[StoredSection]]
    ) -> list[tuple[Doc, list[dict[str, Any]]]]:
        """Each document's MENTIONED_IN rows, in document order; one `nlp.pipe` per language
        over all the batch's sections."""
        by_language: dict[str, list[Doc]] = {}
        for d in docs:
            by_language.setdefault(d.language, []).append(d)
        rows: dict[str, list[dict[str, Any]]] = {}
        for language, same in by_language.items():
            owned = [(d, s) for d in same for s in sections[d.id]]
            inputs = [SectionInput(s.context_id, s.section_path, s.text) for _, s in owned]
            per_section = self.extractor.extract(inputs, language)
            for d in same:
                rows[d.id] = []
            for (d, section), mentions in zip(owned, per_section, strict=True):
                rows[d.id].extend(_mention_row(d, section.context_id, m) for m in mentions)
        return [(d, rows[d.id]) for d in docs]

    async def _write_large(self, tenant: str, doc: Doc, rows: Sequence[dict[str, Any]]) -> None:
        """A document with more mentions than one transaction takes: in several."""
        store = self.rt.store
        previous = await store.drop_mentions(tenant, [doc.id])
        for i, batch in enumerate(batches(rows, self.rt.settings.ingest_write_batch)):
            await store.write_mentions(tenant, batch)
            if i == 0:
                await self.rt.pause_after_first_write(self.name, doc.id)
        # Concepts only this document named, and no longer names; a crash before this
        # line loses nothing: the redelivery drops and rewrites the same mentions.
        await store.sweep_concepts(tenant, previous)


def _mention_row(doc: Doc, context_id: str, m: ConceptMention) -> dict[str, Any]:
    return {
        "document_id": doc.id,
        "language": doc.language,
        "context_id": context_id,
        "key": m.key,
        "name": m.name,
        "concept_type": m.concept_type,
        "entity_label": m.entity_label,
        "salience": m.salience,
        "positions": list(m.positions),
        "count": m.count,
    }


def fitting(items: Sequence[T], size: Callable[[T], int], limit: int) -> Iterator[Sequence[T]]:
    """Consecutive groups of `items` whose sizes add up to at most `limit`; an item larger than
    `limit` is a group alone."""
    group: list[T] = []
    total = 0
    for item in items:
        n = size(item)
        if group and total + n > limit:
            yield group
            group, total = [], 0
        group.append(item)
        total += n
    if group:
        yield group


# --- pass 2a --------------------------------------------------------------------------------


class TopicPass(Pass):
    """Pass 2a: structural topics, HAS_TOPIC and COVERS (scope, never evidence)."""

    name = "pass2a"
    consumes = Pass1Completed
    produces = Pass2aCompleted

    async def run(self, tenant: str, docs: Sequence[Doc]) -> None:
        store = self.rt.store
        ids = [d.id for d in docs]
        sections = await store.sections(tenant, ids)
        mentions = await store.mentions(tenant, ids)
        topic_rows: list[dict[str, Any]] = []
        section_rows: list[dict[str, Any]] = []
        cover_rows: list[dict[str, Any]] = []
        for doc in ids:
            outlines = [SectionOutline(s.context_id, s.trail, len(s.text)) for s in sections[doc]]
            topics = document_topics(outlines)
            covered = covers(topics, mentions, self.rt.settings.covers_min_salience)
            attached: dict[str, list[str]] = {s.context_id: [] for s in sections[doc]}
            for topic in topics:
                for context_id in topic.context_ids:
                    attached[context_id].append(topic.topic_id)
            topic_rows += [
                {"document_id": doc, "topic_id": t.topic_id, "name": t.name, "salience": t.salience}
                for t in topics
            ]
            section_rows += [{"context_id": c, "topic_ids": t} for c, t in attached.items()]
            cover_rows += [
                {
                    "document_id": doc,
                    "topic_id": c.topic_id,
                    "key": c.concept_key,
                    "confidence": c.confidence,
                }
                for c in covered
            ]
        await store.replace_topics(tenant, ids, topic_rows, section_rows, cover_rows)
        log.info(
            "ingest.topics",
            tenant=tenant,
            documents=len(docs),
            topics=len(topic_rows),
            covers=len(cover_rows),
        )


# --- pass 2b --------------------------------------------------------------------------------


class ClassifyPass(Pass):
    """Pass 2b: fine types of the document's concepts (deterministic)."""

    name = "pass2b"
    consumes = Pass2aCompleted
    produces = Pass2bCompleted

    async def run(self, tenant: str, docs: Sequence[Doc]) -> None:
        concepts = await self.rt.store.document_concepts(tenant, [d.id for d in docs])
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

    async def run(self, tenant: str, docs: Sequence[Doc]) -> None:
        settings = self.rt.settings
        found = await self.rt.store.candidates(
            tenant, [d.id for d in docs], settings.pass3_min_sections, settings.pass3_max_candidates
        )
        # A pair several documents of the batch share is verified once, as the last of them
        # saw it: one after the other, each would replace the relations of the one before.
        pairs: dict[tuple[str, str], Candidate] = {}
        for d in docs:
            for c in found[d.id]:
                if not (is_stop_concept(c.a.key) or is_stop_concept(c.b.key)):
                    pairs[_pair(c)] = c
        candidates = list(pairs.values())
        written = 0
        for i, batch in enumerate(batches(candidates, PAIR_BATCH)):
            verdicts: list[Verdict] = []
            for candidate in batch:
                for section in candidate.sections:
                    verdict = await self.verifier.verify(candidate.a, candidate.b, section)
                    if verdict is not None:
                        verdicts.append(verdict)
            relations = decide(verdicts)
            keys = [(c.a.key, c.b.key) for c in batch]
            await self.rt.store.replace_pair_relations(tenant, keys, relations)
            written += len(relations)
            if i == 0:
                await self.rt.pause_after_first_write(self.name, docs[0].id)
        await self.rt.store.mark_completed(tenant, [(d.id, d.content_hash) for d in docs])
        log.info(
            "ingest.relations",
            tenant=tenant,
            documents=len(docs),
            candidates=len(candidates),
            relations=written,
        )


def _pair(candidate: Candidate) -> tuple[str, str]:
    a, b = sorted((candidate.a.key, candidate.b.key))
    return a, b


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
