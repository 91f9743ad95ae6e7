"""How long stream entries stay: until every consumer group has acknowledged them, then
`stream_retention_s` more.

Every consumer of a stream runs `StreamRetention.apply` on it every minute (`EventBus`). One pass:

1. reads each consumer group's position: the first entry it still needs is its oldest pending
   (read, not acknowledged) entry, or the one after the last it was given when none is pending;
2. removes the group of a replica that died without removing it (`create_replica_group`
   registers replica groups; one whose consumers have all been idle `replica_group_idle_s` is
   dead: a new replica never reads an old replica's group), so it holds nothing back;
3. trims (XTRIM MINID) the entries before the earliest of those positions and older than the
   retention. A stream without any group is not trimmed: the consumers that will create their
   groups at its start have not read it yet.

So no entry a group still needs is ever trimmed here. `stream_maxlen` (XADD's approximate cap)
stays as the backstop of memory: a group lagging that far loses entries, and each pass then logs
`bus.stream_entries_lost` naming the group (a pending entry of it is older than the stream's
first, or it has more entries to read than the stream holds after its position), and
`bus.stream_lag_high` once a group lags half the cap. A group created from the
stream's start after the others consumed entries older than the retention does not get those.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import structlog

from pml_common import redis_keys
from pml_common.settings import Settings

log = structlog.get_logger("pml_common.bus")

#: A stream entry id as (milliseconds, sequence).
EntryId = tuple[int, int]


def parse_id(value: bytes | str) -> EntryId:
    text = value.decode() if isinstance(value, bytes) else value
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def format_id(entry_id: EntryId) -> str:
    return f"{entry_id[0]}-{entry_id[1]}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class GroupPosition:
    """Where one consumer group is in a stream."""

    group: str
    #: The first entry the group still needs.
    needs_from: EntryId
    #: Entries not yet delivered to the group (None when Redis cannot tell).
    lag: int | None
    #: Entries the group had not acknowledged were deleted (trimmed at the cap).
    lost: bool


@dataclass(frozen=True)
class RetentionPass:
    """What one pass over a stream found and did."""

    stream: str
    groups: tuple[GroupPosition, ...]
    removed_groups: tuple[str, ...]
    #: Entries before this one were trimmed (None: the stream has no group, nothing trimmed).
    kept_from: EntryId | None
    trimmed: int


@dataclass(frozen=True)
class _Head:
    """Where a stream starts now, and how many entries it holds."""

    first: EntryId | None
    length: int
    #: Entries ever added to the stream.
    added: int

    def lost(self, last: EntryId, oldest_pending: EntryId | None, read: int | None) -> bool:
        """Whether entries a group needed were deleted. Trimming only ever removes the head,
        so either one of its pending entries is gone, or, positioned before the head, it has
        more entries left to read (of those ever added, the ones it has not read) than the
        stream holds. Unknown (False) when Redis cannot count what the group read."""
        if self.first is None:
            return False
        if oldest_pending is not None and oldest_pending < self.first:
            return True
        return last < self.first and read is not None and self.added - read > self.length


class StreamRetention:
    """Trims streams of what every group acknowledged, and removes dead replicas' groups."""

    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        self._redis = redis
        self._settings = settings

    async def apply(self, stream: str) -> RetentionPass:
        now_ms = int(time.time() * 1000)
        info = await self._redis.xinfo_stream(stream)
        removed = await self._remove_dead_replica_groups(stream, now_ms)
        rows = [
            row
            for row in await self._redis.xinfo_groups(stream)
            if _text(row["name"]) not in removed
        ]
        head = _Head(
            first=parse_id(info["first-entry"][0]) if info.get("first-entry") else None,
            length=int(info["length"]),
            added=int(info.get("entries-added") or 0),
        )
        groups = tuple([await self._position(stream, row, head) for row in rows])
        self._alarm(stream, groups)
        if not groups:
            return RetentionPass(stream, groups, tuple(removed), None, 0)
        retained = (max(0, now_ms - self._settings.stream_retention_s * 1000), 0)
        kept_from = min([retained, *(g.needs_from for g in groups)])
        # Exact, not `~`: once a minute per stream, and nothing at or after `kept_from` goes.
        trimmed = int(
            await self._redis.xtrim(stream, minid=format_id(kept_from), approximate=False)
        )
        if trimmed:
            log.debug("bus.stream_trimmed", stream=stream, trimmed=trimmed, kept_from=kept_from)
        return RetentionPass(stream, groups, tuple(removed), kept_from, trimmed)

    async def _position(self, stream: str, row: Mapping[str, Any], head: _Head) -> GroupPosition:
        group = _text(row["name"])
        last = parse_id(row["last-delivered-id"])
        needs_from = (last[0], last[1] + 1)
        oldest_pending = None
        if int(row["pending"]):
            summary = await self._redis.xpending(stream, group)
            if summary["min"] is not None:
                oldest_pending = parse_id(summary["min"])
                needs_from = min(needs_from, oldest_pending)
        lag = None if row.get("lag") is None else int(row["lag"])
        read = row.get("entries-read")
        if read is None and last == (0, 0):
            read = 0  # never read: it needs every entry ever added
        return GroupPosition(
            group=group,
            needs_from=needs_from,
            lag=lag,
            lost=head.lost(last, oldest_pending, None if read is None else int(read)),
        )

    def _alarm(self, stream: str, groups: tuple[GroupPosition, ...]) -> None:
        for g in groups:
            if g.lost:
                log.error(
                    "bus.stream_entries_lost",
                    stream=stream,
                    group=g.group,
                    needs_from=format_id(g.needs_from),
                    stream_maxlen=self._settings.stream_maxlen,
                    hint="the group lagged beyond stream_maxlen; entries it had not "
                    "acknowledged were trimmed",
                )
            elif g.lag is not None and g.lag > self._settings.stream_maxlen // 2:
                log.warning(
                    "bus.stream_lag_high",
                    stream=stream,
                    group=g.group,
                    lag=g.lag,
                    stream_maxlen=self._settings.stream_maxlen,
                )

    async def _remove_dead_replica_groups(self, stream: str, now_ms: int) -> set[str]:
        registry = redis_keys.replica_groups(stream)
        created = {
            _text(name): int(at) for name, at in (await self._redis.hgetall(registry)).items()
        }
        if not created:
            return set()
        idle_ms = self._settings.replica_group_idle_s * 1000
        removed: set[str] = set()
        present: set[str] = set()
        for row in await self._redis.xinfo_groups(stream):
            group = _text(row["name"])
            present.add(group)
            if group not in created:
                continue  # a shared group: never removed here
            idle = await self._idle_ms(stream, group, now_ms - created[group])
            if idle >= idle_ms:
                await self._redis.xgroup_destroy(stream, group)
                removed.add(group)
                log.warning(
                    "bus.dead_replica_group_removed", stream=stream, group=group, idle_ms=idle
                )
        # Also forget groups already gone (removed by their replica's shutdown, or by Redis
        # being emptied), so the registry only holds groups that exist.
        if forgotten := (set(created) - present) | removed:
            await self._redis.hdel(registry, *forgotten)
        return removed

    async def _idle_ms(self, stream: str, group: str, age_ms: int) -> int:
        """How long the group's most recently active consumer has been idle; its age (since
        it was registered) when no consumer ever read it."""
        consumers = await self._redis.xinfo_consumers(stream, group)
        if not consumers:
            return age_ms
        return min(int(c["idle"]) for c in consumers)


async def register_replica_group(redis: aioredis.Redis, stream: str, group: str) -> None:
    """Note `group` as one replica's own (see the module's docstring), with its creation."""
    now_ms = int(time.time() * 1000)
    await redis.hset(redis_keys.replica_groups(stream), group, now_ms)


async def unregister_replica_group(redis: aioredis.Redis, stream: str, group: str) -> None:
    await redis.hdel(redis_keys.replica_groups(stream), group)
