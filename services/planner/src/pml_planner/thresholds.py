"""Adaptive thresholds (ADR-038 §4.1, ADR-008 in spirit): the decision layer of the planner.

A method's score is raw; a suggestion is returned only when its confidence is at least the
threshold of its context, `"<method>:<kind>"` (e.g. `drdsp:next`, `drdsp:dag`, `legacy:next`,
`discovery:capability`). Each context learns its own threshold from the outcomes of the
suggestions it made:

- **failure** (the suggestion was followed and failed) at confidence c: the threshold moves up
  toward c + `margin` by an exponential moving average with rate `failure_rate` (0.2). The
  target is above c, not c itself: a threshold that only reached c would keep accepting c, and
  repeated failures at c must end up rejecting it.
- **ignored** (the agent did something else): the same move with `ignored_rate` (0.1). Ignoring
  is weaker evidence than failing (the agent may have had reasons of its own), so it counts half.
- **success** (followed and succeeded): the threshold moves down toward `minimum` with the slow
  rate `success_rate` (0.05). It pulls toward the floor whatever c was, because suggestions
  below the threshold are never shown and so can never succeed: without this drift a threshold
  could only ever rise. Failures and ignores move it up 4× and 2× faster, so it settles where
  they balance the successes.

Neither kind of move ever goes the "wrong" way (a failure never lowers the threshold, a success
never raises it), and every threshold stays in [`minimum`, `maximum`] = [0.3, 0.9], starting at
`initial` = 0.5. Confidences above 1 (the legacy heuristic reaches 1.1, discovery 1.5) are
valid and pass any threshold; targets are clipped to `maximum`.

State. One small pydantic `ThresholdState` per context (threshold and outcome counters),
serialised to JSON. `RedisThresholdStore` keeps every context of a tenant in one hash,
`redis_keys.planner_thresholds(tenant)` → field `context`, so tenants are isolated by key and
deleting a tenant is one DEL. Updates are read → compute in Python → compare-and-set in a Lua
script, retried on a conflict: concurrent planner replicas never lose an update, and the rule
lives only here.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, Field, model_validator

from pml_common import redis_keys

INITIAL_THRESHOLD = 0.5
MIN_THRESHOLD = 0.3
MAX_THRESHOLD = 0.9
FAILURE_RATE = 0.2
IGNORED_RATE = 0.1
SUCCESS_RATE = 0.05
#: How far above a failed confidence the threshold aims.
FAILURE_MARGIN = 0.05

#: Compare-and-set attempts before giving up; each round of a contention has one winner, so
#: this bounds the number of writers racing on one context, far above what a planner runs.
CAS_ATTEMPTS = 100
#: Upper bound of the random pause after a lost compare-and-set, to spread the retries.
CAS_BACKOFF_S = 0.002

Outcome = Literal["success", "failure", "ignored"]
OUTCOMES: tuple[Outcome, ...] = ("success", "failure", "ignored")

_CONTEXT = re.compile(r"^[a-z0-9_\-]+:[a-z0-9_\-]+$")


def context_key(method: str, kind: str) -> str:
    """`"<method>:<kind>"`, validated (lowercase letters, digits, `_`, `-`)."""
    return validate_context(f"{method}:{kind}")


def validate_context(context: str) -> str:
    if not _CONTEXT.match(context):
        raise ValueError(
            f"threshold context {context!r} must be '<method>:<kind>' "
            "(lowercase letters, digits, '_' or '-'), e.g. 'drdsp:next'"
        )
    return context


class ThresholdPolicy(BaseModel):
    """The constants of the rule; the defaults are the module's documented values."""

    model_config = ConfigDict(frozen=True)

    initial: float = INITIAL_THRESHOLD
    minimum: float = Field(default=MIN_THRESHOLD, ge=0.0, le=1.0)
    maximum: float = Field(default=MAX_THRESHOLD, ge=0.0, le=1.0)
    failure_rate: float = Field(default=FAILURE_RATE, gt=0.0, le=1.0)
    ignored_rate: float = Field(default=IGNORED_RATE, gt=0.0, le=1.0)
    success_rate: float = Field(default=SUCCESS_RATE, gt=0.0, le=1.0)
    margin: float = Field(default=FAILURE_MARGIN, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _ordered(self) -> ThresholdPolicy:
        if not self.minimum <= self.initial <= self.maximum:
            raise ValueError(
                f"need minimum ≤ initial ≤ maximum, got {self.minimum}, {self.initial}, "
                f"{self.maximum}"
            )
        return self

    def clamp(self, value: float) -> float:
        return min(max(value, self.minimum), self.maximum)


DEFAULT_POLICY = ThresholdPolicy()


class ThresholdState(BaseModel):
    """The learned threshold of one context and the outcomes it was learned from."""

    context: str
    threshold: float = Field(ge=0.0, le=1.0)
    successes: int = Field(default=0, ge=0)
    failures: int = Field(default=0, ge=0)
    ignored: int = Field(default=0, ge=0)
    updated_at: datetime | None = None

    @property
    def observations(self) -> int:
        return self.successes + self.failures + self.ignored

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, raw: str | bytes) -> ThresholdState:
        return cls.model_validate_json(raw)


