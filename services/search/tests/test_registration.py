"""RegisterTools and RegisterCapabilities are all or nothing (real stores, real gRPC server).

The bus publishes to a Redis of the test's own, so that it can be stopped: a registration whose
event cannot be published must leave the vector store as it was and say why.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import neo4j
import numpy as np
import pytest
from redis.asyncio import Redis

from pml.v1 import common_pb2, search_pb2, search_pb2_grpc
from pml_common.bus import EVENT_FIELD, EventBus
from pml_common.embedding import Embedder, build_tool_embedder
from pml_common.events import CapabilityLearned, Event, ToolsRegistered
from pml_common.grpc_server import GrpcServer
from pml_common.local_runtime import ManagedProcess, start_redis
from pml_common.settings import Settings
from pml_common.stores import redis_client
from pml_common.testing import eventually
from pml_search.catalog_index import CAPABILITY, TOOL, CatalogIndex
from pml_search.graph_view import GraphView
from pml_search.service import SearchServicer
from pml_search.vector_store import QdrantVectorStore

CATALOG = {
    "fs:read_file": "Read the complete contents of a file from the file system.",
    "fs:write_file": "Create a new file or overwrite an existing file with new content.",
    "web:fetch": "Fetch a web page by URL and return its text.",
    "git:commit": "Record changes to the repository with a commit message.",
}


def tool(tool_id: str, description: str) -> common_pb2.Tool:
    server, name = tool_id.split(":")
    return common_pb2.Tool(id=tool_id, server=server, name=name, description=description)


def capability(cap_id: str, description: str, tools: list[str]) -> common_pb2.Capability:
    return common_pb2.Capability(id=cap_id, name=cap_id, description=description, tools=tools)


#: Entries a registration embeds and stores at a time here: small, so that small catalogs take
#: many chunks.
CHUNK = 3


class HeldEmbedder:
    """The real tool embedder, which a test can make wait after some calls: a registration is
    then midway for as long as the test needs, whatever the machine's speed."""

    def __init__(self, inner: Embedder) -> None:
        self._inner = inner
        self._calls_left: int | None = None
        self.holding = asyncio.Event()
        self._release = asyncio.Event()

    def hold_after(self, calls: int) -> None:
        self._calls_left = calls

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def dim(self) -> int:
        return self._inner.dim

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return await self._inner.embed_queries(texts)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        if self._calls_left is not None:
            if self._calls_left == 0:
                self.holding.set()
                await self._release.wait()
            self._calls_left -= 1
        return await self._inner.embed_passages(texts)


@dataclass
class Rig:
    """A search servicer on real stores, whose bus Redis the test may stop."""

    stub: search_pb2_grpc.SearchServiceStub
    store: QdrantVectorStore
    catalog: CatalogIndex
    bus_redis: ManagedProcess
    bus: Redis
    embedder: HeldEmbedder

    async def points(self, kind: str, tenant: str) -> dict[str, tuple[dict[str, Any], Any]]:
        """The tenant's stored points of `kind`: payload and vector by point id."""
        points = await self.store.scan(self.catalog.collections[kind], {"tenant_id": tenant})
        return {p.id: (p.payload, p.vector) for p in points}

    async def published(self, event_type: type[Event]) -> list[dict[str, Any]]:
        """The events of `event_type` on the bus, oldest first."""
        rows = await self.bus.xrange(event_type.STREAM)
        return [json.loads(fields[EVENT_FIELD.encode()]) for _, fields in rows]


def payloads(points: dict[str, tuple[dict[str, Any], Any]]) -> dict[str, dict[str, Any]]:
    return {point_id: payload for point_id, (payload, _) in points.items()}


def assert_same_points(
    after: dict[str, tuple[dict[str, Any], Any]], before: dict[str, tuple[dict[str, Any], Any]]
) -> None:
    assert sorted(after) == sorted(before)
    for point_id, (payload, vector) in before.items():
        assert after[point_id][0] == payload
        np.testing.assert_allclose(after[point_id][1], vector, atol=1e-6)


@pytest.fixture
def bus_redis(tmp_path: Path) -> Iterator[ManagedProcess]:
    proc = start_redis(tmp_path / "bus-redis")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def rig(
    settings: Settings, graph_db: neo4j.AsyncDriver, bus_redis: ManagedProcess
) -> AsyncIterator[Rig]:
    # USE alone keeps the embedding of the larger catalogs below quick.
    local = settings.model_copy(update={"tool_embedder": "use", "catalog_write_chunk": CHUNK})
    cache = redis_client(local)
    bus_client = redis_client(local.model_copy(update={"redis_url": bus_redis.url}))
    store = QdrantVectorStore.from_settings(local)
    embedder = HeldEmbedder(build_tool_embedder(local, cache))
    catalog = CatalogIndex(store, embedder)
    await catalog.start()
    servicer = SearchServicer(
        local,
        catalog,
        GraphView(graph_db, local.neo4j_database),
        EventBus(local, "search-test", redis=bus_client),
    )
    server = GrpcServer(local, 0, "search-test")
    server.add(
        lambda s: search_pb2_grpc.add_SearchServiceServicer_to_server(servicer, s),
        "pml.v1.SearchService",
    )
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = search_pb2_grpc.SearchServiceStub(channel)
            yield Rig(stub, store, catalog, bus_redis, bus_client, embedder)
    finally:
        await server.stop(0)
        await store.close()
        await bus_client.aclose()
        await cache.aclose()


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def test_tools_whose_event_cannot_be_published_leave_the_store_as_it_was(
    rig: Rig, tenant: str
) -> None:
    first = [tool(i, d) for i, d in CATALOG.items()]
    await rig.stub.RegisterTools(
        search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=first), timeout=60
    )
    before = await rig.points(TOOL, tenant)
    assert len(before) == len(CATALOG)

    rig.bus_redis.stop()
    # Two tools replaced (new descriptions), two added: none of it may stay.
    second = [
        tool("fs:read_file", "Read a file as base64."),
        tool("web:fetch", "Download a URL."),
        tool("slack:post", "Post a message to a Slack channel."),
        tool("mail:send", "Send an email."),
    ]
    error = await rpc_error(
        rig.stub.RegisterTools(
            search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=second), timeout=60
        )
    )
    assert_same_points(await rig.points(TOOL, tenant), before)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "nothing was registered" in (error.details() or "")
    # Searches are served from the catalog as it was.
    node = await rig.stub.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id="web:fetch"))
    assert node.description == CATALOG["web:fetch"]
    missing = await rpc_error(
        rig.stub.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id="slack:post"))
    )
    assert missing.code() == grpc.StatusCode.NOT_FOUND


