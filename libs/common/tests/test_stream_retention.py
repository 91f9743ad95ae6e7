"""Stream retention on a real Redis: what every group acknowledged goes, what a group still
needs stays, the cap's losses are reported, dead replicas' groups are removed."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
import structlog

from pml_common import redis_keys
from pml_common.settings import Settings
from pml_common.stream_retention import (
    StreamRetention,
    format_id,
    parse_id,
    register_replica_group,
)


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.Redis.from_url(settings.redis_url)
    yield redis
    await redis.aclose()


@pytest.fixture
def stream() -> str:
    return f"test-retention-{uuid.uuid4().hex[:8]}"


def no_retention(settings: Settings) -> Settings:
    return settings.model_copy(update={"stream_retention_s": 0})


async def fill(client: aioredis.Redis, stream: str, count: int) -> list[str]:
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        pipe.xadd(stream, {"data": f'{{"n": {i}}}'})
    return [entry_id.decode() for entry_id in await pipe.execute()]


async def read(client: aioredis.Redis, stream: str, group: str, count: int) -> list[bytes]:
    """Deliver `count` entries to `group` (left pending until acknowledged)."""
    rows = await client.xreadgroup(group, "c1", {stream: ">"}, count=count)
    return [entry_id for entry_id, _ in rows[0][1]]


async def test_acknowledged_entries_go_and_what_a_group_needs_stays(
    client: aioredis.Redis, settings: Settings, stream: str
) -> None:
    ids = await fill(client, stream, 600)
    await client.xgroup_create(stream, "fast", id="0")
    await client.xgroup_create(stream, "slow", id="0")
    await client.xack(stream, "fast", *await read(client, stream, "fast", 600))
    slow = await read(client, stream, "slow", 400)
    await client.xack(stream, "slow", *slow[:300])  # 300..399 pending, 400.. not delivered

    done = await StreamRetention(client, no_retention(settings)).apply(stream)

    assert done.kept_from == parse_id(ids[300])
    assert done.trimmed == 300 and not any(g.lost for g in done.groups)
    rows = await client.xrange(stream)
    assert [entry_id.decode() for entry_id, _ in rows] == ids[300:]
    # The slow group still gets its pending entries and the rest.
    claimed = await client.xautoclaim(stream, "slow", "c2", 0, count=200)
    assert [e for e, _ in claimed[1]] == slow[300:]
    assert len(await read(client, stream, "slow", 600)) == 200


async def test_nothing_younger_than_the_retention_and_nothing_without_groups_goes(
    client: aioredis.Redis, settings: Settings, stream: str
) -> None:
    await fill(client, stream, 50)
    retention = StreamRetention(client, no_retention(settings))
    assert (await retention.apply(stream)).kept_from is None  # no group: its readers are to come
    await client.xgroup_create(stream, "all", id="0")
    await client.xack(stream, "all", *await read(client, stream, "all", 50))
    kept = await StreamRetention(client, settings).apply(stream)  # an hour of retention
    assert kept.trimmed == 0 and await client.xlen(stream) == 50
    assert (await retention.apply(stream)).trimmed == 50


async def test_entries_lagging_groups_lost_to_the_cap_are_reported(
    client: aioredis.Redis, settings: Settings, stream: str
) -> None:
    for group in ("pending", "unread", "caught-up"):
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    await fill(client, stream, 10)
    await read(client, stream, "pending", 5)  # read, never acknowledged
    for _ in range(3):  # the publishers' approximate cap, far too small for these groups
        await client.xadd(stream, {"data": "{}"}, maxlen=1000, approximate=True)
        await fill(client, stream, 1500)
    await client.xadd(stream, {"data": "{}"}, maxlen=1000, approximate=True)
    await client.xack(stream, "caught-up", *await read(client, stream, "caught-up", 5000))

    with structlog.testing.capture_logs() as logs:
        done = await StreamRetention(client, no_retention(settings)).apply(stream)

    assert {g.group: g.lost for g in done.groups} == {
        "pending": True,  # its pending entries are gone
        "unread": True,  # it has more to read than the stream holds
        "caught-up": False,
    }
    reported = {line["group"] for line in logs if line["event"] == "bus.stream_entries_lost"}
    assert reported == {"pending", "unread"}
    assert done.trimmed == 0  # nothing more goes than what the lagging groups still have


async def test_the_group_of_a_replica_gone_long_ago_is_removed_and_no_other(
    client: aioredis.Redis, settings: Settings, stream: str
) -> None:
    ids = await fill(client, stream, 20)
    for group in ("dead-replica", "live-replica", "shared"):
        await client.xgroup_create(stream, group, id="0")
    await register_replica_group(client, stream, "dead-replica")
    await register_replica_group(client, stream, "live-replica")
    await register_replica_group(client, stream, "removed-on-shutdown")
    registry = redis_keys.replica_groups(stream)
    hour_ago = int(time.time() * 1000) - 3_600_000
    for group in ("dead-replica", "live-replica"):  # both created an hour ago…
        await client.hset(registry, group, hour_ago)  # type: ignore[misc]
    for group in ("live-replica", "shared"):  # …and only this replica reads
        await client.xack(stream, group, *await read(client, stream, group, 20))

    done = await StreamRetention(client, no_retention(settings)).apply(stream)

    assert done.removed_groups == ("dead-replica",)
    groups = {row["name"].decode() for row in await client.xinfo_groups(stream)}
    assert groups == {"live-replica", "shared"}
    assert set(await client.hkeys(registry)) == {b"live-replica"}  # type: ignore[misc]
    assert done.kept_from == (parse_id(ids[-1])[0], parse_id(ids[-1])[1] + 1)
    assert format_id(done.kept_from) > ids[-1] and await client.xlen(stream) == 0
