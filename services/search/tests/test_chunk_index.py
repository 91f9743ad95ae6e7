"""Chunks from ChunksExtracted in the embedded vector store: replace, idempotence, deletion,
tenant isolation, search filtered by context id, and events handled out of order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from pml_common.context_id import make_context_id
from pml_common.embedding import build_passage_embedder
from pml_common.events import ChunkPayload, ChunksExtracted, DocumentDeleted
from pml_common.latest_wins import LatestWins
from pml_common.settings import Settings
from pml_search.chunk_consumers import ChunkConsumers
from pml_search.chunk_index import ChunkIndex, collection_for
from pml_search.vector_store import QdrantVectorStore


def _chunk(doc: str, path: str, text: str, n: int = 0) -> ChunkPayload:
    context_id = make_context_id(doc, path)
    return ChunkPayload(
        chunk_id=f"{context_id}:{n}",
        context_id=context_id,
        section_path=path,
        text=text,
        char_start=0,
        char_end=len(text),
    )


@pytest.fixture
async def index(settings: Settings, redis) -> AsyncIterator[ChunkIndex]:
    store = QdrantVectorStore.from_settings(settings)
    chunks = ChunkIndex(store, build_passage_embedder(settings, redis))
    await chunks.start()
    yield chunks
    await chunks.stop()
    await store.close()


async def test_document_chunks_are_replaced_idempotently(index: ChunkIndex, tenant: str) -> None:
    first = [
        _chunk("d1", "Guide / Quotes", "Quotes are approved."),
        _chunk("d1", "Guide / Contracts", "Contracts are signed."),
    ]
    assert await index.index_document(tenant, "d1", first) == 2
    assert await index.index_document(tenant, "d1", first) == 0  # a redelivery: nothing to do
    second = [first[0], _chunk("d1", "Guide / Billing", "Invoices are sent.")]
    assert await index.index_document(tenant, "d1", second) == 1
    assert await index.count(tenant, "d1") == 2
    await index.index_document(f"{tenant}-b", "d1", first)
    await index.delete_document(tenant, "d1")
    assert await index.count(tenant) == 0
    assert await index.count(f"{tenant}-b") == 2


async def test_search_filters_by_context_ids(
    index: ChunkIndex, tenant: str, settings, redis
) -> None:
    chunks = [
        _chunk("d1", "Sales / Quotes", "A quotation becomes a contract after approval."),
        _chunk("d2", "IT / Cloud", "Digital transformation moves workloads to the cloud."),
    ]
    for chunk in chunks:
        await index.index_document(tenant, chunk.context_id.split(":")[1], [chunk])
    embedder = build_passage_embedder(settings, redis)
    [query] = await embedder.embed_queries(["transformation"])
    everything = await index.search(tenant, query, 5)
    assert {h.document_id for h in everything} == {"d1", "d2"}
    only = await index.search(tenant, query, 5, context_ids=[chunks[0].context_id])
    assert [(h.document_id, h.context_id, h.section_path) for h in only] == [
        ("d1", chunks[0].context_id, "Sales / Quotes")
    ]
    assert only[0].text == chunks[0].text
    # The collection is named after the embedder, so that two models never share one.
    assert index.collection == collection_for(index.embedder.name)
    assert collection_for("use:multilingual-v3") == "pml_chunks__use_multilingual_v3"


async def test_events_handled_out_of_order_apply_in_the_order_requested(
    index: ChunkIndex, tenant: str, settings: Settings, redis
) -> None:
    """The chunks of a submission, its deletion and a newer version travel on three streams:
    whatever order they are handled in, the latest request wins."""
    consumers = ChunkConsumers(index, LatestWins(redis, "test-search-chunks"))
    old = [_chunk("d1", "Guide / Quotes", "Quotes are approved.")]
    new = [_chunk("d1", "Guide / Billing", "Invoices are sent.")]
    submitted_at = datetime.now(UTC)

    def extracted(chunks: list[ChunkPayload], at: datetime) -> ChunksExtracted:
        return ChunksExtracted.create(
            tenant_id=tenant, document_id="d1", chunks=chunks, submitted_at=at
        )

    deleted = DocumentDeleted.create(tenant_id=tenant, document_id="d1")
    # the deletion is handled first; the chunks of the submission made before it come late
    await consumers.on_document_deleted(deleted)
    await consumers.on_chunks_extracted([extracted(old, submitted_at)])
    assert await index.count(tenant, "d1") == 0
    # a version submitted after the deletion is indexed; an older one arriving late is not
    await consumers.on_chunks_extracted([extracted(new, submitted_at + timedelta(seconds=2))])
    await consumers.on_chunks_extracted([extracted(old, submitted_at + timedelta(seconds=1))])
    [query] = await build_passage_embedder(settings, redis).embed_queries(["invoices"])
    [found] = await index.search(tenant, query, 5)
    assert found.text == "Invoices are sent."
    # and the late deletion no longer removes the newer version
    await consumers.on_document_deleted(deleted)
    assert await index.count(tenant, "d1") == 1


async def test_documents_indexed_in_one_batch_are_stored_as_one_at_a_time(
    index: ChunkIndex, tenant: str
) -> None:
    documents = {
        f"d{i}": [
            _chunk(f"d{i}", "Guide / Quotes", f"Quote {i} is approved."),
            _chunk(f"d{i}", "Guide / Billing", f"Invoice {i} is sent.", 1),
        ]
        for i in range(5)
    }
    documents["d4"] = []  # a document left with no chunk
    for doc, chunks in documents.items():
        await index.index_document(f"{tenant}-one", doc, chunks[:1])  # an older version each
        await index.index_document(f"{tenant}-one", doc, chunks)
    for doc, chunks in documents.items():
        await index.index_document(tenant, doc, chunks[:1])
    assert await index.index_documents(tenant, documents) == 4  # the Billing chunks only
    assert await index.index_documents(tenant, documents) == 0  # a redelivery: nothing to do

    async def stored(who: str) -> dict[str, tuple[dict[str, object], list[float]]]:
        points = await index._store.scan(index.collection, {"tenant_id": who})
        return {
            str(p.payload["chunk_id"]): (
                {k: v for k, v in p.payload.items() if k != "tenant_id"},
                [round(float(x), 5) for x in p.vector],
            )
            for p in points
        }

    one_at_a_time, batched = await stored(f"{tenant}-one"), await stored(tenant)
    assert len(batched) == 8
    assert batched == one_at_a_time


async def test_the_later_of_two_versions_in_one_batch_wins(
    index: ChunkIndex, tenant: str, redis
) -> None:
    consumers = ChunkConsumers(index, LatestWins(redis, "test-search-chunks"))
    at = datetime.now(UTC)
    old = [_chunk("d1", "Guide / Quotes", "Quotes are approved.")]
    new = [_chunk("d1", "Guide / Billing", "Invoices are sent.")]
    other = [_chunk("d2", "Guide / Contracts", "Contracts are signed.")]

    def extracted(doc: str, chunks: list[ChunkPayload], when: datetime) -> ChunksExtracted:
        return ChunksExtracted.create(
            tenant_id=tenant, document_id=doc, chunks=chunks, submitted_at=when
        )

    await consumers.on_chunks_extracted(
        [
            extracted("d1", old, at),
            extracted("d2", other, at),
            extracted("d1", new, at + timedelta(seconds=1)),
        ]
    )
    await consumers.on_chunks_extracted([extracted("d1", old, at)])  # late: refused
    assert await index.count(tenant) == 2
    texts = {
        p.payload["text"] for p in await index._store.scan(index.collection, {"tenant_id": tenant})
    }
    assert texts == {"Invoices are sent.", "Contracts are signed."}
