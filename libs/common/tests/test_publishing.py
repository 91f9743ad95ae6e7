"""publish_all against a real Redis: in order, and to the end once started."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio as aioredis

from pml_common.bus import EVENT_FIELD, EventBus
from pml_common.events import GraphChanged
from pml_common.publishing import publish_all
from pml_common.settings import Settings


async def reasons(redis: aioredis.Redis, entry_ids: list[str]) -> list[str]:
    """The reasons of the GraphChanged events in these stream entries, in order."""
    found = []
    for entry_id in entry_ids:
        [(_, fields)] = await redis.xrange(GraphChanged.STREAM, min=entry_id, max=entry_id)
        found.append(json.loads(fields[EVENT_FIELD.encode()])["reason"])
    return found


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
    assert await reasons(redis, entry_ids) == [f"step {i}" for i in range(20)]
