"""Submit is all or nothing: IngestService on the real Redis, its bus on a Redis of the test's
own that the test stops or starves of memory."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from redis.asyncio import Redis

from pml.v1 import ingest_pb2, ingest_pb2_grpc
from pml_common.bus import EVENT_FIELD, EventBus
from pml_common.events import DocumentSubmitted
from pml_common.grpc_server import GrpcServer
from pml_common.local_runtime import ManagedProcess, start_redis
from pml_common.settings import Settings
from pml_common.stores import redis_client
from pml_ingest.service import IngestServicer
from pml_ingest.status import DONE, FAILED, PASSES, StatusStore


@dataclass
class Rig:
    stub: ingest_pb2_grpc.IngestServiceStub
    status: StatusStore
    bus_redis: ManagedProcess
    bus: Redis

    async def submit(self, tenant: str, *docs: ingest_pb2.Document) -> grpc.aio.AioRpcError:
        """Submit, expecting a refusal."""
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await self.stub.Submit(
                ingest_pb2.SubmitRequest(tenant_id=tenant, documents=list(docs)), timeout=30
            )
        return refused.value

    async def announced(self) -> list[str]:
        rows = await self.bus.xrange(DocumentSubmitted.STREAM)
        return [json.loads(f[EVENT_FIELD.encode()])["document_id"] for _, f in rows]


@pytest.fixture
def bus_redis(tmp_path: Path) -> Iterator[ManagedProcess]:
    proc = start_redis(tmp_path / "bus-redis")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def rig(settings: Settings, redis: Redis, bus_redis: ManagedProcess) -> AsyncIterator[Rig]:
    bus_client = redis_client(settings.model_copy(update={"redis_url": bus_redis.url}))
    status = StatusStore(redis)
    servicer = IngestServicer(settings, status, EventBus(settings, "ingest-test", redis=bus_client))
    server = GrpcServer(settings, 0, "ingest-test")
    server.add(
        lambda s: ingest_pb2_grpc.add_IngestServiceServicer_to_server(servicer, s),
        "pml.v1.IngestService",
    )
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Rig(ingest_pb2_grpc.IngestServiceStub(channel), status, bus_redis, bus_client)
    finally:
        await server.stop(0)
        await bus_client.aclose()


def doc(doc_id: str, text: str) -> ingest_pb2.Document:
    return ingest_pb2.Document(id=doc_id, title=f"Title of {doc_id}", text=text)


async def test_documents_whose_events_cannot_be_published_keep_the_status_they_had(
    rig: Rig, tenant: str
) -> None:
    await rig.stub.Submit(
        ingest_pb2.SubmitRequest(tenant_id=tenant, documents=[doc("old", "First text.")])
    )
    stored = await rig.status.get(tenant, "old")
    assert stored is not None
    for name in PASSES[:-1]:
        await rig.status.mark(tenant, "old", stored.content_hash, name, DONE)
    await rig.status.mark(tenant, "old", stored.content_hash, PASSES[-1], FAILED, "boom")
    before = await rig.status.get(tenant, "old")
    assert before is not None

    rig.bus_redis.stop()
    refused = await rig.submit(tenant, doc("old", "Second text."), doc("new", "Other text."))
    after = await rig.status.get(tenant, "old")
    assert after is not None
    assert (after.content_hash, after.title) == (before.content_hash, before.title)
    assert [(p.name, p.state, p.error) for p in after.passes] == [
        (p.name, p.state, p.error) for p in before.passes
    ]
    assert await rig.status.get(tenant, "new") is None
    assert await rig.status.documents(tenant) == ["old"]
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert "nothing was submitted" in (refused.details() or "")


async def test_documents_announced_before_the_bus_failed_are_named(rig: Rig, tenant: str) -> None:
    await rig.bus.config_set("maxmemory-policy", "noeviction")
    await rig.bus.ping()  # the bus's connection is open: it costs no memory later
    used = (await rig.bus.info("memory"))["used_memory"]
    # Room for the first event (1 kB), not for the second (100 kB): Redis refuses it.
    await rig.bus.config_set("maxmemory", used + 32_768)
    refused = await rig.submit(
        tenant, doc("a", "Short."), doc("b", "Long text. " * 10_000), doc("c", "Short too.")
    )
    await rig.bus.config_set("maxmemory", 0)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    details = refused.details() or ""
    assert "the bus failed after 1 of 3 events were published" in details
    assert "'a' are submitted; the other 2 are not" in details
    assert await rig.announced() == ["a"]
    assert await rig.status.documents(tenant) == ["a"]
