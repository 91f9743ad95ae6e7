"""Two search replicas on the same Redis and Neo4j: each one's caches follow the events.

Each replica has its own embedded vector store folder here (a Qdrant server would be shared);
what is checked is that catalog and graph events reach the caches of every replica, not only
the one that consumed the event in the shared `search` group.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import neo4j
import pytest
import redis.asyncio

from pml.v1 import common_pb2, search_pb2, search_pb2_grpc
from pml_common.events import GraphChanged, Streams, ToolSpec, ToolsRegistered
from pml_common.settings import Settings
from pml_search.consumers import cache_group
from pml_search.main import SearchApp


@pytest.fixture
async def replicas(settings: Settings, tmp_path: Path) -> AsyncIterator[list[SearchApp]]:
    apps = [
        SearchApp(
            settings.model_copy(
                update={"qdrant_path": str(tmp_path / f"q{i}"), "consumer_name": f"{name}-{i}"}
            ),
            port=0,
        )
        for i, name in enumerate([settings.consumer_name] * 2)
    ]
    for app in apps:
        await app.start()
    yield apps
    for app in apps:
        await app.stop()


async def _until(probe: Callable[[], Awaitable[bool]], within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not await probe():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def _top(app: SearchApp, tenant: str, query: str) -> list[search_pb2.SearchResult]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
        stub = search_pb2_grpc.SearchServiceStub(channel)
        reply = await stub.Search(
            search_pb2.SearchRequest(tenant_id=tenant, query=query, limit=5), timeout=30
        )
    return list(reply.results)


async def test_every_replica_follows_catalog_and_graph_events(
    replicas: list[SearchApp], settings: Settings, graph_db: neo4j.AsyncDriver, tenant: str
) -> None:
    first, second = replicas
    # Both replicas serve the tenant already (its catalog and graph view are cached).
    for app in replicas:
        assert await _top(app, tenant, "read a file") == []
    tool = common_pb2.Tool(id="fs:read_file", name="read_file", description="Read a file")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{first.port}") as channel:
        await search_pb2_grpc.SearchServiceStub(channel).RegisterTools(
            search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=[tool]), timeout=60
        )
    # The second replica's cache follows (it indexes into its own store here; with a shared
    # Qdrant server that is a hash no-op and only its matrix is updated).
    await _until(lambda: _has(second, tenant, "fs:read_file"))

    # A catalog event from elsewhere reaches both replicas' caches.
    spec = ToolSpec(id="web:fetch", server="web", name="fetch", description="Fetch a web page")
    await first.bus.publish(ToolsRegistered.create(tenant_id=tenant, tools=[spec]))
    for app in replicas:
        await _until(lambda app=app: _has(app, tenant, "web:fetch"))

    # A graph change reaches both replicas' graph views.
    await graph_db.execute_query(
        "MERGE (t:Tool {tenant_id: $t, id: 'fs:read_file'}) "
        "SET t.executions = 4, t.successes = 0, t.success_rate = 0.0",
        {"t": tenant},
    )
    await first.bus.publish(
        GraphChanged.create(tenant_id=tenant, reason="test", node_ids=["fs:read_file"])
    )

    async def penalised(app: SearchApp) -> bool:
        results = {r.id: r for r in await _top(app, tenant, "read a file")}
        return results["fs:read_file"].reliability_factor == pytest.approx(0.1)

    for app in replicas:
        await _until(lambda app=app: penalised(app))


async def _has(app: SearchApp, tenant: str, node_id: str) -> bool:
    return node_id in [r.id for r in await _top(app, tenant, "read or fetch")]


async def test_cache_group_starts_at_the_end_and_is_removed_on_stop(
    settings: Settings, tmp_path: Path
) -> None:
    client = redis.asyncio.Redis.from_url(settings.redis_url)
    await client.xadd(Streams.GRAPH_CHANGED, {"event": "{}"})  # history a new replica skips
    app = SearchApp(
        settings.model_copy(update={"qdrant_path": str(tmp_path / "q"), "consumer_name": "r-x"}),
        port=0,
    )
    await app.start()
    try:
        groups = {g["name"].decode(): g for g in await client.xinfo_groups(Streams.GRAPH_CHANGED)}
        mine = groups[cache_group("r-x")]
        assert mine["entries-read"] in (None, 0) or mine["lag"] == 0
        assert mine["pending"] == 0
    finally:
        await app.stop()
    names = {g["name"].decode() for g in await client.xinfo_groups(Streams.GRAPH_CHANGED)}
    assert cache_group("r-x") not in names
    await client.aclose()
