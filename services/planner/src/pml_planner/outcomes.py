"""What became of the planner's suggestions: the evidence adaptive thresholds learn from.

Every accepted suggestion is remembered for a day under its tenant and intent (Redis hash
`pml:planner:suggestions:{tenant}`, field `<sha256 of the intent>:<kind>`). When an execution
with the same intent completes, each remembered suggestion gets an outcome and is forgotten:

- next step: **success** when the suggested tool ran and succeeded, **failure** when it ran and
  failed, **ignored** when it did not run;
- DAG: **success** when the run succeeded and ran at least half of the suggested tools,
  **failure** when it failed having run at least half of them, else **ignored**.
"""

from __future__ import annotations

import hashlib
import json

import redis.asyncio as aioredis

from pml_common import redis_keys
from pml_common.events import ExecutionCompleted
from pml_planner.thresholds import Outcome, RedisThresholdStore

MEMORY_TTL_S = 24 * 3600


def _field(intent: str, kind: str) -> str:
    return f"{hashlib.sha256(intent.strip().encode()).hexdigest()}:{kind}"


class SuggestionMemory:
    def __init__(self, redis: aioredis.Redis, thresholds: RedisThresholdStore) -> None:
        self._redis = redis
        self._thresholds = thresholds

    async def remember(
        self, tenant: str, intent: str, kind: str, context: str, confidence: float, tools: list[str]
    ) -> None:
        key = redis_keys.planner_suggestions(tenant)
        record = json.dumps({"context": context, "confidence": confidence, "tools": tools})
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, _field(intent, kind), record)
            pipe.expire(key, MEMORY_TTL_S)
            await pipe.execute()

    async def forget_tenant(self, tenant: str) -> None:
        """Drop the tenant's remembered suggestions and the thresholds they taught."""
        await self._redis.delete(redis_keys.planner_suggestions(tenant))
        await self._thresholds.delete_tenant(tenant)

    async def learn(self, event: ExecutionCompleted) -> list[tuple[str, Outcome]]:
        """Give the suggestions made for this intent their outcome; returns what was learned."""
        key = redis_keys.planner_suggestions(event.tenant_id)
        learned: list[tuple[str, Outcome]] = []
        for kind in ("next", "dag"):
            field = _field(event.intent, kind)
            raw = await self._redis.hget(key, field)  # type: ignore[misc, unused-ignore]
            if raw is None or not await self._redis.hdel(key, field):  # type: ignore[misc, unused-ignore]
                continue  # nothing suggested, or another replica took it
            record = json.loads(raw)
            outcome = outcome_of(kind, record["tools"], event)
            await self._thresholds.update(
                event.tenant_id, record["context"], float(record["confidence"]), outcome
            )
            learned.append((record["context"], outcome))
        return learned


def outcome_of(kind: str, suggested: list[str], event: ExecutionCompleted) -> Outcome:
    ran = {step.node_id: step.success for step in event.steps}
    if kind == "next":
        tool = suggested[0] if suggested else None
        if tool not in ran:
            return "ignored"
        return "success" if ran[tool] else "failure"
    followed = sum(1 for t in suggested if t in ran)
    if not suggested or followed * 2 < len(suggested):
        return "ignored"
    return "success" if event.outcome == "success" else "failure"
