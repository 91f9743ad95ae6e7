"""Search's subscriptions for document chunks, in their own consumer group `search-chunks`.

`ChunksExtracted` → the document's chunks replaced in the vector store; `DocumentDeleted` → its
chunks removed; `TenantDeleted` → the tenant's chunks removed. All idempotent (see
`chunk_index`).
"""

from __future__ import annotations

from pml_common.bus import EventBus
from pml_common.events import ChunksExtracted, DocumentDeleted, TenantDeleted
from pml_search.chunk_index import ChunkIndex

GROUP = "search-chunks"


class ChunkConsumers:
    def __init__(self, index: ChunkIndex) -> None:
        self._index = index

    def subscribe(self, bus: EventBus) -> None:
        bus.subscribe(ChunksExtracted, GROUP, self.on_chunks_extracted)
        bus.subscribe(DocumentDeleted, GROUP, self.on_document_deleted)
        bus.subscribe(TenantDeleted, GROUP, self.on_tenant_deleted)

    async def on_chunks_extracted(self, event: ChunksExtracted) -> None:
        await self._index.index_document(event.tenant_id, event.document_id, event.chunks)

    async def on_document_deleted(self, event: DocumentDeleted) -> None:
        await self._index.delete_document(event.tenant_id, event.document_id)

    async def on_tenant_deleted(self, event: TenantDeleted) -> None:
        await self._index.delete_tenant(event.tenant_id)
