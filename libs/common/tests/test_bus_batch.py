"""EventBus.subscribe_batch against a real Redis: one call per read batch, and a failing event
handled alone (retried, then dead-lettered) while the others of its batch are handled."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import redis.asyncio as aioredis

from pml_common.bus import EventBus
from pml_common.events import ExecutionCompleted, ExecutionStep
from pml_common.settings import Settings


def execution(tenant: str, intent: str) -> ExecutionCompleted:
    event: ExecutionCompleted = ExecutionCompleted.create(
        tenant_id=tenant,
        intent=intent,
        steps=[ExecutionStep(node_id="fs:read", success=True)],
        outcome="success",
    )
    return event


def group_name() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


async def publish_all(
    settings: Settings, redis: aioredis.Redis, group: str, events: list[ExecutionCompleted]
) -> list[str]:
    """The group made at the stream's end, then the events published before any consumer
    runs: one read takes them all, and none of other tests' entries."""
    await redis.xgroup_create(ExecutionCompleted.STREAM, group, id="$", mkstream=True)
    async with EventBus(settings, "test-publisher") as publisher:
        return [await publisher.publish(e) for e in events]


async def eventually(check: Callable[[], bool], within: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def test_a_batch_is_handled_in_one_call_in_stream_order(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    sent = [execution(tenant, f"step {i}") for i in range(5)]
    group = group_name()
    # The same event twice: the handler sees it once (as the per-event path would).
    await publish_all(settings, redis, group, [*sent, sent[2]])
    calls: list[list[str]] = []

    async def handle(events: list[ExecutionCompleted]) -> None:
        mine = [e.intent for e in events if e.tenant_id == tenant]
        if mine:
            calls.append(mine)

    bus = EventBus(settings, "test")
    bus.subscribe_batch(ExecutionCompleted, group, handle, batch_size=64)
    async with bus:
        await eventually(lambda: sum(len(c) for c in calls) >= 5)
        await asyncio.sleep(0.3)  # a repeat would be handled by now
    assert calls == [[e.intent for e in sent]]


async def test_a_poison_event_is_dead_lettered_alone_and_the_others_are_handled(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    settings = settings.model_copy(update={"max_deliveries": 2, "reclaim_idle_ms": 300})
    sent = [execution(tenant, "poison" if i == 3 else f"good {i}") for i in range(6)]
    group = group_name()
    entry_ids = await publish_all(settings, redis, group, sent)
    batches: list[int] = []
    handled: list[str] = []

    async def handle(events: list[ExecutionCompleted]) -> None:
        mine = [e for e in events if e.tenant_id == tenant]
        if not mine:
            return
        batches.append(len(mine))
        if any(e.intent == "poison" for e in mine):
            raise RuntimeError("cannot digest poison")
        handled.extend(e.intent for e in mine)

    bus = EventBus(settings, "test")
    bus.subscribe_batch(ExecutionCompleted, group, handle, batch_size=64)
    async with bus:
        poison_entry = entry_ids[3]
        deadline = asyncio.get_running_loop().time() + 15
        letters = []
        while not letters:
            assert asyncio.get_running_loop().time() < deadline, "poison never dead-lettered"
            await asyncio.sleep(0.1)
            letters = [
                d
                for d in await bus.dead_letters(1000)
                if d.group == group and d.entry_id in entry_ids
            ]
        pending = await redis.xpending(ExecutionCompleted.STREAM, group)
    # Only the poison event was dead-lettered, with its handler's reason; the others were
    # handled once each, although they shared its batch.
    assert [d.entry_id for d in letters] == [poison_entry]
    assert "cannot digest poison" in letters[0].reason
    assert sorted(handled) == sorted(e.intent for e in sent if e.intent != "poison")
    assert batches[0] == 6  # first the whole batch in one call, then one event per call
    assert pending["pending"] == 0