async def test_capabilities_whose_events_cannot_be_published_leave_the_store_as_it_was(
    rig: Rig, tenant: str
) -> None:
    rig.bus_redis.stop()
    caps = [
        capability("edit-file", "Read a file, change it, write it back.", list(CATALOG)[:2]),
        capability("publish-page", "Fetch a page and commit it.", ["web:fetch", "git:commit"]),
    ]
    error = await rpc_error(
        rig.stub.RegisterCapabilities(
            search_pb2.RegisterCapabilitiesRequest(tenant_id=tenant, capabilities=caps),
            timeout=60,
        )
    )
    assert await rig.points(CAPABILITY, tenant) == {}
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "nothing was registered" in (error.details() or "")


async def test_a_registration_its_caller_abandons_midway_leaves_the_store_as_it_was(
    rig: Rig, tenant: str
) -> None:
    first = [tool(i, d) for i, d in CATALOG.items()]
    await rig.stub.RegisterTools(
        search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=first), timeout=60
    )
    before = await rig.points(TOOL, tenant)
    many = [tool(f"bulk:tool_{i}", f"Handles item {i} of the bulk set.") for i in range(300)]
    many[0] = tool("fs:read_file", "Read a file as base64.")  # a replaced one too
    rig.embedder.hold_after(10)
    call = rig.stub.RegisterTools(
        search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=many), timeout=120
    )
    # Ten chunks are stored, the eleventh waits: the caller goes away.
    await asyncio.wait_for(rig.embedder.holding.wait(), timeout=60)
    assert len(await rig.points(TOOL, tenant)) == len(before) + 10 * CHUNK - 1
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # The undo runs on after the cancellation (shielded): added points go, then replaced ones
    # are written back.
    await eventually(
        lambda: rig.points(TOOL, tenant), lambda now: payloads(now) == payloads(before)
    )
    assert_same_points(await rig.points(TOOL, tenant), before)
    assert len(await rig.published(ToolsRegistered)) == 1  # the first registration's only
    node = await rig.stub.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id="fs:read_file"))
    assert node.description == CATALOG["fs:read_file"]


async def test_a_large_registration_is_stored_in_chunks_served_whole_and_announced_once(
    rig: Rig, tenant: str
) -> None:
    count = 100 * CHUNK + 1
    batch = [tool(f"bulk:tool_{i}", f"Handles item {i} of the bulk set.") for i in range(count)]
    reply = await rig.stub.RegisterTools(
        search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=batch), timeout=300
    )
    assert reply.registered == count
    assert len(reply.event_ids) == 1
    assert len(await rig.points(TOOL, tenant)) == count
    for t in batch:
        node = await rig.stub.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id=t.id))
        assert node.description == t.description
    found = await rig.stub.Search(
        search_pb2.SearchRequest(tenant_id=tenant, query="item 257", retriever="lexical"),
        timeout=30,
    )
    assert found.results[0].id == "bulk:tool_257"
    [event] = await rig.published(ToolsRegistered)
    assert [t["id"] for t in event["tools"]] == [t.id for t in batch]


async def test_capabilities_published_before_the_bus_failed_are_named(
    rig: Rig, tenant: str
) -> None:
    """Capabilities have an event each: when the bus refuses one after others were published
    (here its Redis runs out of memory), the answer names what is registered and what is not."""
    caps = [
        capability("small", "A short one.", ["git:commit"]),
        capability("big", "Many tools.", [f"bulk:{'t' * 100}_{i}" for i in range(1000)]),
        capability("smaller", "Shorter.", ["git:commit"]),
    ]
    await rig.bus.config_set("maxmemory-policy", "noeviction")
    await rig.bus.ping()  # the bus's connection is open: it costs no memory later
    used = (await rig.bus.info("memory"))["used_memory"]
    # Room for the first event (1 kB), not for the second (110 kB): Redis counts the command
    # it receives, and refuses it.
    await rig.bus.config_set("maxmemory", used + 32_768)
    error = await rpc_error(
        rig.stub.RegisterCapabilities(
            search_pb2.RegisterCapabilitiesRequest(tenant_id=tenant, capabilities=caps),
            timeout=60,
        )
    )
    await rig.bus.config_set("maxmemory", 0)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    details = error.details() or ""
    assert "the bus failed after 1 of 3 events were published" in details
    assert "'small' are registered; the other 2 are not" in details
    assert [e["capability"]["id"] for e in await rig.published(CapabilityLearned)] == ["small"]
