"""Document chunks in the vector store: indexed from `ChunksExtracted`, searched as evidence.

Collection `pml_chunks__<embedder>` (`collection_for`): it carries the name of the embedder
whose vectors it holds, so switching embedders starts a new, empty collection rather than mixing
the vectors of two models (documents must then be deleted and submitted again: ingest skips
unchanged ones). One point per chunk, id derived from (tenant, chunk id), payload `tenant_id`,
`document_id`, `context_id` (equal to the SectionContext's in Neo4j, seed 001 §8),
`section_path`, `chunk_id`, `text`, `char_start`, `char_end`, `content_hash`; payload indexes on
`tenant_id`, `document_id` and `context_id` (on a Qdrant server). The passage embedded is the
section path and the chunk text (`chunk_text`), so a chunk knows which document and section it
belongs to.

With the embedded vector store, searches run on the tenant's chunks in memory
(`pml_search.chunk_memory`: that store filters point by point in Python); every write here
invalidates them.

Idempotence: a document's `ChunksExtracted` replaces its chunks: chunks of the document that
the event no longer names are deleted, chunks whose content hash is unchanged are not embedded
or written again, so a redelivered event changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import structlog

from pml_common.embedding import Embedder
from pml_common.events import ChunkPayload
from pml_search.chunk_memory import MAX_CHUNKS, ChunkMemory
from pml_search.vector_store import VectorHit, VectorPoint, VectorStore

log = structlog.get_logger(__name__)

STEM = "pml_chunks"
INDEXED_FIELDS = ("tenant_id", "document_id", "context_id")
_POINT_NAMESPACE = uuid.UUID("0b6f2c1e-7d3a-5c4b-9e8f-1a2b3c4d5e6f")


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

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    def _changed(self, tenant: str) -> None:
        if self._memory is not None:
            self._memory.invalidate(tenant)

    async def start(self) -> None:
        await self._store.ensure_collection(self.collection, self._embedder.dim, INDEXED_FIELDS)

    async def index_document(
        self, tenant: str, document_id: str, chunks: Sequence[ChunkPayload]
    ) -> int:
        """Replace the document's chunks with `chunks`; returns how many were (re)embedded."""
        where = {"tenant_id": tenant, "document_id": document_id}
        stored = {
            str(p.payload.get("chunk_id")): str(p.payload.get("content_hash"))
            for p in await self._store.scan(self.collection, where)
        }
        wanted = {c.chunk_id: c for c in chunks}
        stale = [cid for cid in stored if cid not in wanted]
        if stale:
            await self._store.delete(self.collection, {**where, "chunk_id": stale})
            self._changed(tenant)
        name = self._embedder.name
        todo = [(c, h) for c in wanted.values() if stored.get(c.chunk_id) != (h := _hash(name, c))]
        if todo:
            vectors = await self._embedder.embed_passages([chunk_text(c) for c, _ in todo])
            await self._store.upsert(
                self.collection,
                [
                    VectorPoint(
                        id=point_id(tenant, c.chunk_id),
                        vector=vector,
                        payload={
                            "tenant_id": tenant,
                            "document_id": document_id,
                            **c.model_dump(),
                            "content_hash": h,
                        },
                    )
                    for (c, h), vector in zip(todo, vectors, strict=True)
                ],
            )
            self._changed(tenant)
        log.info(
            "chunks indexed",
            tenant=tenant,
            document_id=document_id,
            embedded=len(todo),
            deleted=len(stale),
            unchanged=len(wanted) - len(todo),
        )
        return len(todo)

    async def delete_document(self, tenant: str, document_id: str) -> int:
        deleted = await self._store.delete(
            self.collection, {"tenant_id": tenant, "document_id": document_id}
        )
        self._changed(tenant)
        return deleted

    async def delete_tenant(self, tenant: str) -> int:
        deleted = await self._store.delete(self.collection, {"tenant_id": tenant})
        self._changed(tenant)
        return deleted

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
