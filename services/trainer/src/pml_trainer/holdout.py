"""Held-back executions: the recent traces no model trained on, that decide which version serves.

Every `every`-th execution of a tenant (a per-tenant counter) is held back instead of entering
the replay buffer, up to `capacity` per tenant. A new version is admitted only if it ranks the
executed tools of these traces better than the serving version and the first stage
(`pml_shgat.gating`). When the set is full, its oldest trace is released into the replay buffer
(it is no longer recent, and so it is still learned from): the set always holds traces that no
version was trained on, and no execution is lost to learning.

Routing is one script, idempotent on the trace id: a trace already held stays held, one already
in the replay buffer is not counted or held again, so a redelivered event takes the same road.

Keys: per tenant `pml:holdout:{tenant}:traces` (hash id -> trace JSON) and `:order` (list of
ids, oldest first); for all tenants `pml:holdout:seen` (hash tenant -> executions routed).
"""

from __future__ import annotations

import redis.asyncio as aioredis
import structlog

from pml_common import redis_keys
from pml_trainer.replay_buffer import Trace, traces_key

SEEN_KEY = redis_keys.HOLDOUT_SEEN

log = structlog.get_logger(__name__)

# KEYS: held traces, held order, seen, replay traces; ARGV: id, JSON, every, capacity, tenant.
# Returns {1, released JSON...} when held, {0} when the trace goes to the replay buffer.
_ROUTE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return {1}
end
if redis.call('HEXISTS', KEYS[4], ARGV[1]) == 1 then
  return {0}
end
local n = redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
if n % tonumber(ARGV[3]) ~= 0 then
  return {0}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[1])
local released = {1}
while redis.call('LLEN', KEYS[2]) > tonumber(ARGV[4]) do
  local oldest = redis.call('LPOP', KEYS[2])
  table.insert(released, redis.call('HGET', KEYS[1], oldest))
  redis.call('HDEL', KEYS[1], oldest)
end
return released
"""


class HoldOut:
    """Per-tenant held-back traces in Redis; see the module docstring."""

    def __init__(self, redis: aioredis.Redis, every: int = 5, capacity: int = 200) -> None:
        if every < 2 or capacity < 1:
            raise ValueError("every must be >= 2 (something must be learned) and capacity >= 1")
        self._redis = redis
        self.every = every
        self.capacity = capacity
        self._route = redis.register_script(_ROUTE)

    async def route(self, tenant_id: str, trace: Trace) -> tuple[bool, list[Trace]]:
        """Hold the trace back or not; returns (held, traces released to the replay buffer)."""
        k = _Keys(tenant_id)
        reply = await self._route(
            keys=[k.traces, k.order, SEEN_KEY, traces_key(tenant_id)],
            args=[trace.trace_id, trace.model_dump_json(), self.every, self.capacity, tenant_id],
        )
        released = [Trace.model_validate_json(raw) for raw in reply[1:] if raw is not None]
        return bool(int(reply[0])), released

    async def hold(self, tenant_id: str, trace: Trace) -> None:
        """Hold a trace back unconditionally (tests, and replays of a known evaluation set)."""
        k = _Keys(tenant_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(k.traces, trace.trace_id, trace.model_dump_json())
            pipe.rpush(k.order, trace.trace_id)
            await pipe.execute()

    async def recent(self, tenant_id: str) -> list[Trace]:
        """The held-back traces, oldest first."""
        k = _Keys(tenant_id)
        ids = await self._redis.lrange(k.order, 0, -1)
        if not ids:
            return []
        raws = await self._redis.hmget(k.traces, ids)
        return [Trace.model_validate_json(raw) for raw in raws if raw is not None]

    async def delete_tenant(self, tenant_id: str) -> None:
        k = _Keys(tenant_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(k.traces, k.order)
            pipe.hdel(SEEN_KEY, tenant_id)
            await pipe.execute()


class _Keys:
    def __init__(self, tenant_id: str) -> None:
        if not tenant_id:
            raise ValueError("tenant_id must not be empty")
        self.traces = redis_keys.holdout(tenant_id, "traces")
        self.order = redis_keys.holdout(tenant_id, "order")
