"""Held-back executions on the real Redis: every 5th is held, redelivery takes the same road,
and a full set releases its oldest into the replay buffer."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from pml_common.settings import Settings
from pml_common.stores import redis_client
from pml_trainer.holdout import HoldOut
from pml_trainer.replay_buffer import ReplayBuffer, Trace


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    redis = redis_client(settings)
    yield redis
    await redis.aclose()


def _trace(i: int) -> Trace:
    return Trace(trace_id=f"e{i}", intent=f"intent {i}", path=["a:b"], outcome=1.0)


async def _keep(holdout: HoldOut, replay: ReplayBuffer, tenant: str, trace: Trace) -> bool:
    """What the trainer's handler does with a trace; returns whether it was held back."""
    held, released = await holdout.route(tenant, trace)
    for old in [*released, *([] if held else [trace])]:
        await replay.add(tenant, old)
    return held


async def test_every_fifth_execution_is_held_back_once(client: aioredis.Redis, tenant: str) -> None:
    holdout, replay = HoldOut(client, every=5, capacity=10), ReplayBuffer(client, capacity=100)
    held = [i for i in range(1, 13) if await _keep(holdout, replay, tenant, _trace(i))]
    assert held == [5, 10]
    # redelivered executions take the road they took the first time, and count nothing
    assert await _keep(holdout, replay, tenant, _trace(5))
    assert not await _keep(holdout, replay, tenant, _trace(6))
    assert [t.trace_id for t in await holdout.recent(tenant)] == ["e5", "e10"]
    assert await replay.size(tenant) == 10
    # the count did not move: the 15th distinct execution is the next one held back
    assert [await _keep(holdout, replay, tenant, _trace(i)) for i in (13, 14, 15)] == [
        False,
        False,
        True,
    ]


async def test_a_full_set_releases_its_oldest_into_the_replay_buffer(
    client: aioredis.Redis, tenant: str
) -> None:
    holdout, replay = HoldOut(client, every=2, capacity=2), ReplayBuffer(client, capacity=100)
    for i in range(1, 9):
        await _keep(holdout, replay, tenant, _trace(i))
    # held: 2, 4, 6, 8; the set keeps the 2 most recent, 2 and 4 went on to be learned
    assert [t.trace_id for t in await holdout.recent(tenant)] == ["e6", "e8"]
    assert set(await replay.priorities(tenant)) == {"e1", "e2", "e3", "e4", "e5", "e7"}
    await holdout.delete_tenant(tenant)
    assert await holdout.recent(tenant) == []
