"""EventBus against a real Redis: delivery, groups, dedupe, dead letters, retries, reclaiming, and
subscribe_batch (one call per read batch; a failing event handled alone)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as aioredis

from pml_common import stores
from pml_common.bus import EVENT_FIELD, DeadLetter, EventBus
from pml_common.events import ExecutionCompleted, ExecutionStep, GraphChanged, Streams
from pml_common.settings import Settings

STREAM = ExecutionCompleted.STREAM


def execution(tenant: str, intent: str = "do it", **fields: object) -> ExecutionCompleted:
    event: ExecutionCompleted = ExecutionCompleted.create(
        tenant_id=tenant,
        intent=intent,
        steps=[ExecutionStep(node_id="fs:read", success=True)],
        outcome="success",
        **fields,
    )
    return event


def group_name() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


async def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    """Wait until `check()` holds; fail the test with a timeout otherwise."""
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def dead_letters_of(
    bus: EventBus, group: str, entry_ids: set[str], within: float = 10.0
) -> list[DeadLetter]:
    """The dead letters of these entries in this group (a new group also sees older entries)."""
    found: list[DeadLetter] = []
    deadline = asyncio.get_running_loop().time() + within
    while len(found) < len(entry_ids):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"expected dead letters of {entry_ids} in {group}, got {found}")
        await asyncio.sleep(0.1)
        found = [
            d for d in await bus.dead_letters(1000) if d.group == group and d.entry_id in entry_ids
        ]
    return found


async def publish_all(
    settings: Settings, redis: aioredis.Redis, group: str, events: list[ExecutionCompleted]
) -> list[str]:
    """The group made at the stream's end, then the events published before any consumer
    runs: one read takes them all, and none of other tests' entries."""
    await redis.xgroup_create(ExecutionCompleted.STREAM, group, id="$", mkstream=True)
    async with EventBus(settings, "test-publisher") as publisher:
        return [await publisher.publish(e) for e in events]


def recorder(
    tenant: str,
) -> tuple[list[ExecutionCompleted], Callable[[ExecutionCompleted], Awaitable[None]]]:
    """A handler keeping the events of this test's tenant (streams are shared between tests)."""
    seen: list[ExecutionCompleted] = []

    async def handle(event: ExecutionCompleted) -> None:
        if event.tenant_id == tenant:
            seen.append(event)

    return seen, handle


async def test_publish_then_consume(settings: Settings, tenant: str) -> None:
    seen, handle = recorder(tenant)
    bus = EventBus(settings, "test")
    bus.subscribe(ExecutionCompleted, group_name(), handle)
    async with bus:
        sent = execution(tenant, intent="read a file")
        entry_id = await bus.publish(sent)
        assert "-" in entry_id
        await eventually(lambda: len(seen) == 1)
    got = seen[0]
    assert got.event_id == sent.event_id
    assert got.intent == "read a file"
    assert got.steps == sent.steps


