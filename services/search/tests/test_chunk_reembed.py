"""Chunks of another collection re-embedded at start (an upgrade from `pml_chunks`, or a new
passage embedder), on the real embedded vector store with the `use` passage embedder: both
tenants' chunks searchable with this embedder's vectors and kept apart, a document written or
deleted meanwhile not overwritten by its old copy, a stopped re-embedding resumed, and nothing
embedded again once done."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from pml_common.context_id import make_context_id
from pml_common.embedding import Embedder, build_passage_embedder
from pml_common.events import ChunkPayload
from pml_common.settings import Settings
from pml_search.chunk_index import (
    INDEXED_FIELDS,
    STEM,
    ChunkIndex,
    chunk_text,
    collection_for,
    point_id,
)
from pml_search.vector_store import Filter, QdrantVectorStore, VectorPoint

LEGACY_DIM = 384  # the vectors of another model: none of them may reach the new collection


class HeldLoads(QdrantVectorStore):
    """The real store; the next read of one tenant's payloads after `hold()` (the
    re-embedding loading a tenant) says when it has read, then returns once the gate is set."""

    held: tuple[asyncio.Event, asyncio.Event] | None = None

    def hold(self) -> tuple[asyncio.Event, asyncio.Event]:
        self.held = (asyncio.Event(), asyncio.Event())
        return self.held

    async def payloads(
        self, collection: str, where: Filter | None = None, fields: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        found = await super().payloads(collection, where, fields)
        if where and "tenant_id" in where and self.held is not None:
            (loaded, gate), self.held = self.held, None
            loaded.set()
            await gate.wait()
        return found


class CountingEmbedder:
    """The passage embedder, counting the passages it embeds."""

    def __init__(self, inner: Embedder) -> None:
        self._inner = inner
        self.passages = 0

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def dim(self) -> int:
        return self._inner.dim

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return await self._inner.embed_queries(texts)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.passages += len(texts)
        return await self._inner.embed_passages(texts)


def _chunk(doc: str, path: str, text: str) -> ChunkPayload:
    context_id = make_context_id(doc, path)
    return ChunkPayload(
        chunk_id=f"{context_id}:0",
        context_id=context_id,
        section_path=path,
        text=text,
        char_start=0,
        char_end=len(text),
    )


def _legacy_documents(a: str, b: str) -> dict[tuple[str, str], list[ChunkPayload]]:
    return {
        (a, "d1"): [
            _chunk("d1", "Sales / Quotes", "A quotation is approved by the sales director."),
            _chunk("d1", "Sales / Contracts", "A signed quotation becomes a contract."),
        ],
        (a, "d2"): [_chunk("d2", "IT / Cloud", "Workloads move to the cloud.")],
        (b, "d1"): [_chunk("d1", "HR / Leave", "Employees ask their manager before leave.")],
    }


async def _write_legacy(
    store: QdrantVectorStore, documents: dict[tuple[str, str], list[ChunkPayload]]
) -> None:
    """What an older release left: `pml_chunks`, another model's vectors, its hashes."""
    await store.ensure_collection(STEM, LEGACY_DIM, INDEXED_FIELDS)
    rng = np.random.default_rng(7)
    points = []
    for (tenant, doc), chunks in documents.items():
        for c in chunks:
            vector = rng.standard_normal(LEGACY_DIM).astype(np.float32)
            payload = {"tenant_id": tenant, "document_id": doc, **c.model_dump()}
            payload["content_hash"] = "written-by-an-older-release"
            points.append(VectorPoint(point_id(tenant, c.chunk_id), vector, payload))
    await store.upsert(STEM, points)


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[HeldLoads]:
    vectors = HeldLoads.from_settings(settings)
    yield vectors
    await vectors.close()


@pytest.fixture
def embedder(settings: Settings, redis) -> CountingEmbedder:
    return CountingEmbedder(build_passage_embedder(settings, redis))


async def _started(store: QdrantVectorStore, embedder: CountingEmbedder) -> ChunkIndex:
    index = ChunkIndex(store, embedder)
    await index.start()
    return index


