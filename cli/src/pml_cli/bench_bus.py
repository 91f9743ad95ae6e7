"""`pml bench bus`: events/s through a Redis consumer group, the project's bus against raw redis-py.

Both runs use a private Redis started for the bench, the same `ExecutionCompleted` payloads and
the same shape of work: one publisher appending one entry per call while one consumer reads the
stream in a consumer group (batches of 16, as the bus reads) and acknowledges each entry.

- `events_per_s`: `EventBus.publish` → FastStream subscriber → the bus's idempotent handling
  (event parsed and validated, consumer span parented from the event's trace context, dedupe check,
  handler, dedupe mark, XACK), as every service consumes. One event in a hundred is published a
  second time with the same event id, as an at-least-once producer may; the bus must skip it.
- `raw_events_per_s`: redis-py alone, in the same run: XADD of the same JSON, XREADGROUP, XACK,
  no parsing and no dedupe.

Both rates count stream entries (duplicates included) from the first publish to the last
acknowledgement. `handled_more_than_once` and `not_handled` count distinct event ids whose
handler ran more than once or never: both are 0 when the bus handled every event exactly once.

`bus_cpu_s` and `raw_cpu_s` are the CPU seconds this process spent in each run (publisher and
consumer share it), and `cpu_ratio` is `raw_cpu_s / bus_cpu_s`: the framework's cost per entry
as CPU, which other processes competing for the machine's cores stretch far less than elapsed
time. On a busy machine the two runs of one command can meet very different loads, so `ratio`
swings from run to run while `cpu_ratio` stays put.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, cast

import redis.asyncio as aioredis
from rich.console import Console

from pml_cli.phases import Bar, counted_phase, phase
from pml_common.bus import EVENT_FIELD, EventBus
from pml_common.events import ExecutionCompleted, ExecutionStep
from pml_common.local_runtime import start_redis
from pml_common.settings import Settings
from pml_common.telemetry import setup_telemetry

GROUP = "bench"
#: One event in this many is published again with the same event id.
DUPLICATE_EVERY = 100
#: How far back the duplicated event lies, so that it is normally handled already.
DUPLICATE_LAG = 50
#: Entries per XREADGROUP of the raw consumer: the bus's batch size.
RAW_BATCH = 16
POLL_S = 0.05
#: A run whose group acknowledges nothing for this long has failed.
STALL_S = 60.0


def bench_bus(events: int, console: Console) -> dict[str, Any]:
    if events < 1:
        raise ValueError("--events must be at least 1")
    with phase(console, f"preparing {events} execution events"):
        sent = _executions(events)
        order = _publication_order(events)
    with tempfile.TemporaryDirectory(prefix="pml-bench-bus-") as tmp:
        with phase(console, "starting a private Redis"):
            redis_server = start_redis(Path(tmp) / "redis")
        try:
            settings = Settings(redis_url=redis_server.url, consumer_name="bench-bus")
            # Spans are made as in the services (sampled, no exporter configured).
            setup_telemetry("pml-bench-bus", settings)
            raw_s, raw_cpu_s = asyncio.run(_raw_run(settings, sent, order, console))
            bus_s, bus_cpu_s, handled = asyncio.run(_bus_run(settings, sent, order, console))
        finally:
            with phase(console, "stopping Redis"):
                redis_server.stop()
    entries = len(order)
    events_per_s = entries / bus_s
    raw_events_per_s = entries / raw_s
    return {
        "events": events,
        "entries": entries,
        "duplicate_entries": entries - events,
        "events_per_s": round(events_per_s),
        "raw_events_per_s": round(raw_events_per_s),
        "ratio": round(events_per_s / raw_events_per_s, 3),
        "bus_s": round(bus_s, 2),
        "raw_s": round(raw_s, 2),
        "bus_cpu_s": round(bus_cpu_s, 2),
        "raw_cpu_s": round(raw_cpu_s, 2),
        "cpu_ratio": round(raw_cpu_s / bus_cpu_s, 3),
        "handled": sum(handled.values()),
        "handled_more_than_once": sum(1 for n in handled.values() if n > 1),
        "not_handled": sum(1 for e in sent if e.event_id not in handled),
    }


def _executions(count: int) -> list[ExecutionCompleted]:
    """Typical execution traces: three steps, the last depending on the first."""
    return [
        ExecutionCompleted.create(
            tenant_id="bench",
            intent=f"summarise report {i} and mail it",
            steps=[
                ExecutionStep(node_id="fs:read", success=True, duration_ms=12.0),
                ExecutionStep(node_id="llm:summarise", success=True, duration_ms=840.0),
                ExecutionStep(
                    node_id="mail:send", success=True, duration_ms=95.0, depends_on=["fs:read"]
                ),
            ],
            outcome="success",
        )
        for i in range(count)
    ]


def _publication_order(events: int) -> list[int]:
    """Indices of the events in publication order, with the periodic duplicates inserted."""
    order = []
    for i in range(events):
        order.append(i)
        if i % DUPLICATE_EVERY == DUPLICATE_EVERY - 1:
            order.append(max(0, i - DUPLICATE_LAG))
    return order


async def _raw_run(
    settings: Settings, sent: list[ExecutionCompleted], order: list[int], console: Console
) -> tuple[float, float]:
    stream = sent[0].STREAM
    payloads = [e.to_json() for e in sent]
    redis = aioredis.Redis.from_url(settings.redis_url)
    try:
        await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)

        async def publish() -> None:
            for i in order:
                await redis.xadd(
                    stream,
                    {EVENT_FIELD: payloads[i]},
                    maxlen=settings.stream_maxlen,
                    approximate=True,
                )

        async def consume(stop: asyncio.Event) -> None:
            while not stop.is_set():
                read = await redis.xreadgroup(
                    GROUP, "raw", {stream: ">"}, count=RAW_BATCH, block=100
                )
                batches = cast(list[tuple[bytes, list[tuple[bytes, object]]]], read)  # RESP2
                for _, entries in batches:
                    for entry_id, _fields in entries:
                        await redis.xack(stream, GROUP, entry_id)

        return await _timed_run(
            redis, stream, len(order), publish, consume, "raw redis-py", console
        )
    finally:
        await redis.delete(stream)
        await redis.aclose()


async def _bus_run(
    settings: Settings, sent: list[ExecutionCompleted], order: list[int], console: Console
) -> tuple[float, float, Counter[str]]:
    stream = sent[0].STREAM
    handled: Counter[str] = Counter()

    async def handle(event: ExecutionCompleted) -> None:
        handled[event.event_id] += 1

    bus = EventBus(settings, "bench")
    bus.subscribe(ExecutionCompleted, GROUP, handle)
    redis = aioredis.Redis.from_url(settings.redis_url)
    try:
        async with bus:

            async def publish() -> None:
                for i in order:
                    await bus.publish(sent[i])

            async def consume(stop: asyncio.Event) -> None:
                await stop.wait()  # the bus's own subscribers consume

            seconds, cpu_seconds = await _timed_run(
                redis, stream, len(order), publish, consume, "pml bus (FastStream)", console
            )
    finally:
        await redis.aclose()
    return seconds, cpu_seconds, handled


async def _timed_run(
    redis: aioredis.Redis,
    stream: str,
    entries: int,
    publish: Callable[[], Coroutine[Any, Any, None]],
    consume: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
    label: str,
    console: Console,
) -> tuple[float, float]:
    """Seconds, and CPU seconds of this process, from the first publish until the group has
    read and acknowledged every entry."""
    stop = asyncio.Event()
    with counted_phase(
        console, f"{label}: publishing and consuming {entries} entries", entries
    ) as bar:
        started = time.perf_counter()
        cpu_started = time.process_time()
        consumer = asyncio.create_task(consume(stop))
        publisher = asyncio.create_task(publish())
        try:
            await _until_acknowledged(redis, stream, entries, publisher, bar)
            elapsed = time.perf_counter() - started
            cpu_elapsed = time.process_time() - cpu_started
            await publisher
        finally:
            stop.set()
            await consumer
    return elapsed, cpu_elapsed


async def _until_acknowledged(
    redis: aioredis.Redis,
    stream: str,
    entries: int,
    publisher: asyncio.Task[None],
    bar: Bar,
) -> None:
    """Wait for the group to catch up; fail instead of hanging when it stops making progress."""
    last, last_change = -1, time.monotonic()
    while True:
        if publisher.done() and publisher.exception() is not None:
            await publisher  # re-raises the publisher's error
        acknowledged = await _acknowledged(redis, stream)
        bar.reach(acknowledged)
        if acknowledged >= entries:
            return
        if acknowledged != last:
            last, last_change = acknowledged, time.monotonic()
        elif time.monotonic() - last_change > STALL_S:
            raise RuntimeError(f"the consumer group stalled at {acknowledged} of {entries} entries")
        await asyncio.sleep(POLL_S)


async def _acknowledged(redis: aioredis.Redis, stream: str) -> int:
    """Entries the bench group has read and acknowledged (Redis 7: `entries-read` - `pending`)."""
    groups = await redis.xinfo_groups(stream)
    for group in groups:
        if group["name"] in (GROUP, GROUP.encode()):
            return int(group["entries-read"] or 0) - int(group["pending"])
    return 0
