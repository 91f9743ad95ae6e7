"""What the bus keeps in Redis: dead letters bounded in size and number, streams trimmed of what
their groups acknowledged, replica groups registered for removal (real Redis)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from pml_common import redis_keys
from pml_common.bus import (
    EVENT_FIELD,
    EventBus,
    clip,
    create_replica_group,
    destroy_replica_group,
)
from pml_common.events import ExecutionCompleted, ExecutionStep, Streams
from pml_common.settings import Settings

STREAM = ExecutionCompleted.STREAM


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.Redis.from_url(settings.redis_url)
    yield redis
    await redis.aclose()


def group_name() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


async def handled_all(client: aioredis.Redis, group: str, within: float = 30.0) -> None:
    """Wait until `group` has read and acknowledged every entry of the stream."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        row = next(r for r in await client.xinfo_groups(STREAM) if r["name"].decode() == group)
        if row["pending"] == 0 and row["lag"] == 0:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{group} did not catch up: {row}")
        await asyncio.sleep(0.05)


async def refuse(event: ExecutionCompleted) -> None:
    raise AssertionError(f"no valid event is sent here: {event}")


def test_clip_keeps_short_texts_and_says_how_long_a_cut_one_was() -> None:
    assert clip("short", 10) == "short"
    assert clip("x" * 25, 10) == "x" * 10 + "…[cut: 10 of 25 characters kept]"


async def test_a_huge_dead_letter_keeps_the_start_of_its_payload(
    settings: Settings, client: aioredis.Redis, clean_stores: None
) -> None:
    small = settings.model_copy(update={"dead_letter_payload_chars": 1000})
    event_id = f"e-{uuid.uuid4().hex[:8]}"
    huge = json.dumps({"event_id": event_id, "type": "NoSuchEvent", "junk": "x" * 100_000})
    group = group_name()
    bus = EventBus(small, "test")
    bus.subscribe(ExecutionCompleted, group, refuse)
    async with bus:
        await client.xadd(STREAM, {EVENT_FIELD: huge})
        await handled_all(client, group)
        (letter,) = [d for d in await bus.dead_letters(1000) if d.event_id == event_id]
    assert letter.payload == clip(huge, 1000)
    assert letter.payload.endswith(f"…[cut: 1000 of {len(huge)} characters kept]")


async def test_the_dead_letter_stream_keeps_about_its_maxlen(
    settings: Settings, client: aioredis.Redis, clean_stores: None
) -> None:
    capped = settings.model_copy(update={"dead_letter_maxlen": 100})
    group = group_name()
    bus = EventBus(capped, "test")
    bus.subscribe(ExecutionCompleted, group, refuse)
    async with bus:
        for _ in range(300):
            await client.xadd(STREAM, {EVENT_FIELD: b"{not json"})
        await handled_all(client, group)
    # 300 letters written; the cap is approximate (Redis trims whole stream nodes).
    assert 100 <= await client.xlen(Streams.DEAD_LETTER) < 200


async def test_the_bus_trims_what_every_group_acknowledged(
    settings: Settings, client: aioredis.Redis, clean_stores: None, tenant: str
) -> None:
    seen: list[str] = []

    async def record(event: ExecutionCompleted) -> None:
        seen.append(event.event_id)

    now = settings.model_copy(update={"stream_retention_s": 0})
    group = group_name()
    bus = EventBus(now, "test")
    bus.subscribe(ExecutionCompleted, group, record)
    async with bus:
        for i in range(50):
            await bus.publish(
                ExecutionCompleted.create(
                    tenant_id=tenant,
                    intent=f"step {i}",
                    steps=[ExecutionStep(node_id="fs:read", success=True)],
                    outcome="success",
                )
            )
        await handled_all(client, group)
        await client.xgroup_create(STREAM, "not-started", id="0")  # a consumer yet to come
        (held,) = await bus.trim_streams()
        assert held.trimmed == 0 and await client.xlen(STREAM) == 50
        await client.xgroup_destroy(STREAM, "not-started")
        (done,) = await bus.trim_streams()
    assert len(seen) == 50
    assert done.stream == STREAM and done.trimmed == 50
    assert await client.xlen(STREAM) == 0


async def test_replica_groups_are_registered_until_their_replica_removes_them(
    client: aioredis.Redis,
) -> None:
    group = group_name()
    await create_replica_group(client, group, [ExecutionCompleted])
    registry = redis_keys.replica_groups(STREAM)
    assert await client.hexists(registry, group)  # type: ignore[misc]
    await destroy_replica_group(client, group, [ExecutionCompleted])
    assert not await client.hexists(registry, group)  # type: ignore[misc]
