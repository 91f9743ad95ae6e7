"""ChunkMemory on the real embedded vector store: its bound, loads racing with writes, and
nothing kept per tenant id asked about."""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import pytest

from pml_common.settings import Settings
from pml_common.tenant_cache import TenantCache
from pml_search.chunk_memory import ChunkMemory
from pml_search.vector_store import Filter, QdrantVectorStore, VectorPoint

COLLECTION = "test_chunk_memory"
DIM = 8


class HeldScans(QdrantVectorStore):
    """The real store; the first scan after `hold()` says when it has read the store, then
    returns only once the test sets the gate."""

    held: tuple[asyncio.Event, asyncio.Event] | None = None

    def hold(self) -> tuple[asyncio.Event, asyncio.Event]:
        """(scanned, gate) of the next scan."""
        self.held = (asyncio.Event(), asyncio.Event())
        return self.held

    async def scan(self, collection: str, where: Filter | None = None) -> list[VectorPoint]:
        points = await super().scan(collection, where)
        held, self.held = self.held, None
        if held is not None:
            scanned, gate = held
            scanned.set()
            await gate.wait()
        return points


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[HeldScans]:
    vectors = HeldScans.from_settings(settings)
    await vectors.ensure_collection(COLLECTION, DIM)
    yield vectors
    await vectors.close()


async def write(store: QdrantVectorStore, tenant: str, texts: Sequence[str]) -> None:
    rng = np.random.default_rng(len(tenant))
    points = []
    for text in texts:
        vector = rng.standard_normal(DIM).astype(np.float32)
        payload = {"tenant_id": tenant, "document_id": "d1", "context_id": "c1", "text": text}
        points.append(VectorPoint(str(uuid.uuid4()), vector / np.linalg.norm(vector), payload))
    await store.upsert(COLLECTION, points)


def texts(memory_chunks: Any) -> list[str]:
    return sorted(p.payload["text"] for p in memory_chunks.points)


def held(memory: ChunkMemory) -> int:
    """Entries of every per-tenant container of `memory`."""
    containers = (dict, weakref.WeakValueDictionary, TenantCache)
    return sum(len(v) for v in vars(memory).values() if isinstance(v, containers))


async def test_past_the_bound_the_least_recently_used_tenant_is_dropped_then_read_again(
    store: HeldScans, tenant: str
) -> None:
    other = f"{tenant}-b"
    await write(store, tenant, ["a", "b"])
    await write(store, other, ["c"])
    memory = ChunkMemory(store, COLLECTION, DIM, max_chunks=2)
    first = await memory.chunks(tenant)
    assert texts(first) == ["a", "b"]
    assert await memory.chunks(tenant) is first  # kept
    assert texts(await memory.chunks(other)) == ["c"]  # 3 chunks: the tenant gives way
    again = await memory.chunks(tenant)
    assert again is not first  # read again from the store...
    assert texts(again) == ["a", "b"]  # ...to the same chunks
    np.testing.assert_array_equal(
        again.vectors[np.argsort([p.payload["text"] for p in again.points])],
        first.vectors[np.argsort([p.payload["text"] for p in first.points])],
    )
    assert await memory.chunks(tenant) is again  # and kept, "other" dropped in turn
    assert held(memory) == 1


async def test_a_load_that_raced_with_a_write_is_served_but_not_kept(
    store: HeldScans, tenant: str
) -> None:
    await write(store, tenant, ["a"])
    memory = ChunkMemory(store, COLLECTION, DIM)
    scanned, gate = store.hold()
    load = asyncio.create_task(memory.chunks(tenant))
    await scanned.wait()  # the load has read ["a"]
    await write(store, tenant, ["b"])
    memory.invalidate(tenant)  # as ChunkIndex does after a write
    gate.set()
    assert texts(await load) == ["a"]
    assert texts(await memory.chunks(tenant)) == ["a", "b"]  # not the stale read
    await memory.close()


async def test_tenant_ids_asked_about_or_invalidated_leave_nothing_behind(
    store: HeldScans, tenant: str
) -> None:
    memory = ChunkMemory(store, COLLECTION, DIM)
    asked = [f"{tenant}-{i}" for i in range(50)]
    for chunks in await asyncio.gather(*(memory.chunks(t) for t in asked)):
        assert chunks.points == []
    for t in asked:
        memory.invalidate(t)
    assert held(memory) == 0
    await memory.close()


async def test_written_chunks_are_read_again_before_the_next_question(
    store: HeldScans, tenant: str
) -> None:
    memory = ChunkMemory(store, COLLECTION, DIM, read_ahead_s=0.05)
    await write(store, tenant, ["a"])
    assert texts(await memory.chunks(tenant)) == ["a"]
    scanned, gate = store.hold()
    gate.set()
    await write(store, tenant, ["b"])
    memory.invalidate(tenant)  # as ChunkIndex does after a write
    await asyncio.wait_for(scanned.wait(), 3.0)  # read with no question asked
    for _ in range(100):
        if held(memory) == 1:
            break
        await asyncio.sleep(0.01)
    # the next question finds them in memory: it reads nothing
    unread, _ = store.hold()
    assert texts(await asyncio.wait_for(memory.chunks(tenant), 1.0)) == ["a", "b"]
    assert not unread.is_set()
    # a stopping service drops the reads it scheduled
    store.held = None
    memory.invalidate(tenant)
    await memory.close()
    await asyncio.sleep(0.2)
    assert held(memory) == 0
