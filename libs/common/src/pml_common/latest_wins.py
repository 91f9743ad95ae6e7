"""Requests about one document take effect in the order they were made, not handled.

A submission and a deletion of the same document travel on different streams, and several
consumers read each stream, so the later request may be handled first. Each consumer that
applies them asks `LatestWins.claim` with the time the request was made (the event's
`occurred_at`, or the submission a derived event stems from): the claim is granted only when no
later request about the document, or deletion of its tenant, was claimed before, and it is
recorded atomically. A redelivered event makes the same claim again and is granted, so handlers
stay retryable.

Request times come from the clocks of the processes that accept the requests; clocks that drift
apart by more than the time between two requests about one document can still reorder them.
Claims expire after `CLAIM_TTL_S`, far longer than any event waits in a stream.
"""

from __future__ import annotations

from datetime import datetime

from redis.asyncio import Redis

from pml_common import redis_keys

CLAIM_TTL_S = 7 * 24 * 3600

# KEYS[1] the document's claim, KEYS[2] the tenant's deletion; ARGV[1] the request time (µs).
_CLAIM_DOCUMENT = """
local at = tonumber(ARGV[1])
local latest = tonumber(redis.call('GET', KEYS[1]) or '-1')
local dropped = tonumber(redis.call('GET', KEYS[2]) or '-1')
if at < latest or at < dropped then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""

# KEYS[1] the tenant's deletion; ARGV[1] the request time (µs).
_CLAIM_TENANT = """
local at = tonumber(ARGV[1])
if at < tonumber(redis.call('GET', KEYS[1]) or '-1') then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""


def _micros(at: datetime) -> int:
    return round(at.timestamp() * 1_000_000)


class LatestWins:
    """Claims of one consumer group (`scope`): each applies requests in the order they were made."""

    def __init__(self, redis: Redis, scope: str) -> None:
        self._redis = redis
        self._scope = scope
        self._document = redis.register_script(_CLAIM_DOCUMENT)
        self._tenant = redis.register_script(_CLAIM_TENANT)

    def _key(self, tenant: str, doc: str | None = None) -> str:
        if doc is None:
            return redis_keys.latest_tenant(self._scope, tenant)
        return redis_keys.latest_document(self._scope, tenant, doc)

    async def claim_document(self, tenant: str, doc: str, at: datetime) -> bool:
        """True when a request about `doc` made at `at` is still the latest one to apply."""
        keys = [self._key(tenant, doc), self._key(tenant)]
        return bool(await self._document(keys=keys, args=[_micros(at), CLAIM_TTL_S]))

    async def claim_tenant_deletion(self, tenant: str, at: datetime) -> bool:
        """True unless the tenant's deletion was already claimed by a later request; every
        request about one of its documents made before `at` is refused from now on."""
        return bool(await self._tenant(keys=[self._key(tenant)], args=[_micros(at), CLAIM_TTL_S]))
