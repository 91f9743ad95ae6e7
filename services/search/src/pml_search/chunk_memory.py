"""Chunk vectors in memory, for the embedded vector store.

The embedded store (qdrant-client's local mode) has no payload index: it evaluates a filter in
Python point by point, which costs more than the whole rest of an Ask once a tenant has a few
thousand chunks. It also belongs to one process, the search service, through which every write
goes. So, with it, `ChunkIndex` keeps each tenant's chunks here (unit vectors and payloads,
loaded on first use) and answers filtered searches with numpy: the rows of the requested
sections (`context_id`) or documents, scored by dot product, exactly as Qdrant's cosine would.
Every write through `ChunkIndex` invalidates the tenant, and its chunks are read again once its
writes have been quiet for a while (`pml_search.read_ahead`), so the first question after an
ingestion does not wait for them; a load that raced with a write is not kept. With a Qdrant
server, filters run in Qdrant on its payload indexes and this is not used.

Memory: at most `max_chunks` chunks over all tenants are kept (`PML_SEARCH_CHUNK_CACHE_MAX_CHUNKS`);
the least recently used tenants are dropped and read again from the store on their next Ask.
Empty tenants are not kept, and a tenant's lock and its load's bookkeeping live only while a load
runs or waits, so Asks naming any tenant cannot grow memory.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pml_common.settings import Settings
from pml_common.tenant_cache import TenantCache
from pml_search.ranking import top_k_indices
from pml_search.read_ahead import DELAY_S, ReadAhead
from pml_search.vector_store import VectorPoint, VectorStore


@dataclass(frozen=True)
class MemoryHit:
    point: VectorPoint
    score: float


@dataclass
class TenantChunks:
    """One tenant's chunks: a matrix of unit vectors and each row's point."""

    points: list[VectorPoint]
    vectors: np.ndarray
    by_context: dict[str, list[int]] = field(default_factory=dict)
    by_document: dict[str, list[int]] = field(default_factory=dict)
    #: how long reading them from the store took
    load_s: float = 0.0

    @classmethod
    def of(cls, points: Sequence[VectorPoint], dim: int, load_s: float = 0.0) -> TenantChunks:
        vectors = (
            np.asarray([p.vector for p in points], dtype=np.float32)
            if points
            else np.zeros((0, dim), dtype=np.float32)
        )
        chunks = cls(list(points), vectors, load_s=load_s)
        for row, point in enumerate(points):
            chunks.by_context.setdefault(str(point.payload.get("context_id")), []).append(row)
            chunks.by_document.setdefault(str(point.payload.get("document_id")), []).append(row)
        return chunks

    def rows(
        self, context_ids: Sequence[str] | None, document_ids: Sequence[str] | None
    ) -> np.ndarray | None:
        """Rows matching the filters (None: every row)."""
        selected: set[int] | None = None
        if context_ids is not None:
            selected = {r for c in context_ids for r in self.by_context.get(c, ())}
        if document_ids is not None:
            in_docs = {r for d in document_ids for r in self.by_document.get(d, ())}
            selected = in_docs if selected is None else selected & in_docs
        return None if selected is None else np.fromiter(sorted(selected), dtype=np.int64)

    def search(
        self,
        query: np.ndarray,
        limit: int,
        context_ids: Sequence[str] | None = None,
        document_ids: Sequence[str] | None = None,
    ) -> list[MemoryHit]:
        rows = self.rows(context_ids, document_ids)
        if rows is None:
            rows = np.arange(len(self.points))
        if limit <= 0 or rows.size == 0:
            return []
        scores = self.vectors[rows] @ np.asarray(query, dtype=np.float32).ravel()
        return [
            MemoryHit(self.points[int(rows[i])], float(scores[i]))
            for i in top_k_indices(scores, limit)
        ]


@dataclass(eq=False)
class _Load:
    """A read of one tenant's chunks under way; a write meanwhile makes it stale."""

    stale: bool = False


def _weight(chunks: TenantChunks) -> int:
    return max(1, len(chunks.points))


#: Default of `max_chunks`: the setting's.
MAX_CHUNKS: int = Settings.model_fields["search_chunk_cache_max_chunks"].default


class ChunkMemory:
    """Tenant → its chunks in memory, loaded from the store on first use."""

    def __init__(
        self,
        store: VectorStore,
        collection: str,
        dim: int,
        max_chunks: int = MAX_CHUNKS,
        read_ahead_s: float = DELAY_S,
    ) -> None:
        self._store = store
        self._collection = collection
        self._dim = dim
        # Nothing to keep busy: writes replace a tenant's chunks (invalidate), never update them.
        self._tenants: TenantCache[str, TenantChunks] = TenantCache(
            "search.chunks", max_chunks, _weight
        )
        # The load under way per tenant (one at a time, under the tenant's lock), only while it
        # runs; and the locks, forgotten once nobody holds or waits for them.
        self._loading: dict[str, _Load] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._read_ahead = ReadAhead("search.chunks", self.chunks, read_ahead_s)

    async def close(self) -> None:
        """Drops the reads ahead (the service is stopping)."""
        await self._read_ahead.close()

    def invalidate(self, tenant: str) -> None:
        """The tenant's chunks changed in the store: load them again before its next question
        (`pml_search.read_ahead`) or on it."""
        dropped = self._tenants.pop(tenant)
        self._read_ahead.changed(tenant, dropped.load_s if dropped is not None else 0.0)
        load = self._loading.get(tenant)
        if load is not None:  # it may have read the store before the write: not to be kept
            load.stale = True

    async def chunks(self, tenant: str) -> TenantChunks:
        cached = self._tenants.get(tenant)
        if cached is not None:
            return cached
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            cached = self._tenants.get(tenant)
            if cached is not None:
                return cached
            load = self._loading[tenant] = _Load()
            started = time.monotonic()
            try:
                points = await self._store.scan(self._collection, {"tenant_id": tenant})
            finally:
                del self._loading[tenant]
            loaded = TenantChunks.of(points, self._dim, time.monotonic() - started)
            # An empty tenant is not kept: any tenant id may be asked about.
            if points and not load.stale:
                self._tenants.put(tenant, loaded)
            return loaded