async def test_entry_holds_event_json_and_is_capped(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    async with EventBus(settings, "test") as bus:
        sent = execution(tenant)
        entry_id = await bus.publish(sent)
    rows = await redis.xrange(STREAM, min=entry_id, max=entry_id)
    body = json.loads(rows[0][1][EVENT_FIELD.encode()])
    assert body["event_id"] == sent.event_id
    assert body["type"] == "ExecutionCompleted"


async def test_one_group_shares_events_two_groups_each_get_all(
    settings: Settings, tenant: str
) -> None:
    shared = group_name()
    other = group_name()
    got_a: list[str] = []
    got_b: list[str] = []
    got_other: list[str] = []

    def slow_recorder(into: list[str]) -> Callable[[ExecutionCompleted], Awaitable[None]]:
        async def handle(event: ExecutionCompleted) -> None:
            if event.tenant_id == tenant:
                # A slow handler keeps one consumer busy, so the other one gets entries too.
                await asyncio.sleep(0.02)
                into.append(event.event_id)

        return handle

    bus_a = EventBus(settings.model_copy(update={"consumer_name": "a-" + tenant}), "a")
    bus_b = EventBus(settings.model_copy(update={"consumer_name": "b-" + tenant}), "b")
    bus_o = EventBus(settings, "other")
    bus_a.subscribe(ExecutionCompleted, shared, slow_recorder(got_a))
    bus_b.subscribe(ExecutionCompleted, shared, slow_recorder(got_b))
    bus_o.subscribe(ExecutionCompleted, other, slow_recorder(got_other))
    async with bus_a, bus_b, bus_o:
        sent = [execution(tenant, intent=f"run {i}") for i in range(30)]
        for event in sent:
            await bus_a.publish(event)
            await asyncio.sleep(0.005)
        ids = {e.event_id for e in sent}
        await eventually(lambda: len(got_a) + len(got_b) == 30 and len(got_other) == 30)
        await asyncio.sleep(0.3)  # nothing more arrives
    assert set(got_a).isdisjoint(got_b)
    assert set(got_a) | set(got_b) == ids
    assert len(got_a) + len(got_b) == 30
    assert got_a and got_b, "both consumers of the shared group should have handled events"
    assert sorted(got_other) == sorted(ids)


async def test_same_event_id_is_handled_once_per_group(settings: Settings, tenant: str) -> None:
    seen, handle = recorder(tenant)
    group = group_name()
    bus = EventBus(settings, "test")
    bus.subscribe(ExecutionCompleted, group, handle)
    async with bus:
        event = execution(tenant)
        await bus.publish(event)
        await bus.publish(event)  # a redelivery: same event id, new entry
        marker = execution(tenant, intent="marker")
        await bus.publish(marker)
        await eventually(lambda: any(e.intent == "marker" for e in seen))
        await bus.publish(event)
        marker2 = execution(tenant, intent="marker2")
        await bus.publish(marker2)
        await eventually(lambda: any(e.intent == "marker2" for e in seen))
    assert [e.event_id for e in seen] == [event.event_id, marker.event_id, marker2.event_id]


async def test_without_dedupe_every_delivery_is_handled(settings: Settings, tenant: str) -> None:
    seen, handle = recorder(tenant)
    bus = EventBus(settings, "test")
    bus.subscribe(ExecutionCompleted, group_name(), handle, dedupe=False)
    async with bus:
        event = execution(tenant)
        await bus.publish(event)
        await bus.publish(event)
        await eventually(lambda: len(seen) == 2)


async def test_rejected_payloads_are_dead_lettered_and_consuming_goes_on(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    seen, handle = recorder(tenant)
    group = group_name()
    good = execution(tenant)
    valid = json.loads(execution(tenant).to_json())
    bad_payloads = {
        "not json": b"{this is not json",
        "not utf-8": b"\xff\xfe\x00",
        "unknown type": json.dumps({**valid, "type": "NoSuchEvent"}).encode(),
        "unknown version": json.dumps({**valid, "version": 99}).encode(),
        "invalid fields": json.dumps({**valid, "steps": []}).encode(),
        "wrong stream": json.dumps(
            {**valid, "type": "GraphChanged", "reason": "x", "steps": None}
        ).encode(),
    }
    bus = EventBus(settings, "test")
    bus.subscribe(ExecutionCompleted, group, handle)
    async with bus:
        entry_ids = [
            (await redis.xadd(STREAM, {EVENT_FIELD: payload})).decode()
            for payload in bad_payloads.values()
        ]
        entry_ids.append((await redis.xadd(STREAM, {"something": "else"})).decode())
        await bus.publish(good)
        await eventually(lambda: [e.event_id for e in seen] == [good.event_id])
        letters = await dead_letters_of(bus, group, set(entry_ids))
        pending = await redis.xpending(STREAM, group)
    assert [d.entry_id for d in letters] == entry_ids
    reasons = [d.reason for d in letters]
    assert "payload is not JSON" in reasons[0]
    assert "payload is not JSON" in reasons[1]
    assert "unknown event type 'NoSuchEvent'" in reasons[2]
    assert "unsupported version 99 of ExecutionCompleted" in reasons[3]
    assert "invalid ExecutionCompleted v1" in reasons[4] and "steps" in reasons[4]
    assert "does not belong on" in reasons[5] or "invalid GraphChanged" in reasons[5]
    assert "no `data` field" in reasons[6]
    assert all(d.stream == STREAM for d in letters)
    assert letters[2].event_id == valid["event_id"]
    assert letters[0].payload == "{this is not json"
    assert pending["pending"] == 0, "dead-lettered entries must be acknowledged"


async def test_failing_handler_is_retried_then_dead_lettered(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    settings = settings.model_copy(update={"max_deliveries": 3, "reclaim_idle_ms": 300})
    group = group_name()
    attempts: list[str] = []
    handled: list[str] = []

    async def handle(event: ExecutionCompleted) -> None:
        if event.tenant_id != tenant:
            return
        if event.intent == "poison":
            attempts.append(event.event_id)
            raise RuntimeError(f"boom #{len(attempts)}")
        handled.append(event.event_id)

    bus = EventBus(settings, "test")
    bus.subscribe(ExecutionCompleted, group, handle)
    async with bus:
        poison = execution(tenant, intent="poison")
        poison_entry = await bus.publish(poison)
        fine = execution(tenant, intent="fine")
        await bus.publish(fine)
        await eventually(lambda: handled == [fine.event_id])
        letters = await dead_letters_of(bus, group, {poison_entry}, within=15)
        await asyncio.sleep(1.0)  # no further attempt after dead-lettering
        pending = await redis.xpending(STREAM, group)
    assert attempts == [poison.event_id] * 3
    assert letters[0].event_id == poison.event_id
    assert "RuntimeError: boom #3" in letters[0].reason
    assert "3 times" in letters[0].reason
    assert pending["pending"] == 0


async def test_handler_recovering_on_retry_is_handled_once(settings: Settings, tenant: str) -> None:
    settings = settings.model_copy(update={"reclaim_idle_ms": 300})
    calls: list[str] = []
    done: list[str] = []

    async def handle(event: ExecutionCompleted) -> None:
        if event.tenant_id != tenant:
            return
        calls.append(event.event_id)
        if len(calls) == 1:
            raise ConnectionError("transient")
        done.append(event.event_id)

    bus = EventBus(settings, "test")
    group = group_name()
    bus.subscribe(ExecutionCompleted, group, handle)
    async with bus:
        event = execution(tenant)
        await bus.publish(event)
        await eventually(lambda: done == [event.event_id])
        await asyncio.sleep(1.0)
        letters = await bus.dead_letters(1000)
    assert calls == [event.event_id, event.event_id]
    assert done == [event.event_id]
    assert not [d for d in letters if d.event_id == event.event_id]


async def test_entries_of_a_dead_consumer_are_reclaimed_once(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    group = group_name()
    await redis.xgroup_create(STREAM, group, id="$", mkstream=True)
    async with EventBus(settings, "publisher") as publisher:
        sent = [execution(tenant, intent=f"lost {i}") for i in range(5)]
        for event in sent:
            await publisher.publish(event)
    # A consumer reads the entries and dies before acknowledging them.
    read = await redis.xreadgroup(group, "dead-consumer", {STREAM: ">"}, count=100)
    assert len(read[0][1]) == 5
    counts: dict[str, int] = {}

    async def handle(event: ExecutionCompleted) -> None:
        if event.tenant_id == tenant:
            counts[event.event_id] = counts.get(event.event_id, 0) + 1

    bus = EventBus(settings, "live")
    bus.subscribe(ExecutionCompleted, group, handle)
    async with bus:
        await eventually(lambda: len(counts) == 5, within=15)
        await asyncio.sleep(settings.reclaim_idle_ms / 1000 * 2)
        pending = await redis.xpending(STREAM, group)
    assert counts == {e.event_id: 1 for e in sent}
    assert pending["pending"] == 0


async def test_bus_recovers_after_redis_is_flushed(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    seen, handle = recorder(tenant)
    bus = EventBus(settings, "test")
    bus.subscribe(ExecutionCompleted, group_name(), handle)
    async with bus:
        first = execution(tenant, intent="before")
        await bus.publish(first)
        await eventually(lambda: len(seen) == 1)
        await redis.flushall()
        await asyncio.sleep(1.0)
        after = execution(tenant, intent="after")
        await bus.publish(after)
        await eventually(lambda: [e.intent for e in seen] == ["before", "after"], within=15)
        again = execution(tenant, intent="again")
        await bus.publish(again)
        await eventually(lambda: len(seen) == 3)


async def test_subscribe_after_start_is_refused(settings: Settings, tenant: str) -> None:
    _, handle = recorder(tenant)
    bus = EventBus(settings, "test")
    bus.subscribe(GraphChanged, group_name(), lambda e: asyncio.sleep(0))
    async with bus:
        with pytest.raises(RuntimeError):
            bus.subscribe(ExecutionCompleted, group_name(), handle)
    assert Streams.DEAD_LETTER.startswith("pml:")


async def test_entry_that_keeps_killing_consumers_is_dead_lettered(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    """An entry delivered more than max_deliveries times with no verdict (every consumer that
    took it died) is dead-lettered when reclaimed instead of being handed to the handler."""
    settings = settings.model_copy(update={"max_deliveries": 2, "reclaim_idle_ms": 200})
    group = group_name()
    await redis.xgroup_create(STREAM, group, id="$", mkstream=True)
    async with EventBus(settings, "publisher") as publisher:
        poison = execution(tenant, intent="kills consumers")
        entry_id = await publisher.publish(poison)
    await redis.xreadgroup(group, "dead-1", {STREAM: ">"}, count=100)
    await redis.xclaim(STREAM, group, "dead-2", 0, [entry_id])  # second delivery
    handled: list[str] = []

    async def handle(event: ExecutionCompleted) -> None:
        if event.tenant_id == tenant:
            handled.append(event.event_id)

    bus = EventBus(settings, "live")
    bus.subscribe(ExecutionCompleted, group, handle)
    async with bus:
        letters = await dead_letters_of(bus, group, {entry_id})
        pending = await redis.xpending(STREAM, group)
    assert handled == []
    assert letters[0].event_id == poison.event_id
    assert "delivered 3 times without being handled" in letters[0].reason
    assert pending["pending"] == 0


async def test_bus_logs_in_with_the_configured_redis_user(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    user, password = f"pml-{tenant}", uuid.uuid4().hex
    await redis.acl_setuser(
        user,
        enabled=True,
        passwords=[f"+{password}"],
        keys=["*"],
        channels=["*"],
        commands=["+@all"],
    )
    try:
        seen, handle = recorder(tenant)
        login = Settings(
            **{**settings.model_dump(), "redis_username": user, "redis_password": password}
        )
        bus = EventBus(login, "test")
        bus.subscribe(ExecutionCompleted, group_name(), handle)
        async with bus:
            await bus.publish(execution(tenant))
            await eventually(lambda: len(seen) == 1)
            clients = await redis.client_list()
            # The bus's own client and its broker's connections both logged in as the user.
            assert sum(1 for c in clients if c.get("user") == user) >= 2
        wrong = Settings(
            **{**settings.model_dump(), "redis_username": user, "redis_password": "nope"}
        )
        with pytest.raises(aioredis.AuthenticationError):
            async with EventBus(wrong, "test") as refused:
                await refused.publish(execution(tenant))
    finally:
        await redis.acl_deluser(user)


async def test_duplicates_within_one_batch_are_handled_once_in_stream_order(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    seen, handle = recorder(tenant)
    group = group_name()
    await redis.xgroup_create(STREAM, group, id="$", mkstream=True)
    first, second = execution(tenant, intent="first"), execution(tenant, intent="second")
    async with EventBus(settings, "publisher") as publisher:
        # Published before the consumer starts, so that one read returns them all.
        for event in (first, first, second, first, second):
            await publisher.publish(event)
    bus = EventBus(settings, "test")
    bus.subscribe(ExecutionCompleted, group, handle)
    async with bus:
        await eventually(lambda: len(seen) >= 2)
        await asyncio.sleep(0.3)  # nothing more arrives
        pending = await redis.xpending(STREAM, group)
    assert [e.intent for e in seen] == ["first", "second"]
    assert pending["pending"] == 0


async def test_a_slow_batch_acknowledges_each_entry_once_handled(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    """Entries of a batch that takes long are acknowledged one by one, not at its end: they are
    idle for the reclaimers of other consumers meanwhile."""
    settings = settings.model_copy(update={"reclaim_idle_ms": 200})
    group = group_name()
    await redis.xgroup_create(STREAM, group, id="$", mkstream=True)
    async with EventBus(settings, "publisher") as publisher:
        for i in range(6):
            await publisher.publish(execution(tenant, intent=f"slow {i}"))
    pending_seen: list[int] = []

    async def handle(event: ExecutionCompleted) -> None:
        if event.tenant_id == tenant:
            pending_seen.append(int((await redis.xpending(STREAM, group))["pending"]))
            await asyncio.sleep(0.1)

    bus = EventBus(settings, "test")
    bus.subscribe(ExecutionCompleted, group, handle)
    async with bus:
        await eventually(lambda: len(pending_seen) == 6)
        await asyncio.sleep(0.3)
        pending = await redis.xpending(STREAM, group)
    # The first handler starts before anything is written; from the second on, every entry
    # handled before is acknowledged already.
    assert pending_seen == [6, 5, 4, 3, 2, 1]
    assert pending["pending"] == 0


async def test_a_slow_live_consumer_keeps_its_batch_from_other_reclaimers(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    """Entries waiting behind a slow handler stay with their live consumer (its heartbeat keeps
    them from looking idle): another consumer of the group neither handles nor dead-letters
    them, however long the batch takes."""
    settings = settings.model_copy(update={"reclaim_idle_ms": 300, "max_deliveries": 2})
    group = group_name()
    await redis.xgroup_create(STREAM, group, id="$", mkstream=True)
    calls: list[tuple[str, str]] = []

    def handler(name: str, pause_s: float) -> Callable[[ExecutionCompleted], Awaitable[None]]:
        async def handle(event: ExecutionCompleted) -> None:
            if event.tenant_id == tenant:
                calls.append((name, event.intent))
                await asyncio.sleep(pause_s)

        return handle

    slow = EventBus(settings.model_copy(update={"consumer_name": f"slow-{tenant}"}), "slow")
    slow.subscribe(ExecutionCompleted, group, handler("slow", 1.2))
    other = EventBus(settings.model_copy(update={"consumer_name": f"other-{tenant}"}), "other")
    other.subscribe(ExecutionCompleted, group, handler("other", 0))
    async with EventBus(settings, "publisher") as publisher:
        entry_ids = {await publisher.publish(execution(tenant, intent=i)) for i in ("1", "2", "3")}
    async with slow:
        await eventually(lambda: len(calls) == 1)  # all three read in one batch
        async with other:
            await eventually(lambda: len(calls) == 3, within=15)
            await asyncio.sleep(1.5)  # the last handler ends; nothing was taken over
            letters = [d for d in await slow.dead_letters(1000) if d.entry_id in entry_ids]
            pending = await redis.xpending(STREAM, group)
    assert calls == [("slow", "1"), ("slow", "2"), ("slow", "3")]
    assert letters == []
    assert pending["pending"] == 0


# --- poison pills and hostile entries (issue: hardening) -------------------------------------


async def test_deeply_nested_entry_is_dead_lettered_without_holding_back_its_batch(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    """JSON nested 5,000 levels made the decoder raise RecursionError, which escaped the bus:
    the entry was redelivered forever and the valid events of its batch were held back."""
    seen, handle = recorder(tenant)
    group = group_name()
    valid = json.loads(execution(tenant).to_json())
    nested = "[" * 5000 + "]" * 5000
    poison = json.dumps({**valid, "steps": "STEPS"}).replace('"STEPS"', nested).encode()
    before, after = execution(tenant, intent="before"), execution(tenant, intent="after")
    # The poison entry between two valid ones, all in the stream before the group reads them,
    # so that they come in one batch.
    await redis.xgroup_create(STREAM, group, id="$", mkstream=True)
    async with EventBus(settings, "publisher") as publisher:
        await publisher.publish(before)
        poison_entry = (await redis.xadd(STREAM, {EVENT_FIELD: poison})).decode()
        await publisher.publish(after)
    bus = EventBus(settings.model_copy(update={"reclaim_idle_ms": 300}), "test")
    bus.subscribe(ExecutionCompleted, group, handle)
    async with bus:
        await eventually(lambda: len(seen) == 2)
        letters = await dead_letters_of(bus, group, {poison_entry})
        pending = await redis.xpending(STREAM, group)
    assert [e.intent for e in seen] == ["before", "after"]
    assert "nested too deeply" in letters[0].reason
    assert letters[0].event_id == valid["event_id"]
    assert pending["pending"] == 0


async def test_any_decoding_failure_dead_letters_the_entry_with_its_reason(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    """Whatever the exception (here, injected: decoding itself raises), the entry is
    dead-lettered with it instead of failing its batch on every redelivery."""
    settings = settings.model_copy(update={"max_deliveries": 2, "reclaim_idle_ms": 300})
    group = group_name()
    await redis.xgroup_create(STREAM, group, id="$", mkstream=True)
    bus = EventBus(settings, "test")
    bus.subscribe(ExecutionCompleted, group, recorder(tenant)[1])

    def broken(*_: object) -> None:
        raise RuntimeError("a decoding bug")

    bus._decode = broken  # type: ignore[method-assign,assignment]
    async with bus:
        entry = await bus.publish(execution(tenant))
        letters = await dead_letters_of(bus, group, {entry}, within=15)
        pending = await redis.xpending_range(STREAM, group, min=entry, max=entry, count=1)
    assert "RuntimeError: a decoding bug" in letters[0].reason
    assert pending == []


async def test_a_batch_that_always_fails_is_dead_lettered_at_the_delivery_limit(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    """Whatever fails for a whole batch before its handlers (here, injected: the dedupe lookup),
    the reclaimer stops redelivering an entry once it reached the delivery limit."""
    settings = settings.model_copy(update={"max_deliveries": 2, "reclaim_idle_ms": 300})
    group = group_name()
    await redis.xgroup_create(STREAM, group, id="$", mkstream=True)
    bus = EventBus(settings, "test")
    bus.subscribe(ExecutionCompleted, group, recorder(tenant)[1])

    async def broken(*_: object) -> set[tuple[str, str]]:
        raise RuntimeError("dedupe marks unreadable")

    bus._already_handled = broken  # type: ignore[method-assign]
    async with bus:
        entry = await bus.publish(execution(tenant))
        letters = await dead_letters_of(bus, group, {entry}, within=15)
        pending = await redis.xpending_range(STREAM, group, min=entry, max=entry, count=1)
    assert "delivered 3 times without being handled" in letters[0].reason
    assert pending == []


async def test_the_same_event_id_of_two_tenants_is_handled_for_both(
    settings: Settings, tenant: str
) -> None:
    """Dedupe marks are per tenant: another tenant's event with the same id is not a repeat."""
    other = tenant + "-other"
    seen: list[tuple[str, str]] = []

    async def handle(event: ExecutionCompleted) -> None:
        if event.tenant_id in (tenant, other):
            seen.append((event.tenant_id, event.event_id))

    bus = EventBus(settings, "test")
    bus.subscribe(ExecutionCompleted, group_name(), handle)
    shared_id = uuid.uuid4().hex
    async with bus:
        await bus.publish(execution(tenant, event_id=shared_id))
        await eventually(lambda: len(seen) == 1)
        await bus.publish(execution(other, event_id=shared_id))
        await bus.publish(execution(tenant, event_id=shared_id))  # a true repeat: skipped
        marker = execution(tenant, intent="marker")
        await bus.publish(marker)
        await eventually(lambda: (tenant, marker.event_id) in seen)
    assert seen == [(tenant, shared_id), (other, shared_id), (tenant, marker.event_id)]


async def test_an_event_without_event_id_is_dead_lettered(
    settings: Settings, tenant: str, redis: aioredis.Redis
) -> None:
    """An id made up at each parse would make every redelivery count as a new event."""
    seen, handle = recorder(tenant)
    group = group_name()
    no_id = json.loads(execution(tenant).to_json())
    del no_id["event_id"]
    bus = EventBus(settings, "test")
    bus.subscribe(ExecutionCompleted, group, handle)
    async with bus:
        entry = (await redis.xadd(STREAM, {EVENT_FIELD: json.dumps(no_id)})).decode()
        marker = execution(tenant, intent="marker")
        await bus.publish(marker)
        await eventually(lambda: [e.event_id for e in seen] == [marker.event_id])
        letters = await dead_letters_of(bus, group, {entry})
    assert "event_id" in letters[0].reason and "required" in letters[0].reason.lower()


async def test_the_bus_talks_to_redis_with_the_stores_retry_policy(settings: Settings) -> None:
    # The library's default client backs off up to 10 s per retry: after a Redis restart,
    # batches and publications on its stale connections were held for seconds.
    reference = stores.redis_client(settings)
    bus = EventBus(settings, "policy")
    try:
        assert bus._redis.get_retry() == reference.get_retry()
        kwargs = bus._redis.connection_pool.connection_kwargs
        assert kwargs["socket_connect_timeout"] == stores.REDIS_CONNECT_TIMEOUT_S
        assert kwargs["health_check_interval"] == stores.REDIS_HEALTH_CHECK_INTERVAL_S
    finally:
        await bus.stop()
        await reference.aclose()


# --- subscribe_batch: one call per read batch, a failing event handled alone ---------------


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
        await eventually(lambda: sum(len(c) for c in calls) >= 5, within=15)
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
        letters = await dead_letters_of(bus, group, {entry_ids[3]}, within=15)
        pending = await redis.xpending(ExecutionCompleted.STREAM, group)
    # Only the poison event was dead-lettered, with its handler's reason; the others were
    # handled once each, although they shared its batch.
    assert [d.entry_id for d in letters] == [entry_ids[3]]
    assert "cannot digest poison" in letters[0].reason
    assert sorted(handled) == sorted(e.intent for e in sent if e.intent != "poison")
    assert batches[0] == 6  # first the whole batch in one call, then one event per call
    assert pending["pending"] == 0
