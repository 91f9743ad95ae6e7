"""Redis's memory policy (docs/operations.md, "Memory") on a real Redis given little memory:
past `maxmemory` the embedding cache is evicted and no stream entry is; once nothing evictable
is left, writes fail rather than data being lost."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError

from pml_common.bus import EventBus
from pml_common.embedding import CachedEmbedder, UseEmbedder
from pml_common.events import ExecutionCompleted, ExecutionStep
from pml_common.local_runtime import REDIS_MAXMEMORY_POLICY, ManagedProcess, start_redis
from pml_common.settings import Settings

STREAM = ExecutionCompleted.STREAM


@pytest.fixture(scope="module")
def small_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    proc = start_redis(tmp_path_factory.mktemp("small-redis"), maxmemory="4mb")
    yield proc
    proc.stop()


@pytest.fixture
async def client(small_redis: ManagedProcess) -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.Redis.from_url(small_redis.url)
    yield redis
    await redis.aclose()


def execution(i: int, padding: int = 0) -> ExecutionCompleted:
    event: ExecutionCompleted = ExecutionCompleted.create(
        tenant_id="memory",
        intent=f"step {i} " + "x" * padding,
        steps=[ExecutionStep(node_id="fs:read", success=True)],
        outcome="success",
    )
    return event


async def test_the_cache_gives_way_and_streams_do_not(
    client: aioredis.Redis, small_redis: ManagedProcess, tmp_path: Path
) -> None:
    config = await client.config_get("maxmemory*")
    assert config["maxmemory-policy"] == REDIS_MAXMEMORY_POLICY
    settings = Settings(redis_url=small_redis.url, qdrant_path=str(tmp_path))
    bus = EventBus(settings, "test", redis=client)
    published = [await bus.publish(execution(i)) for i in range(1000)]
    cache = CachedEmbedder(UseEmbedder(), client, ttl_s=settings.embedding_cache_ttl_s)
    texts = [f"tool number {i}: does thing {i}" for i in range(3000)]  # about 7 MB of vectors
    for start in range(0, len(texts), 500):
        await cache.embed_passages(texts[start : start + 500])

    stats = await client.info("stats")
    assert stats["evicted_keys"] > 0
    cached = [key async for key in client.scan_iter(match="pml:emb:*", count=1000)]
    assert 0 < len(cached) < len(texts)
    rows = await client.xrange(STREAM)
    assert [entry_id.decode() for entry_id, _ in rows] == published  # every entry kept

    # Streams alone past maxmemory: the publish fails; nothing published before goes.
    with pytest.raises(OutOfMemoryError, match="maxmemory"):
        for i in range(20_000):
            published.append(await bus.publish(execution(i, padding=1000)))
    assert await client.xlen(STREAM) == len(published)
    assert [key async for key in client.scan_iter(match="pml:emb:*", count=1000)] == []