def initial_state(context: str, policy: ThresholdPolicy = DEFAULT_POLICY) -> ThresholdState:
    return ThresholdState(context=validate_context(context), threshold=policy.initial)


@dataclass(frozen=True)
class Decision:
    """Whether a suggestion passes its context's threshold, and why, in words."""

    accepted: bool
    context: str
    confidence: float
    threshold: float
    reason: str


def decide(state: ThresholdState, confidence: float) -> Decision:
    """Accept when `confidence ≥ threshold`; the reason names both values and the context."""
    _check_confidence(confidence)
    accepted = confidence >= state.threshold
    relation = "is at or above" if accepted else "is below"
    reason = (
        f"confidence {confidence:.3f} {relation} the threshold {state.threshold:.3f} of "
        f"context {state.context!r}"
    )
    if not accepted:
        reason += " (learned from " + _history(state) + "): suggestion withheld as too risky"
    return Decision(accepted, state.context, confidence, state.threshold, reason)


def update(
    state: ThresholdState,
    confidence: float,
    outcome: Outcome,
    policy: ThresholdPolicy = DEFAULT_POLICY,
    *,
    at: datetime | None = None,
) -> ThresholdState:
    """The state after one outcome of a suggestion made with `confidence` (module docstring)."""
    _check_confidence(confidence)
    t = state.threshold
    if outcome == "success":
        t = t + policy.success_rate * (policy.minimum - t)
        counts = {"successes": state.successes + 1}
    elif outcome in ("failure", "ignored"):
        rate = policy.failure_rate if outcome == "failure" else policy.ignored_rate
        target = min(confidence + policy.margin, policy.maximum)
        t = max(t, t + rate * (target - t))
        counts = (
            {"failures": state.failures + 1}
            if outcome == "failure"
            else {"ignored": state.ignored + 1}
        )
    else:
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
    return state.model_copy(
        update={"threshold": policy.clamp(t), "updated_at": at or datetime.now(UTC), **counts}
    )


def _check_confidence(confidence: float) -> None:
    if not math.isfinite(confidence) or confidence < 0:
        raise ValueError(f"confidence must be a finite number ≥ 0, got {confidence}")


def _history(state: ThresholdState) -> str:
    return f"{state.successes} successes, {state.failures} failures, {state.ignored} ignored"


# --- Redis ----------------------------------------------------------------------------------

# KEYS: the tenant's hash; ARGV: context, expected JSON ('' when absent), new JSON.
# Sets the field only when it still holds what the caller read. Every update changes a counter,
# so a value never comes back to an earlier one (no ABA).
_COMPARE_AND_SET = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if (current or '') ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""


class ThresholdConflict(RuntimeError):
    """An update lost every compare-and-set attempt (pathological contention)."""


class RedisThresholdStore:
    """Thresholds of every tenant and context in Redis; safe across planner replicas."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        policy: ThresholdPolicy = DEFAULT_POLICY,
    ) -> None:
        self._redis = redis
        self.policy = policy
        self._cas = redis.register_script(_COMPARE_AND_SET)

    def key(self, tenant_id: str) -> str:
        if not tenant_id:
            raise ValueError("tenant_id must not be empty")
        return redis_keys.planner_thresholds(tenant_id)

    async def get(self, tenant_id: str, context: str) -> ThresholdState:
        """The context's state; the initial one when nothing was learned yet."""
        raw = await self._redis.hget(self.key(tenant_id), validate_context(context))
        return self._load(context, raw)

    async def all_contexts(self, tenant_id: str) -> dict[str, ThresholdState]:
        """Every context the tenant has learned, by context."""
        rows: dict[bytes | str, bytes | str] = await self._redis.hgetall(self.key(tenant_id))
        return {_text(k): ThresholdState.from_json(v) for k, v in rows.items()}

    async def decide(self, tenant_id: str, context: str, confidence: float) -> Decision:
        return decide(await self.get(tenant_id, context), confidence)

    async def update(
        self, tenant_id: str, context: str, confidence: float, outcome: Outcome
    ) -> ThresholdState:
        """Applies one outcome atomically with respect to every other writer; the new state."""
        key = self.key(tenant_id)
        validate_context(context)
        for _ in range(CAS_ATTEMPTS):
            raw = await self._redis.hget(key, context)
            state = update(self._load(context, raw), confidence, outcome, self.policy)
            expected: bytes | str = b"" if raw is None else raw
            if await self._cas(keys=[key], args=[context, expected, state.to_json()]):
                return state
            # Jitter, not security: spreads the losers so they do not collide again in step.
            await asyncio.sleep(random.uniform(0.0, CAS_BACKOFF_S))
        raise ThresholdConflict(
            f"threshold {context!r} of tenant {tenant_id!r} not updated: "
            f"{CAS_ATTEMPTS} concurrent writers won every attempt"
        )

    async def delete_tenant(self, tenant_id: str) -> None:
        await self._redis.delete(self.key(tenant_id))

    def _load(self, context: str, raw: bytes | str | None) -> ThresholdState:
        if raw is None:
            return initial_state(context, self.policy)
        state = ThresholdState.from_json(raw)
        # A policy narrowed since the state was written applies at once, not after an update.
        return state.model_copy(update={"threshold": self.policy.clamp(state.threshold)})


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
