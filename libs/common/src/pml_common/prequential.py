"""Prequential figures per tenant: how the serving model ranked each execution before learning it.

The trainer (the single writer) records, for every execution it receives and before the
execution can be learned from, how the scores served at that moment ranked the tools the
execution used: recall@1/@5/@10 and the rank of the first executed tool. The scorer reads the
figures for `ModelInfo`. Figures are kept twice: over a window of the most recent executions
and cumulated since the tenant's first one.

Recording is idempotent on the execution id while the execution is in the window (a redelivered
event is not counted twice), and atomic (one script).

Keys of a tenant: `pml:prequential:{tenant}:window` (list of ids, oldest first),
`:figures` (hash id -> "r1 r5 r10 rank"), `:totals` (hash of cumulated sums and count).
"""

from __future__ import annotations

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, Field

from pml_common import redis_keys

#: Executions in the recent window.
WINDOW = 200

# KEYS: window, figures, totals; ARGV: id, r1, r5, r10, rank, capacity. Returns 1 if recorded.
_RECORD = """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. ARGV[5])
redis.call('RPUSH', KEYS[1], ARGV[1])
local capacity = tonumber(ARGV[6])
while redis.call('LLEN', KEYS[1]) > capacity do
  redis.call('HDEL', KEYS[2], redis.call('LPOP', KEYS[1]))
end
redis.call('HINCRBY', KEYS[3], 'count', 1)
redis.call('HINCRBYFLOAT', KEYS[3], 'recall_at_1', ARGV[2])
redis.call('HINCRBYFLOAT', KEYS[3], 'recall_at_5', ARGV[3])
redis.call('HINCRBYFLOAT', KEYS[3], 'recall_at_10', ARGV[4])
redis.call('HINCRBYFLOAT', KEYS[3], 'first_rank', ARGV[5])
return 1
"""

_FIELDS = ("recall_at_1", "recall_at_5", "recall_at_10", "first_rank")


class RankingFigures(BaseModel):
    """Mean figures over `count` executions (all 0 when there were none)."""

    model_config = ConfigDict(frozen=True)

    count: int = Field(0, ge=0)
    recall_at_1: float = 0.0
    recall_at_5: float = 0.0
    recall_at_10: float = 0.0
    #: Mean 1-based rank of the first executed tool among the tenant's tools.
    first_rank: float = 0.0


class PrequentialSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    window: RankingFigures = RankingFigures()
    cumulative: RankingFigures = RankingFigures()


class PrequentialStore:
    def __init__(self, redis: aioredis.Redis, window: int = WINDOW) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self._redis = redis
        self.window = window
        self._record = redis.register_script(_RECORD)

    async def record(
        self,
        tenant_id: str,
        execution_id: str,
        recall_at_1: float,
        recall_at_5: float,
        recall_at_10: float,
        first_rank: float,
    ) -> bool:
        """Count one execution's figures; False when that execution was already counted."""
        k = _Keys(tenant_id)
        values = (recall_at_1, recall_at_5, recall_at_10, first_rank)
        done = await self._record(
            keys=[k.window, k.figures, k.totals],
            args=[execution_id, *(repr(float(v)) for v in values), self.window],
        )
        return bool(done)

    async def summary(self, tenant_id: str) -> PrequentialSummary:
        k = _Keys(tenant_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hvals(k.figures)
            pipe.hgetall(k.totals)
            rows, totals = await pipe.execute()
        window = [[float(x) for x in raw.split()] for raw in rows]
        return PrequentialSummary(window=_window(window), cumulative=_cumulative(totals))

    async def delete_tenant(self, tenant_id: str) -> None:
        k = _Keys(tenant_id)
        await self._redis.delete(k.window, k.figures, k.totals)


def _window(rows: list[list[float]]) -> RankingFigures:
    if not rows:
        return RankingFigures()
    means = [sum(r[i] for r in rows) / len(rows) for i in range(len(_FIELDS))]
    return RankingFigures(count=len(rows), **dict(zip(_FIELDS, means, strict=True)))


def _cumulative(totals: dict[bytes, bytes]) -> RankingFigures:
    count = int(totals.get(b"count", 0))
    if count == 0:
        return RankingFigures()
    sums = {f: float(totals.get(f.encode(), 0.0)) / count for f in _FIELDS}
    return RankingFigures(count=count, **sums)


class _Keys:
    def __init__(self, tenant_id: str) -> None:
        if not tenant_id:
            raise ValueError("tenant_id must not be empty")
        self.window = redis_keys.prequential(tenant_id, "window")
        self.figures = redis_keys.prequential(tenant_id, "figures")
        self.totals = redis_keys.prequential(tenant_id, "totals")
