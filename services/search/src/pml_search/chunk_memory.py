"""Chunk vectors in memory, for the embedded vector store.

The embedded store (qdrant-client's local mode) has no payload index: it evaluates a filter in
Python point by point, which costs more than the whole rest of an Ask once a tenant has a few
thousand chunks. It also belongs to one process, the search service, through which every write
goes. So, with it, `ChunkIndex` keeps each tenant's chunks here (unit vectors and payloads,
loaded on first use) and answers filtered searches with numpy: the rows of the requested
sections (`context_id`) or documents, scored by dot product, exactly as Qdrant's cosine would.
Every write through `ChunkIndex` invalidates the tenant; a load that raced with a write is not
kept. With a Qdrant server, filters run in Qdrant on its payload indexes and this is not used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pml_search.ranking import top_k_indices
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

    @classmethod
    def of(cls, points: Sequence[VectorPoint], dim: int) -> TenantChunks:
        vectors = (
            np.asarray([p.vector for p in points], dtype=np.float32)
            if points
            else np.zeros((0, dim), dtype=np.float32)
        )
        chunks = cls(list(points), vectors)
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


class ChunkMemory:
    """Tenant → its chunks in memory, loaded from the store on first use."""

    def __init__(self, store: VectorStore, collection: str, dim: int) -> None:
        self._store = store
        self._collection = collection
        self._dim = dim
        self._tenants: dict[str, TenantChunks] = {}
        self._versions: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def invalidate(self, tenant: str) -> None:
        """The tenant's chunks changed in the store: load them again on next use."""
        self._tenants.pop(tenant, None)
        self._versions[tenant] = self._versions.get(tenant, 0) + 1

    async def chunks(self, tenant: str) -> TenantChunks:
        cached = self._tenants.get(tenant)
        if cached is not None:
            return cached
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            cached = self._tenants.get(tenant)
            if cached is not None:
                return cached
            version = self._versions.get(tenant, 0)
            points = await self._store.scan(self._collection, {"tenant_id": tenant})
            loaded = TenantChunks.of(points, self._dim)
            # An empty tenant is not kept: any tenant id may be asked about.
            if points and version == self._versions.get(tenant, 0):
                self._tenants[tenant] = loaded
            return loaded