async def test_legacy_chunks_are_reembedded_for_each_tenant(
    store: HeldLoads, embedder: CountingEmbedder, tenant: str
) -> None:
    other = f"{tenant}-b"
    documents = _legacy_documents(tenant, other)
    await _write_legacy(store, documents)
    with capture_logs() as logs:
        index = await _started(store, embedder)
        await index.reembedded()
    assert index.collection == collection_for(embedder.name)
    [started] = [e for e in logs if e["event"] == "chunks.reembed_started"]
    assert (started["source"], started["target"], started["points"]) == (STEM, index.collection, 4)
    [done] = [e for e in logs if e["event"] == "chunks.reembed_done"]
    assert (done["embedded"], done["documents"]) == (4, 3)
    assert (await index.count(tenant), await index.count(other)) == (3, 1)
    # This embedder's vectors, not the old ones.
    for (owner, doc), chunks in documents.items():
        stored = await store.scan(index.collection, {"tenant_id": owner, "document_id": doc})
        by_chunk = {p.payload["chunk_id"]: p.vector for p in stored}
        expected = await embedder.embed_passages([chunk_text(c) for c in chunks])
        got = np.stack([by_chunk[c.chunk_id] for c in chunks])
        np.testing.assert_allclose(got, expected, atol=1e-5)
    # Written with the hashes this embedder writes: the same chunks again change nothing.
    assert await index.index_document(tenant, "d1", documents[(tenant, "d1")]) == 0
    # Searchable, each tenant its own chunks only.
    [query] = await embedder.embed_queries(["Who approves a quotation?"])
    found = await index.search(tenant, query, 5)
    assert found[0].text == "A quotation is approved by the sales director."
    assert {h.document_id for h in found} == {"d1", "d2"}
    assert [h.text for h in await index.search(other, query, 5)] == [
        "Employees ask their manager before leave."
    ]
    # The source is left as it was.
    assert await store.count(STEM) == 4
    await index.stop()


async def test_documents_written_or_deleted_meanwhile_keep_the_newer_request(
    store: HeldLoads, embedder: CountingEmbedder, tenant: str
) -> None:
    documents = _legacy_documents(tenant, f"{tenant}-b")
    await _write_legacy(store, documents)
    loaded, gate = store.hold()
    index = await _started(store, embedder)
    # The re-embedding has read the tenant's old chunks and not yet written them.
    await asyncio.wait_for(loaded.wait(), 30)
    newer = [_chunk("d1", "Sales / Pricing", "Prices are set by the pricing committee.")]
    assert await index.index_document(tenant, "d1", newer) == 1
    await index.delete_document(tenant, "d2")
    gate.set()
    await index.reembedded()
    stored = await store.payloads(index.collection, {"tenant_id": tenant})
    assert [(p["document_id"], p["text"]) for p in stored] == [("d1", newer[0].text)]
    assert await index.count(f"{tenant}-b") == 1
    # The deletion reached the old collection too: a later start cannot bring d2 back.
    assert await store.count(STEM, {"tenant_id": tenant, "document_id": "d2"}) == 0
    await index.stop()
    again = await _started(store, embedder)
    await again.reembedded()
    assert await again.count(tenant) == 1
    await again.stop()


async def test_a_stopped_reembedding_resumes_and_a_finished_one_embeds_nothing(
    store: HeldLoads, embedder: CountingEmbedder, tenant: str
) -> None:
    other = f"{tenant}-b"
    await _write_legacy(store, _legacy_documents(tenant, other))
    loaded, gate = store.hold()
    first = await _started(store, embedder)
    # Stopped while it has the first tenant's chunks in hand.
    await asyncio.wait_for(loaded.wait(), 30)
    stopping = asyncio.create_task(first.stop())
    await asyncio.sleep(0.05)
    gate.set()
    await stopping
    assert embedder.passages == 0
    second = await _started(store, embedder)
    await second.reembedded()
    await second.stop()
    assert embedder.passages == 4
    assert (await second.count(tenant), await second.count(other)) == (3, 1)
    with capture_logs() as logs:
        third = await _started(store, embedder)
        await third.reembedded()
        await third.stop()
    assert embedder.passages == 4  # nothing embedded again
    [done] = [e for e in logs if e["event"] == "chunks.reembed_done"]
    assert (done["embedded"], done["documents"]) == (0, 0)
