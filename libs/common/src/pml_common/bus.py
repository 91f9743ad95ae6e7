"""The event bus: Redis Streams with consumer groups, on FastStream.

Contract (docs/architecture.md, "Events"): one stream per event type; each entry holds the event
JSON in its `data` field, with the publisher's trace context in `event.trace`. A subscription
consumes its stream in a consumer group, at least once:

- the handler runs in a CONSUMER span whose parent is the publisher's span;
- an event id already handled by the group for the same tenant is skipped (marked only after
  the handler succeeds; ids are unique per tenant, so two tenants' events never collide);
- a payload that can never be handled (`EventRejected`, or any other failure to decode it)
  goes to the dead-letter stream with its reason, acked, and the rest of its batch goes on;
- a handler that raises leaves the entry pending; the reclaimer (XAUTOCLAIM after
  `reclaim_idle_ms`) redelivers it, also when the consumer that read it died; at
  `max_deliveries` it is dead-lettered with the exception text and acked (checked before the
  entry is decoded, so the limit holds even for a batch that fails as a whole);
- a group that vanished (Redis flushed or restarted empty) is recreated and consuming resumes;
- every minute, the streams it consumes are trimmed of what every group has acknowledged, once
  older than `stream_retention_s` (`pml_common.stream_retention`: never an entry a group still
  needs; `stream_maxlen` on XADD is only the backstop, and its losses are logged);
- a dead letter keeps at most `dead_letter_payload_chars` of the payload and of the reason, and
  the dead-letter stream at most about `dead_letter_maxlen` letters, so one huge or repeated
  poison event cannot fill Redis.

Entries are read and handled in batches of up to `_BATCH`, in stream order: one MGET asks which
events the group has handled already, the handlers run one after the other (one span each), and
one MULTI/EXEC then writes the batch's dedupe marks, dead letters and acknowledgements together,
so an entry is never acknowledged without its mark nor marked without its acknowledgement. A
consumer that dies mid-batch leaves the whole batch pending for the reclaimers; events it had
handled are handled again (at least once), which is why handlers whose effect is stored also
record the event id with it. While a batch runs, its consumer keeps its entries from looking idle
(`_Heartbeat`), so the reclaimers of other consumers only take the entries of a dead consumer,
not those of a slow one.

A subscription made with `subscribe_batch` instead hands its handler the batch's events not
handled yet in one call (one span linked to every publisher's), and marks and acknowledges them
together when it returns; when it raises, the same events go through the per-event path above,
one call each, so an event that fails is retried and dead-lettered alone.

FastStream runs two batch subscribers per subscription, both calling the same code: one reads
new entries (XREADGROUP), the other reclaims idle pending ones (a `StreamSub` with
`min_idle_time` only does XAUTOCLAIM). FastStream's own OpenTelemetry middleware is not used: it
reads trace headers from FastStream's envelope, which plain JSON entries do not have, and would
open a second, unparented trace; spans here are parented from `event.trace` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeVar

import redis.asyncio as aioredis
import structlog
from faststream.middlewares import AckPolicy
from faststream.redis import RedisBroker, StreamSub
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import BaseModel, ValidationError
from redis.exceptions import RedisError, ResponseError

from pml_common import redis_keys
from pml_common.events import Event, EventRejected, Streams, parse_event
from pml_common.settings import Settings, redis_credentials
from pml_common.stores import redis_client
from pml_common.stream_retention import (
    RetentionPass,
    StreamRetention,
    register_replica_group,
    unregister_replica_group,
)
from pml_common.telemetry import extract_trace, inject_trace

E = TypeVar("E", bound=Event)

#: Field of a stream entry that holds the event JSON.
EVENT_FIELD = "data"
_EVENT_FIELD_B = EVENT_FIELD.encode()
#: Entries read per XREADGROUP call, handled together (one dedupe check, one write).
_BATCH = 16
#: Pause after a batch that was not full before reading again: under load batches then fill
#: up; an idle stream costs nothing more, and an event waits at most this much longer.
_LINGER_S = 0.005
#: Longest wait of one XREADGROUP for new entries (BLOCK): it returns as soon as one arrives,
#: so this only sets how often an idle subscriber asks again. At 100 ms the dozen
#: subscriptions of the search service cost its event loop 7 % of its time under load.
_READ_BLOCK_MS = 1000
#: How often the watchdog checks that every subscriber still runs.
_WATCHDOG_INTERVAL_S = 0.5
#: How often the consumed streams are trimmed (`pml_common.stream_retention`).
_RETENTION_INTERVAL_S = 60.0

log = structlog.get_logger("pml_common.bus")
_faststream_log = logging.getLogger("pml_common.bus.faststream")
_tracer = trace.get_tracer("pml_common.bus")


class DeadLetter(BaseModel):
    """One entry of `Streams.DEAD_LETTER`: what could not be handled, and why."""

    stream: str
    group: str
    entry_id: str
    event_id: str | None
    reason: str
    payload: str
    failed_at: datetime


@dataclass(frozen=True)
class _Entry:
    """A stream entry whose payload is a valid event of its stream."""

    entry_id: bytes
    event: Event
    payload: bytes


def clip(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and a marker saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[cut: {limit} of {len(text)} characters kept]"


@dataclass
class _Writes:
    """What handling a batch leaves to write to Redis, all sent together by `EventBus._flush`."""

    #: Characters of a dead letter's payload and reason kept (`dead_letter_payload_chars`).
    letter_chars: int
    marks: list[str] = field(default_factory=list)
    dead_letters: list[dict[str, str]] = field(default_factory=list)
    acks: list[bytes] = field(default_factory=list)

    def reject(
        self,
        sub: _Subscription,
        entry_id: bytes,
        event_id: str | None,
        reason: str,
        payload: str,
    ) -> None:
        """Dead-letter then ack: the entry is never retried, the group keeps consuming."""
        self.dead_letters.append(
            {
                "stream": sub.stream,
                "group": sub.group,
                "entry_id": _text(entry_id),
                "event_id": event_id or "",
                "reason": clip(reason, self.letter_chars),
                "payload": clip(payload, self.letter_chars),
                "failed_at": datetime.now(UTC).isoformat(),
            }
        )
        self.acks.append(entry_id)

    def clear(self) -> None:
        self.marks.clear()
        self.dead_letters.clear()
        self.acks.clear()


class _Heartbeat:
    """Keeps the entries of a running batch claimed by their live consumer.

    Entries wait in a batch while the handlers before them run, and a handler may be slow (a
    cold start, a store under load): once idle for `reclaim_idle_ms` they would look abandoned
    to the reclaimers of the other consumers, which would handle them a second time and, as each
    claim counts a delivery, dead-letter them as "delivered too often" while they are being
    handled. Every `interval_s` (a third of the idle time) an XCLAIM with JUSTID resets their
    idle time without counting a delivery; a consumer that dies stops beating, and its entries
    become idle and reclaimable. Entries acknowledged meanwhile are no longer pending, and
    Redis leaves them alone.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        sub: _Subscription,
        consumer: str,
        entry_ids: Sequence[bytes],
        interval_s: float,
    ) -> None:
        self._redis = redis
        self._sub = sub
        self._consumer = consumer
        self._entry_ids = list(entry_ids)
        self._interval_s = interval_s
        self._loop = asyncio.get_running_loop()
        self._claiming: asyncio.Task[None] | None = None
        # A timer rather than a task: most batches end before the first beat.
        self._timer: asyncio.TimerHandle | None = (
            self._loop.call_later(interval_s, self._beat) if self._entry_ids else None
        )

    def _beat(self) -> None:
        self._claiming = self._loop.create_task(self._claim())

    async def _claim(self) -> None:
        ids: list[Any] = list(self._entry_ids)
        try:
            await self._redis.xclaim(
                self._sub.stream,
                self._sub.group,
                self._consumer,
                min_idle_time=0,
                message_ids=ids,
                justid=True,
            )
        except RedisError as exc:
            log.warning(
                "bus.heartbeat_failed",
                stream=self._sub.stream,
                group=self._sub.group,
                error=f"{type(exc).__name__}: {exc}",
            )
        self._timer = self._loop.call_later(self._interval_s, self._beat)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._claiming is not None and not self._claiming.done():
            self._claiming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._claiming


