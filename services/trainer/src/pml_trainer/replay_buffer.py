"""Prioritized experience replay (Schaul et al. 2016, proportional variant), kept in Redis.

The trainer adds one trace per execution and trains SHGAT on batches sampled from it. The
buffer lives in Redis, not in the trainer's memory, so a restarted trainer (or the replica
that takes over the lock) carries on with the same traces, priorities and beta schedule.

- P(i) = p_i^alpha / sum_k p_k^alpha, sampled with replacement;
- importance weights w_i = (N * P(i))^-beta, divided by the largest weight of the batch so that
  they only ever scale updates down; beta grows linearly from beta0 to 1 over `beta_steps`
  calls of `sample` (a per-tenant counter in Redis, so the schedule survives restarts);
- a new trace enters at the buffer's current highest priority (1.0 when empty), so it is
  replayed at least once soon; `update_priorities` sets p = |TD error| + epsilon.

Priorities are read whole for each batch (ZRANGE): at the configured capacities (about 10^4
traces per tenant) that is a few milliseconds and avoids keeping a sum tree in step with Redis.

"New traces since the last training" is two counters per tenant: `added` (bumped by every new
trace) and `trained` (the `added` value a finished training round started from). A tenant is
pending while added > trained, so a trace added during a round keeps it pending afterwards.

Keys: per tenant `pml:replay:{tenant}:traces` (hash id -> trace JSON), `:priorities` (sorted
set id -> p), `:order` (list of ids, oldest first), `:steps` (sample counter); for all tenants
`pml:replay:added` and `pml:replay:trained` (hashes tenant -> count).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import redis.asyncio as aioredis
import structlog
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from pml_common import redis_keys

ADDED_KEY = redis_keys.REPLAY_ADDED
TRAINED_KEY = redis_keys.REPLAY_TRAINED
#: Resamples when a sampled trace was evicted between reading priorities and traces.
_SAMPLE_ATTEMPTS = 5

log = structlog.get_logger(__name__)

# KEYS: traces, priorities, order, added; ARGV: trace id, trace JSON, capacity, tenant.
# Returns 1 when added, 0 when the id was already there.
_ADD = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return 0
end
local top = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local priority = top[2] or '1'
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], priority, ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[1])
local capacity = tonumber(ARGV[3])
while redis.call('LLEN', KEYS[3]) > capacity do
  local oldest = redis.call('LPOP', KEYS[3])
  redis.call('HDEL', KEYS[1], oldest)
  redis.call('ZREM', KEYS[2], oldest)
end
redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
return 1
"""

# KEYS: trained; ARGV: tenant, upto. The trained mark only moves forward.
_MARK_TRAINED = """
local trained = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if tonumber(ARGV[2]) > trained then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return 1
"""


class Trace(BaseModel):
    """One execution as the trainer learns from it."""

    model_config = ConfigDict(frozen=True)

    trace_id: str = Field(min_length=1)
    intent: str
    path: list[str]
    outcome: float = Field(ge=0.0, le=1.0)
    capability_id: str | None = None


@dataclass(frozen=True)
class Sample:
    """A batch drawn by `ReplayBuffer.sample` (positions align across the fields)."""

    traces: list[Trace]
    ids: list[str]
    probabilities: NDArray[np.float64]
    weights: NDArray[np.float64]
    beta: float
    step: int

    def __len__(self) -> int:
        return len(self.ids)


