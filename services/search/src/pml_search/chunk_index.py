"""Document chunks in the vector store: indexed from `ChunksExtracted`, searched as evidence.

Collection `pml_chunks__<embedder>` (`collection_for`): it carries the name of the embedder
whose vectors it holds, so that the vectors of two models are never mixed. One point per chunk,
id derived from (tenant, chunk id), payload `tenant_id`, `document_id`, `context_id` (equal to
the SectionContext's in Neo4j, seed 001 §8), `section_path`, `chunk_id`, `text`, `char_start`,
`char_end`, `content_hash`; payload indexes on `tenant_id`, `document_id` and `context_id` (on a
Qdrant server). The passage embedded is the section path and the chunk text (`chunk_text`), so
a chunk knows which document and section it belongs to.

Re-embedding (an upgrade from the single `pml_chunks` of older releases, or a new
`PML_PASSAGE_EMBEDDER`): at start, if another chunk collection (`pml_chunks` or
`pml_chunks__*`) holds points, the documents it has and this collection lacks are embedded
again into this one, in the background, from the chunks in its payloads and through the same
writes as `index_document` (so with the content hashes this embedder writes). The largest such
collection is the source (then the greater name). A document written or deleted here since the
start is skipped: that newer request wins over the old copy. A document already here is
skipped, so a restart resumes where a stopped or killed one was; the source is never dropped.
Deletions (of a document, a tenant, or a document's every chunk) are applied to the other
chunk collections too, so that no later re-embedding brings back what was deleted.

With the embedded vector store, searches run on the tenant's chunks in memory
(`pml_search.chunk_memory`: that store filters point by point in Python); every write here
invalidates them.

Idempotence: a document's `ChunksExtracted` replaces its chunks: chunks of the document that
the event no longer names are deleted, chunks whose content hash is unchanged are not embedded
or written again, so a redelivered event changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from pml_common.embedding import Embedder
from pml_common.events import ChunkPayload
from pml_search.chunk_memory import MAX_CHUNKS, ChunkMemory
from pml_search.vector_store import Filter, VectorHit, VectorPoint, VectorStore

log = structlog.get_logger(__name__)

STEM = "pml_chunks"
INDEXED_FIELDS = ("tenant_id", "document_id", "context_id")
_POINT_NAMESPACE = uuid.UUID("0b6f2c1e-7d3a-5c4b-9e8f-1a2b3c4d5e6f")
#: Chunks re-embedded at a time (whole documents: a larger one goes alone); a tenant's writes
#: wait for at most one batch.
REEMBED_BATCH = 256
#: How long `stop` lets the batch under way finish before cancelling it.
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class ChunkHit:
    chunk_id: str
    document_id: str
    context_id: str
    section_path: str
    text: str
    score: float


def point_id(tenant: str, chunk_id: str) -> str:
    return str(uuid.uuid5(_POINT_NAMESPACE, f"{tenant}\x00{chunk_id}"))


def chunk_text(chunk: ChunkPayload) -> str:
    """The passage embedded for a chunk: its section path, then its text."""
    return f"{chunk.section_path}\n{chunk.text}" if chunk.section_path else chunk.text


def collection_for(embedder_name: str) -> str:
    """The collection of chunk vectors made by `embedder_name` (named like the catalog's)."""
    slug = re.sub(r"[^a-z0-9]+", "_", embedder_name.lower()).strip("_")
    return f"{STEM}__{slug}"


def is_chunk_collection(name: str) -> bool:
    """Whether `name` holds chunks: `pml_chunks` (older releases) or `pml_chunks__<embedder>`."""
    return name == STEM or name.startswith(f"{STEM}__")


def _hash(embedder_name: str, chunk: ChunkPayload) -> str:
    blob = json.dumps([embedder_name, chunk.model_dump()], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class ChunkIndex:
    """The chunks of every tenant, embedded by the passage embedder; questions must be embedded
    by the same one (`embedder`) to be compared with them."""

    def __init__(
        self, store: VectorStore, embedder: Embedder, max_memory_chunks: int = MAX_CHUNKS
    ) -> None:
        self._store = store
        self._embedder = embedder
        self.collection = collection_for(embedder.name)
        self._memory = (
            ChunkMemory(store, self.collection, embedder.dim, max_memory_chunks)
            if store.embedded
            else None
        )
        # Held by writers of a tenant (the re-embedding included); forgotten once unused.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # While re-embedding: (tenant, document) written or deleted since the start, (tenant,
        # None) for a deleted tenant. Those are newer than the copy being re-embedded.
        self._touched: set[tuple[str, str | None]] | None = None
        self._reembedding: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    def _changed(self, tenant: str) -> None:
        if self._memory is not None:
            self._memory.invalidate(tenant)

    def _lock(self, tenant: str) -> asyncio.Lock:
        return self._locks.setdefault(tenant, asyncio.Lock())

    def _touch(self, tenant: str, document_id: str | None) -> None:
        if self._touched is not None:
            self._touched.add((tenant, document_id))

    async def start(self) -> None:
        """Ensure the collection, then re-embed in the background what another chunk
        collection holds and this one lacks (see the module docstring)."""
        await self._store.ensure_collection(self.collection, self._embedder.dim, INDEXED_FIELDS)
        sizes = {name: await self._store.count(name) for name in await self._other_collections()}
        filled = sorted((n, name) for name, n in sizes.items() if n)
        if filled:
            points, source = filled[-1]
            self._touched = set()
            reembed = self._reembed(source, points, sizes)
            self._reembedding = asyncio.create_task(reembed, name="pml-chunks-reembed")

    async def stop(self) -> None:
        """Stop re-embedding after the batch under way (cancelled after `STOP_GRACE_S`), and
        reading chunks ahead of questions."""
        if self._memory is not None:
            await self._memory.close()
        task = self._reembedding
        if task is None:
            return
        self._stopping.set()
        await asyncio.wait({task}, timeout=STOP_GRACE_S)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def reembedded(self) -> None:
        """Wait for the re-embedding started by `start`, if any, to end."""
        if self._reembedding is not None:
            await asyncio.shield(self._reembedding)

    async def index_document(
        self, tenant: str, document_id: str, chunks: Sequence[ChunkPayload]
    ) -> int:
        """Replace the document's chunks with `chunks`; returns how many were (re)embedded."""
        return await self.index_documents(tenant, {document_id: chunks})

    async def index_documents(
        self, tenant: str, documents: Mapping[str, Sequence[ChunkPayload]]
    ) -> int:
        """Replace each document's chunks with its own, for several documents of the tenant in
        one read of what is stored, one embedding call and one write (an ingestion batch);
        returns how many chunks were (re)embedded."""
        if not documents:
            return 0
        async with self._lock(tenant):
            for document_id in documents:
                self._touch(tenant, document_id)
            stored = await self._stored_hashes(tenant, list(documents))
            wanted = {doc: {c.chunk_id for c in chunks} for doc, chunks in documents.items()}
            stale = [cid for doc, ids in stored.items() for cid in ids if cid not in wanted[doc]]
            if stale:
                await self._store.delete_ids(self.collection, [point_id(tenant, c) for c in stale])
                self._changed(tenant)
            for doc in (d for d, chunks in documents.items() if not chunks):
                await self._delete_elsewhere({"tenant_id": tenant, "document_id": doc})
            todo = [
                (doc, c)
                for doc, chunks in documents.items()
                for c in {c.chunk_id: c for c in chunks}.values()
                if stored.get(doc, {}).get(c.chunk_id) != _hash(self._embedder.name, c)
            ]
            await self._write(tenant, todo)
        log.info(
            "chunks indexed",
            tenant=tenant,
            documents=len(documents),
            embedded=len(todo),
            deleted=len(stale),
            unchanged=sum(map(len, wanted.values())) - len(todo),
        )
        return len(todo)

    async def _stored_hashes(self, tenant: str, documents: list[str]) -> dict[str, dict[str, str]]:
        """document id -> chunk id -> content hash, of what the collection holds for them."""
        where = {"tenant_id": tenant, "document_id": documents}
        fields = ("document_id", "chunk_id", "content_hash")
        stored: dict[str, dict[str, str]] = {}
        for p in await self._store.payloads(self.collection, where, fields=fields):
            chunks = stored.setdefault(str(p.get("document_id")), {})
            chunks[str(p.get("chunk_id"))] = str(p.get("content_hash"))
        return stored

    async def _write(self, tenant: str, todo: Sequence[tuple[str, ChunkPayload]]) -> None:
        """Embed and write these (document id, chunk) of the tenant."""
        if not todo:
            return
        name = self._embedder.name
        vectors = await self._embedder.embed_passages([chunk_text(c) for _, c in todo])
        points = [
            VectorPoint(
                id=point_id(tenant, c.chunk_id),
                vector=vector,
                payload={
                    "tenant_id": tenant,
                    "document_id": doc,
                    **c.model_dump(),
                    "content_hash": _hash(name, c),
                },
            )
            for (doc, c), vector in zip(todo, vectors, strict=True)
        ]
        await self._store.upsert(self.collection, points)
        self._changed(tenant)

    async def _other_collections(self) -> list[str]:
        """The other chunk collections, listed anew each time: an operator may drop one."""
        names = await self._store.collections()
        return [n for n in names if is_chunk_collection(n) and n != self.collection]

    async def _delete_elsewhere(self, where: Filter) -> None:
        """Apply a deletion to the other chunk collections too: a document deleted here and
        still there would otherwise be re-embedded at the next start."""
        for name in await self._other_collections():
            await self._store.delete(name, where)

    async def delete_document(self, tenant: str, document_id: str) -> int:
        where = {"tenant_id": tenant, "document_id": document_id}
        async with self._lock(tenant):
            self._touch(tenant, document_id)
            deleted = await self._store.delete(self.collection, where)
            await self._delete_elsewhere(where)
            self._changed(tenant)
        return deleted

    async def delete_tenant(self, tenant: str) -> int:
        async with self._lock(tenant):
            self._touch(tenant, None)
            deleted = await self._store.delete(self.collection, {"tenant_id": tenant})
            await self._delete_elsewhere({"tenant_id": tenant})
            self._changed(tenant)
        return deleted

    # --- re-embedding -------------------------------------------------------------------------

    async def _reembed(self, source: str, points: int, sizes: dict[str, int]) -> None:
        began = time.monotonic()
        log.info(
            "chunks.reembed_started",
            source=source,
            target=self.collection,
            points=points,
            candidates=sizes,
        )
        progress = _Progress()
        try:
            for tenant, documents in sorted((await self._missing(source)).items()):
                await self._reembed_tenant(source, tenant, documents, progress)
        except Exception:  # the service keeps serving; the next start resumes
            log.exception("chunks.reembed_failed", source=source, target=self.collection)
            return
        finally:
            self._touched = None
        event = "chunks.reembed_stopped" if self._stopping.is_set() else "chunks.reembed_done"
        seconds = round(time.monotonic() - began, 3)
        log.info(event, source=source, target=self.collection, seconds=seconds, **progress.counts())

    async def _missing(self, source: str) -> dict[str, set[str]]:
        """The documents of `source` that this collection lacks, per tenant."""
        fields = ("tenant_id", "document_id")
        here = {_key(p) for p in await self._store.payloads(self.collection, fields=fields)}
        missing: dict[str, set[str]] = {}
        for tenant, doc in map(_key, await self._store.payloads(source, fields=fields)):
            if (tenant, doc) not in here:
                missing.setdefault(tenant, set()).add(doc)
        return missing

    async def _reembed_tenant(
        self, source: str, tenant: str, documents: set[str], progress: _Progress
    ) -> None:
        """Re-embed these documents of the tenant, whole documents of `REEMBED_BATCH` chunks
        at most a batch (or one larger document)."""
        if self._stopping.is_set():
            return
        chunks: dict[str, list[ChunkPayload]] = {}
        for payload in await self._store.payloads(source, {"tenant_id": tenant}):
            if (doc := str(payload.get("document_id"))) in documents:
                chunks.setdefault(doc, []).append(_payload_chunk(payload))
        for doc_chunks in chunks.values():  # in the order of the text, as ingest sends them
            doc_chunks.sort(key=lambda c: (c.char_start, c.chunk_id))
        for batch in _batches(chunks):
            if self._stopping.is_set():
                return
            async with self._lock(tenant):
                todo = [
                    (d, c) for d in batch if not await self._newer(tenant, d) for c in chunks[d]
                ]
                await self._write(tenant, todo)
            progress.add(sum(len(chunks[d]) for d in batch), len(todo), len(batch))

    async def _newer(self, tenant: str, document_id: str) -> bool:
        """Whether the document was written or deleted here since `_missing` looked."""
        touched = self._touched or set()
        if (tenant, None) in touched or (tenant, document_id) in touched:
            return True
        if self._store.embedded:  # every write goes through this process: `_touched` has it
            return False
        where = {"tenant_id": tenant, "document_id": document_id}
        return await self._store.count(self.collection, where) > 0  # another replica's

    async def search(
        self,
        tenant: str,
        query: np.ndarray,
        limit: int,
        context_ids: Sequence[str] | None = None,
        document_ids: Sequence[str] | None = None,
    ) -> list[ChunkHit]:
        """The tenant's chunks most similar to `query`, optionally only those of the given
        sections (`context_ids`) or documents; best first."""
        if self._memory is not None:
            chunks = await self._memory.chunks(tenant)
            found = chunks.search(query, limit, context_ids, document_ids)
            return [_hit(VectorHit(h.point.id, h.score, h.point.payload)) for h in found]
        where: dict[str, str | Sequence[str]] = {"tenant_id": tenant}
        if context_ids is not None:
            where["context_id"] = list(context_ids)
        if document_ids is not None:
            where["document_id"] = list(document_ids)
        hits = await self._store.search(self.collection, query, limit, where)
        return [_hit(h) for h in hits]

    async def count(self, tenant: str, document_id: str | None = None) -> int:
        where = {"tenant_id": tenant, **({"document_id": document_id} if document_id else {})}
        return await self._store.count(self.collection, where)


def _hit(hit: VectorHit) -> ChunkHit:
    p = hit.payload
    return ChunkHit(
        chunk_id=str(p.get("chunk_id", "")),
        document_id=str(p.get("document_id", "")),
        context_id=str(p.get("context_id", "")),
        section_path=str(p.get("section_path", "")),
        text=str(p.get("text", "")),
        score=hit.score,
    )


@dataclass
class _Progress:
    """Counts of a re-embedding, logged every `REEMBED_BATCH` chunks or more."""

    documents: int = 0
    chunks: int = 0
    embedded: int = 0
    _logged: int = 0

    def add(self, chunks: int, embedded: int, documents: int) -> None:
        self.documents += documents
        self.chunks += chunks
        self.embedded += embedded
        if self.chunks - self._logged >= REEMBED_BATCH:
            self._logged = self.chunks
            log.info("chunks.reembed_progress", **self.counts())

    def counts(self) -> dict[str, int]:
        return {
            "documents": self.documents,
            "chunks": self.chunks,
            "embedded": self.embedded,
            "skipped": self.chunks - self.embedded,
        }


def _key(payload: Mapping[str, Any]) -> tuple[str, str]:
    return str(payload.get("tenant_id")), str(payload.get("document_id"))


def _payload_chunk(payload: Mapping[str, Any]) -> ChunkPayload:
    """The chunk a stored point was written from (its payload, less what the point adds)."""
    return ChunkPayload.model_validate({f: payload[f] for f in ChunkPayload.model_fields})


def _batches(chunks: Mapping[str, Sequence[ChunkPayload]]) -> Iterator[list[str]]:
    """Document ids in order, in batches of at most `REEMBED_BATCH` chunks (whole documents)."""
    batch: list[str] = []
    size = 0
    for doc in sorted(chunks):
        if batch and size + len(chunks[doc]) > REEMBED_BATCH:
            yield batch
            batch, size = [], 0
        batch.append(doc)
        size += len(chunks[doc])
    if batch:
        yield batch