@dataclass(frozen=True)
class _Subscription:
    event_type: type[Event]
    group: str
    handler: Callable[[Any], Awaitable[None]]
    dedupe: bool
    #: `subscribe_batch`'s handler: the not-yet-handled events of a read batch in one call
    #: (`handler` then calls it with one event, for the per-event fallback).
    batch_handler: Callable[[list[Any]], Awaitable[None]] | None = None
    #: Entries read per XREADGROUP call.
    batch_size: int = _BATCH

    @property
    def stream(self) -> str:
        return self.event_type.STREAM


class EventBus:
    """Publishes events and runs the subscriptions of one service."""

    def __init__(
        self, settings: Settings, service: str, *, redis: aioredis.Redis | None = None
    ) -> None:
        self._settings = settings
        self._service = service
        # The stores' client, not the library's default one: after a Redis restart the
        # default backs off for up to 10 s per retry on every pooled connection gone stale,
        # which held batches and publications for seconds past the restart.
        self._redis = redis or redis_client(settings)
        self._owns_redis = redis is None
        self._subscriptions: list[_Subscription] = []
        self._broker: RedisBroker | None = None
        self._consumers: list[tuple[_Subscription, Any]] = []
        self._watchdog: asyncio.Task[None] | None = None
        self._retention: asyncio.Task[None] | None = None
        # Entries whose handler is running in this process: the reclaimer must not start a
        # second run of an entry that is merely slow (same consumer name, so XAUTOCLAIM sees it).
        self._in_flight: set[tuple[str, str, bytes]] = set()

    # --- lifecycle ----------------------------------------------------------------------------

    def subscribe(
        self,
        event_type: type[E],
        group: str,
        handler: Callable[[E], Awaitable[None]],
        *,
        dedupe: bool = True,
    ) -> None:
        """Consume `event_type`'s stream in consumer group `group`; call before `start()`."""
        self._add(_Subscription(event_type, group, handler, dedupe))

    def subscribe_batch(
        self,
        event_type: type[E],
        group: str,
        handler: Callable[[list[E]], Awaitable[None]],
        *,
        dedupe: bool = True,
        batch_size: int = _BATCH,
    ) -> None:
        """Like `subscribe`, but `handler` gets the decoded, not-yet-handled events of a read
        batch (up to `batch_size`, stream order, each event once) in one call: a handler that
        can do one store round trip for many events. When it raises, each event of the batch
        is handled again alone (`handler([event])`), so an event that fails is retried and
        dead-lettered alone, with its own reason, and never holds back the others."""

        async def one(event: E) -> None:
            await handler([event])

        self._add(_Subscription(event_type, group, one, dedupe, handler, batch_size))

    def _add(self, sub: _Subscription) -> None:
        if self._broker is not None:
            raise RuntimeError("subscribe() must be called before start()")
        if any(
            s.event_type is sub.event_type and s.group == sub.group for s in self._subscriptions
        ):
            raise ValueError(f"{sub.event_type.TYPE} is already subscribed in group {sub.group!r}")
        self._subscriptions.append(sub)

    async def start(self) -> None:
        if self._broker is not None:
            return
        for sub in self._subscriptions:
            await self._ensure_group(sub)
        broker = RedisBroker(
            self._settings.redis_url,
            # FastStream's per-message access log would double ours; keep it at DEBUG.
            log_level=logging.DEBUG,
            # Through the process's logging (stderr, rendered like every PML log): FastStream's
            # default logger writes to stdout, where the `pml` command prints its results.
            logger=_faststream_log,
            graceful_timeout=10.0,
            # The bus decodes and validates events itself; FastStream's dependency injection
            # would only add per-call work (it resolves the message argument in a thread).
            apply_types=False,
            **redis_credentials(self._settings),
        )
        for sub in self._subscriptions:
            self._consumers.append((sub, self._register(broker, sub, reclaim=False)))
            self._consumers.append((sub, self._register(broker, sub, reclaim=True)))
        self._broker = broker
        if self._subscriptions:
            await broker.start()
            self._watchdog = asyncio.create_task(
                self._watch(), name=f"bus-watchdog-{self._service}"
            )
            self._retention = asyncio.create_task(
                self._retain_forever(), name=f"bus-retention-{self._service}"
            )
        log.info("bus.started", service=self._service, subscriptions=len(self._subscriptions))

    async def stop(self) -> None:
        for task in (self._watchdog, self._retention):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._watchdog = self._retention = None
        if self._broker is not None and self._subscriptions:
            await self._broker.stop()
        self._broker = None
        self._consumers.clear()
        if self._owns_redis:
            await self._redis.aclose()

    async def __aenter__(self) -> EventBus:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # --- publishing ---------------------------------------------------------------------------

    async def publish(self, event: Event) -> str:
        """Append `event` to its stream, carrying the current trace; returns the entry id."""
        with _tracer.start_as_current_span(
            f"publish {event.TYPE}",
            kind=SpanKind.PRODUCER,
            attributes={
                **_span_attributes(event.STREAM, event),
                "messaging.operation.type": "send",
                "messaging.operation.name": "publish",
            },
        ):
            traced = event.model_copy(update={"trace": inject_trace()})
            entry_id = await self._redis.xadd(
                event.STREAM,
                {EVENT_FIELD: traced.to_json()},
                maxlen=self._settings.stream_maxlen,
                approximate=True,
            )
        return _text(entry_id)

    async def dead_letters(self, count: int = 100) -> list[DeadLetter]:
        """The last `count` dead letters, oldest first."""
        rows: list[tuple[bytes, dict[bytes, bytes]]] = await self._redis.xrevrange(  # type: ignore[assignment]
            Streams.DEAD_LETTER, count=count
        )
        letters = []
        for entry_id, fields in reversed(rows):
            data = {_text(k): _text(v) for k, v in fields.items()}
            letters.append(
                DeadLetter(
                    stream=data.get("stream", ""),
                    group=data.get("group", ""),
                    entry_id=data.get("entry_id", _text(entry_id)),
                    event_id=data.get("event_id") or None,
                    reason=data.get("reason", ""),
                    payload=data.get("payload", ""),
                    failed_at=data.get("failed_at") or datetime.now(UTC),
                )
            )
        return letters

    # --- consuming ----------------------------------------------------------------------------

    def _register(self, broker: RedisBroker, sub: _Subscription, *, reclaim: bool) -> Any:
        settings = self._settings
        stream = StreamSub(
            sub.stream,
            group=sub.group,
            consumer=settings.consumer_name,
            batch=True,
            max_records=sub.batch_size,
            # The reclaimer polls slower: pending entries only matter once they are idle.
            polling_interval=(
                max(100, settings.reclaim_idle_ms // 4) if reclaim else _READ_BLOCK_MS
            ),
            min_idle_time=settings.reclaim_idle_ms if reclaim else None,
        )
        subscriber = broker.subscriber(
            stream=stream,
            ack_policy=AckPolicy.MANUAL,
            parser=_envelope_parser,
            decoder=_raw_batch,
        )

        async def on_batch(batch: Mapping[str, Any]) -> None:
            entry_ids: Sequence[bytes] = batch["message_ids"]
            await self._on_batch(sub, entry_ids, batch["data"], reclaimed=reclaim)
            if not reclaim and len(entry_ids) < sub.batch_size:
                # A partial batch means the group has caught up: let the next one fill a little
                # instead of paying a read, a dedupe check and a write for every few entries.
                await asyncio.sleep(_LINGER_S)

        on_batch.__name__ = f"{sub.group}:{sub.event_type.TYPE}:{'reclaim' if reclaim else 'read'}"
        subscriber(on_batch)
        return subscriber

    async def _on_batch(
        self,
        sub: _Subscription,
        entry_ids: Sequence[bytes],
        fields: Sequence[dict[bytes, bytes]],
        *,
        reclaimed: bool,
    ) -> None:
        mine = [
            (entry_id, entry_fields)
            for entry_id, entry_fields in zip(entry_ids, fields, strict=True)
            if (sub.stream, sub.group, entry_id) not in self._in_flight
        ]
        keys = {(sub.stream, sub.group, entry_id) for entry_id, _ in mine}
        self._in_flight |= keys
        heartbeat = _Heartbeat(
            self._redis,
            sub,
            self._settings.consumer_name,
            [entry_id for entry_id, _ in mine],
            self._settings.reclaim_idle_ms / 1000 / 3,
        )
        try:
            await self._handle_batch(sub, mine, reclaimed=reclaimed)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Bookkeeping failed (e.g. Redis unreachable): the unacknowledged entries stay
            # pending and the reclaimer retries them later, so log instead of letting FastStream
            # tear down.
            log.exception(
                "bus.batch_failed",
                stream=sub.stream,
                group=sub.group,
                entries=[_text(entry_id) for entry_id, _ in mine],
            )
        finally:
            await heartbeat.stop()
            self._in_flight -= keys

    async def _handle_batch(
        self,
        sub: _Subscription,
        entries: Sequence[tuple[bytes, dict[bytes, bytes]]],
        *,
        reclaimed: bool,
    ) -> None:
        """Handle a batch in stream order, then write its outcome in one transaction.

        A batch that takes long (a slow handler) writes after each entry and checks the dedupe
        mark right before each handler instead: its entries are idle for the reclaimers of
        other consumers meanwhile, and a handled entry should not stay unacknowledged then.
        """
        started = time.monotonic()
        slow_after_s = self._settings.reclaim_idle_ms / 1000 / 4
        writes = _Writes(self._settings.dead_letter_payload_chars)
        if reclaimed:
            # Before anything else can fail: whatever keeps a batch from being handled, an entry
            # delivered too often leaves the stream here.
            entries = [e for e in entries if not await self._exhausted(sub, *e, writes)]
            await self._flush(sub, writes)  # written now: the rest of the batch may still fail
        decoded = [
            self._decode_safely(sub, entry_id, fields, writes) for entry_id, fields in entries
        ]
        todo = [entry for entry in decoded if entry is not None]
        handled = await self._already_handled(sub, todo)
        if sub.batch_handler is not None and len(todo) > 1:
            todo = self._fresh(todo, handled, writes)
            if await self._run_batch_handler(sub, sub.batch_handler, todo):
                for entry in todo:
                    self._handled(sub, entry, handled, writes)
                await self._flush(sub, writes)
                return
            # Some event of the batch fails: each alone now, so only that one is retried.
        for entry in todo:
            if time.monotonic() - started > slow_after_s:
                await self._flush(sub, writes)
                handled |= await self._already_handled(sub, [entry])
            if _identity(entry) in handled:
                log.debug("bus.duplicate_skipped", group=sub.group, event_id=entry.event.event_id)
                writes.acks.append(entry.entry_id)
                continue
            if await self._run_handler(sub, entry, writes):
                self._handled(sub, entry, handled, writes)
        await self._flush(sub, writes)

    def _handled(
        self, sub: _Subscription, entry: _Entry, handled: set[tuple[str, str]], writes: _Writes
    ) -> None:
        """The entry's handler succeeded: its dedupe mark and acknowledgement, to flush."""
        if sub.dedupe:
            writes.marks.append(self._dedupe_key(sub, entry.event))
            handled.add(_identity(entry))
        writes.acks.append(entry.entry_id)

    def _fresh(
        self, entries: Sequence[_Entry], handled: set[tuple[str, str]], writes: _Writes
    ) -> list[_Entry]:
        """The entries a batch handler gets: those handled before, and repeats of an event
        earlier in the batch, are acknowledged without it (as the per-event loop would)."""
        fresh: list[_Entry] = []
        seen = set(handled)
        for entry in entries:
            if _identity(entry) in seen:
                log.debug("bus.duplicate_skipped", event_id=entry.event.event_id)
                writes.acks.append(entry.entry_id)
                continue
            seen.add(_identity(entry))
            fresh.append(entry)
        return fresh

    async def _run_batch_handler(
        self,
        sub: _Subscription,
        handler: Callable[[list[Any]], Awaitable[None]],
        entries: Sequence[_Entry],
    ) -> bool:
        """Run a batch handler in one span linked to each publisher's; True on success.
        A failure is only logged: the events are handled again one by one."""
        if not entries:
            return True
        links = [
            trace.Link(trace.get_current_span(extract_trace(e.event.trace)).get_span_context())
            for e in entries
        ]
        with _tracer.start_as_current_span(
            f"consume {sub.event_type.TYPE} batch",
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": "redis",
                "messaging.destination.name": sub.stream,
                "messaging.operation.type": "process",
                "messaging.operation.name": "consume",
                "messaging.consumer.group.name": sub.group,
                "messaging.batch.message_count": len(entries),
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                await handler([entry.event for entry in entries])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                log.warning(
                    "bus.batch_handler_failed_handling_one_by_one",
                    stream=sub.stream,
                    group=sub.group,
                    events=len(entries),
                    error=f"{type(exc).__name__}: {exc}",
                )
                return False
        return True

    def _decode_safely(
        self, sub: _Subscription, entry_id: bytes, fields: dict[bytes, bytes], writes: _Writes
    ) -> _Entry | None:
        """`_decode`, with any failure, foreseen or not, dead-lettering the entry: one entry
        that cannot be decoded never holds back the others of its batch."""
        try:
            return self._decode(sub, entry_id, fields, writes)
        except Exception as exc:
            payload = fields.get(_EVENT_FIELD_B, b"")
            reason = f"cannot decode the entry: {type(exc).__name__}: {exc}"
            writes.reject(sub, entry_id, _guess_event_id(payload), reason, _text(payload))
            return None

    def _decode(
        self, sub: _Subscription, entry_id: bytes, fields: dict[bytes, bytes], writes: _Writes
    ) -> _Entry | None:
        """The entry's event, or None once a payload that can never be handled is rejected."""
        payload = fields.get(_EVENT_FIELD_B)
        if payload is None:
            raw_fields = json.dumps({_text(k): _text(v) for k, v in fields.items()})
            reason = f"entry has no `{EVENT_FIELD}` field"
            writes.reject(sub, entry_id, None, reason, raw_fields)
            return None
        try:
            event = _parse_expected(payload, sub.event_type)
            if not isinstance(event, sub.event_type):
                raise EventRejected(
                    f"{event.type} does not belong on {sub.stream} (expects {sub.event_type.TYPE})"
                )
        except EventRejected as exc:
            writes.reject(sub, entry_id, _guess_event_id(payload), exc.reason, _text(payload))
            return None
        return _Entry(entry_id, event, payload)

    async def _already_handled(
        self, sub: _Subscription, entries: Sequence[_Entry]
    ) -> set[tuple[str, str]]:
        """(tenant, event id) of `entries` the group has handled before (one MGET)."""
        if not sub.dedupe or not entries:
            return set()
        marks = await self._redis.mget([self._dedupe_key(sub, entry.event) for entry in entries])
        return {
            _identity(entry) for entry, mark in zip(entries, marks, strict=True) if mark is not None
        }

    async def _run_handler(self, sub: _Subscription, entry: _Entry, writes: _Writes) -> bool:
        """Run the handler in a span continuing the publisher's trace; True on success."""
        event = entry.event
        with _tracer.start_as_current_span(
            f"consume {event.TYPE}",
            context=extract_trace(event.trace),
            kind=SpanKind.CONSUMER,
            attributes={
                **_span_attributes(sub.stream, event),
                "messaging.operation.type": "process",
                "messaging.operation.name": "consume",
                "messaging.consumer.group.name": sub.group,
                "messaging.redis.entry_id": _text(entry.entry_id),
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                await sub.handler(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                await self._handler_failed(sub, entry, exc, writes)
                return False
        return True

    async def _handler_failed(
        self, sub: _Subscription, entry: _Entry, exc: Exception, writes: _Writes
    ) -> None:
        deliveries = await self._deliveries(sub, entry.entry_id)
        error = f"{type(exc).__name__}: {exc}"
        if deliveries >= self._settings.max_deliveries:
            reason = f"handler failed {deliveries} times; last error: {error}"
            writes.reject(sub, entry.entry_id, entry.event.event_id, reason, _text(entry.payload))
            return
        log.warning(
            "bus.handler_failed_will_retry",
            stream=sub.stream,
            group=sub.group,
            entry_id=_text(entry.entry_id),
            event_id=entry.event.event_id,
            delivery=deliveries,
            max_deliveries=self._settings.max_deliveries,
            retry_after_ms=self._settings.reclaim_idle_ms,
            error=error,
        )

    async def _exhausted(
        self, sub: _Subscription, entry_id: bytes, fields: dict[bytes, bytes], writes: _Writes
    ) -> bool:
        """Dead-letter a reclaimed entry delivered too often without any verdict: its consumers
        died while handling it (a poison message that kills processes), or its batch failed
        every time before reaching its handler."""
        deliveries = await self._deliveries(sub, entry_id)
        if deliveries <= self._settings.max_deliveries:
            return False
        payload = fields.get(_EVENT_FIELD_B, b"")
        reason = f"delivered {deliveries} times without being handled (consumers died?)"
        writes.reject(sub, entry_id, _guess_event_id(payload), reason, _text(payload))
        return True

    async def _flush(self, sub: _Subscription, writes: _Writes) -> None:
        """Dedupe marks, dead letters and acknowledgements in one MULTI/EXEC: an event is marked
        handled exactly when its entry is acknowledged, and a dead letter exists exactly when
        its entry is acknowledged."""
        if not writes.acks:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            for key in writes.marks:
                pipe.set(key, b"1", ex=self._settings.dedupe_ttl_s)
            for letter in writes.dead_letters:
                pipe.xadd(
                    Streams.DEAD_LETTER,
                    letter,  # type: ignore[arg-type]
                    maxlen=self._settings.dead_letter_maxlen,
                    approximate=True,
                )
            pipe.xack(sub.stream, sub.group, *writes.acks)
            await pipe.execute()
        for letter in writes.dead_letters:
            log.error(
                "bus.dead_lettered",
                stream=letter["stream"],
                group=letter["group"],
                entry_id=letter["entry_id"],
                event_id=letter["event_id"] or None,
                reason=letter["reason"],
            )
        writes.clear()

    async def _deliveries(self, sub: _Subscription, entry_id: bytes) -> int:
        rows = await self._redis.xpending_range(
            sub.stream, sub.group, min=entry_id, max=entry_id, count=1
        )
        return int(rows[0]["times_delivered"]) if rows else 0

    def _dedupe_key(self, sub: _Subscription, event: Event) -> str:
        return redis_keys.dedupe(sub.group, event.tenant_id, event.event_id)

    async def _ensure_group(self, sub: _Subscription) -> bool:
        """Create the group if missing; True when it had to be created.

        A new group starts at the stream's beginning ("0"): events published before the
        consumer first started, or between a Redis flush and the group's recreation, are
        still handled (dedupe covers the overlap).
        """
        try:
            await self._redis.xgroup_create(sub.stream, sub.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            return False
        return True

    async def _watch(self) -> None:
        """Restart subscribers FastStream stopped for good (it stops on NOGROUP)."""
        while True:
            await asyncio.sleep(_WATCHDOG_INTERVAL_S)
            for sub, consumer in list(self._consumers):
                if consumer.running:
                    continue
                try:
                    created = await self._ensure_group(sub)
                    await consumer.start()
                    log.warning(
                        "bus.consumer_restarted",
                        stream=sub.stream,
                        group=sub.group,
                        group_recreated=created,
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning(
                        "bus.consumer_restart_failed",
                        stream=sub.stream,
                        group=sub.group,
                        error=f"{type(exc).__name__}: {exc}",
                    )

    async def trim_streams(self) -> list[RetentionPass]:
        """One retention pass over every stream this bus consumes (done every minute)."""
        retention = StreamRetention(self._redis, self._settings)
        streams = dict.fromkeys(sub.stream for sub in self._subscriptions)
        return [await retention.apply(stream) for stream in streams]

    async def _retain_forever(self) -> None:
        while True:
            await asyncio.sleep(_RETENTION_INTERVAL_S)
            try:
                await self.trim_streams()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a missed pass is harmless: the next one catches up
                log.warning("bus.retention_failed", error=f"{type(exc).__name__}: {exc}")


async def _envelope_parser(message: Any, original: Callable[[Any], Awaitable[Any]]) -> Any:
    """FastStream parser that never fails: entries are decoded by the bus, not by FastStream.

    FastStream's default parser JSON-encodes the raw fields and raises on bytes that are not
    UTF-8, which would leave such an entry pending forever; it parses an empty batch instead and
    the bus reads the untouched `raw_message`.
    """
    parsed = await original({**message, "data": []})
    parsed.raw_message = message
    return parsed


async def _raw_batch(message: Any, original: Callable[[Any], Awaitable[Any]]) -> Any:
    """FastStream decoder handing the bus the raw batch: entry ids and their fields."""
    return message.raw_message


def _parse_expected(payload: bytes, event_type: type[Event]) -> Event:
    """The event in `payload`, validated in one pass when it is the subscription's own type and
    version (the usual case); anything else goes through `parse_event`, which says what is wrong
    with it or which other event it is."""
    try:
        event = event_type.model_validate_json(payload)
    except ValidationError:
        return parse_event(payload)
    if event.version != event_type.VERSION:  # `version` is any int to the model itself
        return parse_event(payload)
    return event


def _span_attributes(stream: str, event: Event) -> dict[str, str]:
    return {
        "messaging.system": "redis",
        "messaging.destination.name": stream,
        "messaging.message.id": event.event_id,
        "pml.event.type": event.TYPE,
        "pml.tenant_id": event.tenant_id,
    }


_EVENT_ID_TEXT = re.compile(rb'"event_id"\s*:\s*"([^"\\]{1,128})"')


def _identity(entry: _Entry) -> tuple[str, str]:
    """What makes an event a repeat of another: its id within its tenant."""
    return entry.event.tenant_id, entry.event.event_id


def _guess_event_id(payload: bytes) -> str | None:
    """The `event_id` of a rejected payload, when it has a usable one (for the dead letter)."""
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        # Not decodable (broken, nested too deeply): the first `"event_id": "…"` it spells.
        found = _EVENT_ID_TEXT.search(payload)
        return found.group(1).decode("utf-8", errors="replace") if found else None
    event_id = data.get("event_id") if isinstance(data, dict) else None
    return event_id if isinstance(event_id, str) and event_id else None


def _text(value: bytes | str | Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


async def create_replica_group(
    client: aioredis.Redis, group: str, event_types: Sequence[type[Event]]
) -> None:
    """Create a per-replica group at the end of each stream.

    Created before the bus would create it at the beginning, so that a new replica, which
    loads its caches fresh, does not replay history into them. Registered as a replica's, so
    that once the replica is gone without removing it, stream retention removes it.
    """
    for event_type in event_types:
        try:
            await client.xgroup_create(event_type.STREAM, group, id="$", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        await register_replica_group(client, event_type.STREAM, group)


async def destroy_replica_group(
    client: aioredis.Redis, group: str, event_types: Sequence[type[Event]]
) -> None:
    """Remove a per-replica group on shutdown (best effort: Redis may already be gone)."""
    for event_type in event_types:
        with contextlib.suppress(RedisError):
            await client.xgroup_destroy(event_type.STREAM, group)
            await unregister_replica_group(client, event_type.STREAM, group)
