"""Search's subscriptions for document chunks, in their own consumer group `search-chunks`.

`ChunksExtracted` → the document's chunks replaced in the vector store, the documents of one
bus read together (one read of what is stored, one embedding call and one write per tenant);
`DocumentDeleted` → its chunks removed; `TenantDeleted` → the tenant's chunks removed. All
idempotent (see `chunk_index`). They travel on three streams and may be handled in another
order than they were requested: each is applied only if no later request about the document
was (`LatestWins`), so a late `ChunksExtracted` never brings back a deleted document or an
older version.
"""

from __future__ import annotations

import structlog

from pml_common.bus import EventBus
from pml_common.events import ChunksExtracted, DocumentDeleted, TenantDeleted
from pml_common.latest_wins import LatestWins
from pml_search.chunk_index import ChunkIndex

GROUP = "search-chunks"
log = structlog.get_logger(__name__)


class ChunkConsumers:
    def __init__(self, index: ChunkIndex, claims: LatestWins) -> None:
        self._index = index
        self._claims = claims

    def subscribe(self, bus: EventBus) -> None:
        bus.subscribe_batch(ChunksExtracted, GROUP, self.on_chunks_extracted)
        bus.subscribe(DocumentDeleted, GROUP, self.on_document_deleted)
        bus.subscribe(TenantDeleted, GROUP, self.on_tenant_deleted)

    async def on_chunks_extracted(self, events: list[ChunksExtracted]) -> None:
        claimed: dict[str, dict[str, ChunksExtracted]] = {}
        for event in events:  # in stream order: of two versions of a document, the later wins
            tenant, doc = event.tenant_id, event.document_id
            if await self._claims.claim_document(
                tenant, doc, event.submitted_at or event.occurred_at
            ):
                claimed.setdefault(tenant, {})[doc] = event
            else:
                log.info("search.superseded_chunks_skipped", tenant=tenant, document_id=doc)
        for tenant, documents in claimed.items():
            chunks = {doc: event.chunks for doc, event in documents.items()}
            await self._index.index_documents(tenant, chunks)

    async def on_document_deleted(self, event: DocumentDeleted) -> None:
        tenant, doc = event.tenant_id, event.document_id
        if await self._claims.claim_document(tenant, doc, event.occurred_at):
            await self._index.delete_document(tenant, doc)
        else:
            log.info("search.superseded_deletion_skipped", tenant=tenant, document_id=doc)

    async def on_tenant_deleted(self, event: TenantDeleted) -> None:
        await self._claims.claim_tenant_deletion(event.tenant_id, event.occurred_at)
        await self._index.delete_tenant(event.tenant_id)
