"""publish_all against a real Redis: in order, and to the end once started."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio as aioredis

from pml_common.bus import EVENT_FIELD, EventBus
from pml_common.events import GraphChanged
from pml_common.publishing import publish_all
from pml_common.settings import Settings


async def published(redis: aioredis.Redis, tenant: str) -> list[str]:
    """The reasons of the tenant's GraphChanged events, in stream order."""
    rows = await redis.xrange(GraphChanged.STREAM)
    events = [json.loads(fields[EVENT_FIELD.encode()]) for _, fields in rows]
    return [e["reason"] for e in events if e["tenant_id"] == tenant]


async def test_publishing_goes_to_the_end_when_the_caller_is_cancelled(
    settings: Settings, redis: aioredis.Redis, tenant: str
) -> None:
    bus = EventBus(settings, "publishing-test", redis=redis)
    events = [
        GraphChanged.create(tenant_id=tenant, reason=f"step {i}", node_ids=[]) for i in range(20)
    ]
    caller = asyncio.create_task(publish_all(bus, events))
    await asyncio.sleep(0)  # publishing has started
    caller.cancel()
    entry_ids = await caller
    assert len(entry_ids) == len(events)
    assert await published(redis, tenant) == [f"step {i}" for i in range(20)]
