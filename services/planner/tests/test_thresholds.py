"""Adaptive thresholds (ADR-038 §4.1): the rule, its bounds, and the Redis store."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from redis.asyncio import Redis

from pml_common.settings import Settings
from pml_common.stores import redis_client
from pml_planner.thresholds import (
    FAILURE_MARGIN,
    FAILURE_RATE,
    IGNORED_RATE,
    INITIAL_THRESHOLD,
    MAX_THRESHOLD,
    MIN_THRESHOLD,
    OUTCOMES,
    SUCCESS_RATE,
    RedisThresholdStore,
    ThresholdPolicy,
    ThresholdState,
    context_key,
    decide,
    initial_state,
    update,
)

NEXT = "drdsp:next"


def test_documented_constants() -> None:
    assert (INITIAL_THRESHOLD, MIN_THRESHOLD, MAX_THRESHOLD) == (0.5, 0.3, 0.9)
    assert (FAILURE_RATE, IGNORED_RATE, SUCCESS_RATE, FAILURE_MARGIN) == (0.2, 0.1, 0.05, 0.05)


def test_decision_at_the_initial_threshold() -> None:
    state = initial_state(NEXT)
    assert state.threshold == 0.5
    assert decide(state, 0.5).accepted  # ≥, not >
    assert decide(state, 0.72).accepted
    assert not decide(state, 0.49).accepted


def test_a_rejection_carries_a_readable_reason() -> None:
    state = update(initial_state(NEXT), 0.6, "failure")
    decision = decide(state, 0.42)
    assert not decision.accepted
    assert (decision.confidence, decision.threshold, decision.context) == (0.42, 0.53, NEXT)
    assert decision.reason == (
        "confidence 0.420 is below the threshold 0.530 of context 'drdsp:next' "
        "(learned from 0 successes, 1 failures, 0 ignored): suggestion withheld as too risky"
    )
    accepted = decide(state, 0.9)
    assert accepted.reason.startswith("confidence 0.900 is at or above the threshold 0.530")


def test_one_step_of_each_outcome() -> None:
    state = initial_state(NEXT)
    # failure at 0.6: EMA toward 0.6 + margin = 0.65 at rate 0.2
    assert update(state, 0.6, "failure").threshold == pytest.approx(0.5 + 0.2 * 0.15)
    # ignored: the same move at half the rate
    assert update(state, 0.6, "ignored").threshold == pytest.approx(0.5 + 0.1 * 0.15)
    # success: slowly toward the floor
    assert update(state, 0.6, "success").threshold == pytest.approx(0.5 - 0.05 * 0.2)


def test_threshold_moves_up_after_failures_until_it_rejects_them() -> None:
    state = initial_state(NEXT)
    previous = state.threshold
    for _ in range(40):
        state = update(state, 0.6, "failure")
        assert state.threshold >= previous
        previous = state.threshold
    assert state.threshold == pytest.approx(0.65, abs=1e-3)
    assert not decide(state, 0.6).accepted  # repeated failures at 0.6 now reject 0.6
    assert state.failures == 40 and state.observations == 40


def test_threshold_moves_down_after_successes() -> None:
    state = initial_state(NEXT)
    for _ in range(5):
        state = update(state, 0.8, "failure")
    high = state.threshold
    for _ in range(10):
        lower = update(state, 0.8, "success")
        assert lower.threshold < state.threshold
        state = lower
    assert state.threshold < high
    assert high - state.threshold < 0.2  # slowly: ten successes undo less than five failures did
    assert state.successes == 10


def test_a_failure_below_the_threshold_never_lowers_it() -> None:
    state = update(initial_state(NEXT), 0.1, "failure")
    assert state.threshold == 0.5
    assert state.failures == 1


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=2.0, allow_nan=False), st.sampled_from(OUTCOMES)
        ),
        max_size=60,
    )
)
def test_threshold_stays_within_bounds(steps: list[tuple[float, str]]) -> None:
    state = initial_state(NEXT)
    for confidence, outcome in steps:
        state = update(state, confidence, outcome)  # type: ignore[arg-type]
        assert MIN_THRESHOLD <= state.threshold <= MAX_THRESHOLD


def test_bounds_are_reached_but_not_crossed() -> None:
    state = initial_state(NEXT)
    for _ in range(200):
        state = update(state, 1.1, "failure")  # the legacy heuristic's maximum score
    assert state.threshold == pytest.approx(MAX_THRESHOLD)
    for _ in range(2000):
        state = update(state, 0.95, "success")
    assert state.threshold == pytest.approx(MIN_THRESHOLD, abs=1e-6)
    assert state.threshold >= MIN_THRESHOLD


def test_json_round_trip() -> None:
    state = update(update(initial_state("legacy:next"), 0.7, "ignored"), 0.4, "success")
    again = ThresholdState.from_json(state.to_json())
    assert again == state
    assert ThresholdState.from_json(state.to_json().encode()) == state


def test_invalid_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="'<method>:<kind>'"):
        initial_state("drdsp next")
    with pytest.raises(ValueError, match="'<method>:<kind>'"):
        context_key("drdsp", "next:dag")
    assert context_key("drdsp", "dag") == "drdsp:dag"
    with pytest.raises(ValueError, match="confidence"):
        decide(initial_state(NEXT), math.nan)
    with pytest.raises(ValueError, match="confidence"):
        update(initial_state(NEXT), -0.1, "failure")
    with pytest.raises(ValueError, match="outcome"):
        update(initial_state(NEXT), 0.5, "maybe")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="minimum ≤ initial ≤ maximum"):
        ThresholdPolicy(initial=0.2)


def test_a_custom_policy() -> None:
    policy = ThresholdPolicy(initial=0.7, minimum=0.4, maximum=0.95, failure_rate=1.0)
    state = initial_state(NEXT, policy)
    assert state.threshold == 0.7
    assert update(state, 0.85, "failure", policy).threshold == pytest.approx(0.9)


# --- the Redis store, on the suite's real Redis ---------------------------------------------


@pytest.fixture
async def store(redis: Redis) -> RedisThresholdStore:
    return RedisThresholdStore(redis)


async def test_store_starts_at_the_initial_state(store: RedisThresholdStore, tenant: str) -> None:
    state = await store.get(tenant, NEXT)
    assert state == initial_state(NEXT)
    assert await store.all_contexts(tenant) == {}
    assert (await store.decide(tenant, NEXT, 0.4)).accepted is False


async def test_store_persists_updates_per_tenant_and_context(
    store: RedisThresholdStore, redis: Redis, tenant: str
) -> None:
    other = f"{tenant}-other"
    after = await store.update(tenant, NEXT, 0.6, "failure")
    assert after.threshold == pytest.approx(0.53)
    assert await store.get(tenant, NEXT) == after
    assert (await store.get(tenant, "drdsp:dag")).threshold == 0.5  # other context
    assert (await store.get(other, NEXT)).threshold == 0.5  # other tenant
    assert await store.all_contexts(tenant) == {NEXT: after}
    assert await redis.hexists(f"pml:planner:thresholds:{tenant}", NEXT)
    assert not (await store.decide(tenant, NEXT, 0.52)).accepted
    await store.delete_tenant(tenant)
    assert await store.get(tenant, NEXT) == initial_state(NEXT)


async def test_concurrent_updates_from_two_replicas_lose_nothing(
    settings: Settings, tenant: str
) -> None:
    clients = [redis_client(settings), redis_client(settings)]
    try:
        replicas = [RedisThresholdStore(c) for c in clients]
        await asyncio.gather(
            *(replicas[i % 2].update(tenant, NEXT, 0.8, "failure") for i in range(20))
        )
        state = await replicas[0].get(tenant, NEXT)
        assert state.failures == 20
        expected = initial_state(NEXT)
        for _ in range(20):
            expected = update(expected, 0.8, "failure")
        assert state.threshold == pytest.approx(expected.threshold)

        outcomes = ["success", "ignored", "failure", "success"] * 5
        await asyncio.gather(
            *(
                replicas[i % 2].update(tenant, "drdsp:dag", 0.7, outcome)  # type: ignore[arg-type]
                for i, outcome in enumerate(outcomes)
            )
        )
        dag = await replicas[1].get(tenant, "drdsp:dag")
        assert (dag.successes, dag.failures, dag.ignored) == (10, 5, 5)
        assert MIN_THRESHOLD <= dag.threshold <= MAX_THRESHOLD
    finally:
        for c in clients:
            await c.aclose()


async def test_store_applies_a_narrower_policy_to_stored_state(redis: Redis, tenant: str) -> None:
    wide = RedisThresholdStore(redis)
    for _ in range(30):
        await wide.update(tenant, NEXT, 1.0, "failure")
    narrow = RedisThresholdStore(redis, policy=ThresholdPolicy(maximum=0.7))
    assert (await narrow.get(tenant, NEXT)).threshold == 0.7


async def test_a_write_between_read_and_compare_and_set_is_retried_not_lost(
    redis: Redis, tenant: str
) -> None:
    store, rival = RedisThresholdStore(redis), RedisThresholdStore(redis)
    cas = store._cas
    calls = 0

    async def interleaved(*, keys: list[str], args: list[object]) -> object:
        # The first attempt read the state before the rival's write: it must lose and retry.
        nonlocal calls
        calls += 1
        if calls == 1:
            await rival.update(tenant, NEXT, 0.9, "ignored")
        return await cas(keys=keys, args=args)

    store._cas = interleaved  # type: ignore[assignment]
    await store.update(tenant, NEXT, 0.9, "failure")
    state = await store.get(tenant, NEXT)
    assert calls == 2
    assert (state.failures, state.ignored) == (1, 1)