class ReplayBuffer:
    """Per-tenant prioritized replay buffer in Redis; see the module docstring."""

    def __init__(
        self,
        redis: aioredis.Redis,
        capacity: int,
        alpha: float = 0.6,
        beta0: float = 0.4,
        beta_steps: int = 2000,
        epsilon: float = 0.01,
    ) -> None:
        if capacity < 1 or beta_steps < 1 or epsilon <= 0:
            raise ValueError("capacity and beta_steps must be >= 1 and epsilon > 0")
        if not (0 <= alpha <= 1 and 0 <= beta0 <= 1):
            raise ValueError("alpha and beta0 must lie in [0, 1]")
        self._redis = redis
        self.capacity = capacity
        self.alpha = alpha
        self.beta0 = beta0
        self.beta_steps = beta_steps
        self.epsilon = epsilon
        self._add = redis.register_script(_ADD)
        self._mark_trained = redis.register_script(_MARK_TRAINED)

    # --- writing ------------------------------------------------------------------------------

    async def add(self, tenant_id: str, trace: Trace) -> bool:
        """Store a new trace at the highest priority; False if its id is already stored."""
        k = _Keys(tenant_id)
        added = await self._add(
            keys=[k.traces, k.priorities, k.order, ADDED_KEY],
            args=[trace.trace_id, trace.model_dump_json(), self.capacity, tenant_id],
        )
        return bool(added)

    async def update_priorities(
        self, tenant_id: str, ids: Sequence[str], td_errors: Sequence[float] | NDArray[np.floating]
    ) -> None:
        """Set p = |TD error| + epsilon for the ids still stored (evicted ones are skipped).

        An id given twice (batches are drawn with replacement) keeps its last value.
        """
        errors = np.asarray(td_errors, dtype=np.float64)
        if errors.shape != (len(ids),):
            raise ValueError(f"{len(ids)} ids but td_errors of shape {errors.shape}")
        if not np.all(np.isfinite(errors)):
            raise ValueError("td_errors must be finite")
        if not ids:
            return
        priorities = np.abs(errors) + self.epsilon
        # XX: only members still present; eviction removes a trace and its priority together.
        mapping = {i: float(p) for i, p in zip(ids, priorities, strict=True)}
        await self._redis.zadd(_Keys(tenant_id).priorities, mapping, xx=True)

    async def mark_trained(self, tenant_id: str, upto: int) -> None:
        """Record that a training round covered the first `upto` traces ever added.

        Pass the `added_count` read *before* the round, so traces added during it stay pending.
        """
        await self._mark_trained(keys=[TRAINED_KEY], args=[tenant_id, int(upto)])

    async def delete_tenant(self, tenant_id: str) -> None:
        k = _Keys(tenant_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(k.traces, k.priorities, k.order, k.steps)
            pipe.hdel(ADDED_KEY, tenant_id)
            pipe.hdel(TRAINED_KEY, tenant_id)
            await pipe.execute()
        log.info("replay.tenant_deleted", tenant_id=tenant_id)

    # --- reading ------------------------------------------------------------------------------

    async def size(self, tenant_id: str) -> int:
        return int(await self._redis.hlen(_Keys(tenant_id).traces))

    async def added_count(self, tenant_id: str) -> int:
        """Traces ever added for the tenant (the `upto` of `mark_trained`)."""
        raw = await self._redis.hget(ADDED_KEY, tenant_id)
        return int(raw or 0)

    async def pending_tenants(self, min_traces: int = 1) -> dict[str, int]:
        """Tenants with traces added since their last `mark_trained`, holding >= min_traces,
        each with its `added_count` (what tells the trainer whether traces still arrive)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(ADDED_KEY)
            pipe.hgetall(TRAINED_KEY)
            added, trained = await pipe.execute()
        pending = {
            t.decode(): int(n) for t, n in sorted(added.items()) if int(n) > int(trained.get(t, 0))
        }
        if min_traces <= 1 or not pending:
            return pending
        async with self._redis.pipeline(transaction=False) as pipe:
            for t in pending:
                pipe.hlen(_Keys(t).traces)
            sizes = await pipe.execute()
        return {
            t: n for (t, n), size in zip(pending.items(), sizes, strict=True) if size >= min_traces
        }

    async def tool_sets(self, tenant_id: str) -> set[frozenset[str]]:
        """The distinct sets of steps the stored traces ran (what a model trained on them has
        seen done together)."""
        raws = await self._redis.hvals(_Keys(tenant_id).traces)
        return {frozenset(Trace.model_validate_json(raw).path) for raw in raws}

    async def newest(self, tenant_id: str, limit: int) -> list[Trace]:
        """The `limit` most recently added traces, oldest first."""
        k = _Keys(tenant_id)
        ids = await self._redis.lrange(k.order, -limit, -1) if limit > 0 else []
        if not ids:
            return []
        raws = await self._redis.hmget(k.traces, ids)
        return [Trace.model_validate_json(raw) for raw in raws if raw is not None]

    async def priorities(self, tenant_id: str) -> dict[str, float]:
        """Every stored trace's priority p (before the alpha exponent)."""
        return dict(await self._scores(_Keys(tenant_id)))

    def beta(self, step: int) -> float:
        """Importance exponent at `step`: beta0 -> 1 linearly over `beta_steps`, then 1."""
        return self.beta0 + (1.0 - self.beta0) * min(step / self.beta_steps, 1.0)

    async def sample(self, tenant_id: str, batch_size: int, rng: np.random.Generator) -> Sample:
        """Draw `batch_size` traces with replacement, P(i) ∝ p_i^alpha, with their weights.

        An empty buffer gives an empty sample and does not advance the beta schedule.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        k = _Keys(tenant_id)
        for _ in range(_SAMPLE_ATTEMPTS):
            rows = await self._scores(k)
            if not rows:
                return _empty_sample(self.beta0)
            all_ids = [trace_id for trace_id, _ in rows]
            probs = _probabilities(np.array([p for _, p in rows], dtype=np.float64), self.alpha)
            picks = rng.choice(len(all_ids), size=batch_size, replace=True, p=probs)
            traces = await self._load(k, [all_ids[i] for i in picks])
            if traces is not None:
                break
        else:
            raise RuntimeError(f"replay buffer of {tenant_id!r} changed under every sample try")
        step = int(await self._redis.incr(k.steps)) - 1
        beta = self.beta(step)
        chosen = probs[picks]
        return Sample(
            traces=traces,
            ids=[t.trace_id for t in traces],
            probabilities=chosen,
            weights=importance_weights(chosen, len(all_ids), beta),
            beta=beta,
            step=step,
        )

    async def _load(self, k: _Keys, ids: list[str]) -> list[Trace] | None:
        """Traces of `ids` in order, or None when one was evicted since it was drawn."""
        unique = list(dict.fromkeys(ids))
        raws = await self._redis.hmget(k.traces, unique)
        by_id: dict[str, Trace] = {}
        for trace_id, raw in zip(unique, raws, strict=True):
            if raw is None:
                return None
            by_id[trace_id] = Trace.model_validate_json(raw)
        return [by_id[i] for i in ids]

    async def _scores(self, k: _Keys) -> list[tuple[str, float]]:
        """(trace id, priority) of every stored trace, oldest first: the sorted set orders
        equal priorities by id, and ids are random, so sampling in that order would make the
        same seed draw other traces each time a stream is replayed."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zrange(k.priorities, 0, -1, withscores=True)
            pipe.lrange(k.order, 0, -1)
            rows, order = await pipe.execute()
        scores = {member.decode(): float(score) for member, score in rows}
        return [(i, scores[i]) for i in (raw.decode() for raw in order) if i in scores]


def importance_weights(
    probabilities: NDArray[np.float64], n: int, beta: float
) -> NDArray[np.float64]:
    """w_i = (n * P(i))^-beta, divided by the largest so that max w = 1."""
    weights = np.power(n * probabilities, -beta)
    return np.asarray(weights / weights.max(), dtype=np.float64)


def _probabilities(priorities: NDArray[np.float64], alpha: float) -> NDArray[np.float64]:
    scaled = np.power(priorities, alpha)
    return np.asarray(scaled / scaled.sum(), dtype=np.float64)


def _empty_sample(beta: float) -> Sample:
    empty = np.zeros(0, dtype=np.float64)
    return Sample(traces=[], ids=[], probabilities=empty, weights=empty, beta=beta, step=-1)


def traces_key(tenant_id: str) -> str:
    """The hash of the tenant's stored traces (the hold-back script checks membership in it)."""
    return _Keys(tenant_id).traces


class _Keys:
    def __init__(self, tenant_id: str) -> None:
        if not tenant_id:
            raise ValueError("tenant_id must not be empty")
        self.traces = redis_keys.replay(tenant_id, "traces")
        self.priorities = redis_keys.replay(tenant_id, "priorities")
        self.order = redis_keys.replay(tenant_id, "order")
        self.steps = redis_keys.replay(tenant_id, "steps")
