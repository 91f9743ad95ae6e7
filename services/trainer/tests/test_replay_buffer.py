from __future__ import annotations

import numpy as np
import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from pml_common.settings import Settings
from pml_common.stores import redis_client
from pml_trainer.replay_buffer import ReplayBuffer, Trace, importance_weights

# Chi-square critical value for 3 degrees of freedom at p = 0.001.
CHI2_3DOF_P001 = 16.27


@pytest.fixture
def buffer(redis: aioredis.Redis) -> ReplayBuffer:
    return ReplayBuffer(redis, capacity=100)


def trace(n: int, outcome: float = 1.0) -> Trace:
    return Trace(
        trace_id=f"t{n}", intent=f"intent {n}", path=[f"srv:tool{n}", "srv:end"], outcome=outcome
    )


async def fill(buffer: ReplayBuffer, tenant: str, count: int) -> None:
    for n in range(count):
        assert await buffer.add(tenant, trace(n))


async def test_trace_validates() -> None:
    with pytest.raises(ValidationError):
        Trace(trace_id="x", intent="i", path=[], outcome=1.5)
    with pytest.raises(ValidationError):
        Trace(trace_id="", intent="i", path=[], outcome=0.5)


async def test_survives_a_restart(buffer: ReplayBuffer, settings: Settings, tenant: str) -> None:
    await fill(buffer, tenant, 3)
    await buffer.update_priorities(tenant, ["t0", "t1"], [0.5, -2.0])
    first = await buffer.sample(tenant, 4, np.random.default_rng(0))

    fresh = redis_client(settings)  # a new process: new client, new buffer object
    try:
        restarted = ReplayBuffer(fresh, capacity=100)
        assert await restarted.size(tenant) == 3
        assert await restarted.priorities(tenant) == await buffer.priorities(tenant)
        assert await restarted.priorities(tenant) == pytest.approx(
            {"t0": 0.51, "t1": 2.01, "t2": 1.0}
        )
        again = await restarted.sample(tenant, 4, np.random.default_rng(0))
        assert again.ids == first.ids
        assert again.traces == first.traces
        assert again.step == first.step + 1  # the beta schedule carries on
    finally:
        await fresh.aclose()


async def test_evicts_the_oldest_beyond_capacity(redis: aioredis.Redis, tenant: str) -> None:
    buffer = ReplayBuffer(redis, capacity=3)
    await fill(buffer, tenant, 5)
    assert await buffer.size(tenant) == 3
    assert set(await buffer.priorities(tenant)) == {"t2", "t3", "t4"}
    sample = await buffer.sample(tenant, 50, np.random.default_rng(1))
    assert set(sample.ids) == {"t2", "t3", "t4"}
    # An evicted id is new again if it comes back.
    assert await buffer.add(tenant, trace(0))
    assert set(await buffer.priorities(tenant)) == {"t3", "t4", "t0"}


async def test_add_is_idempotent(buffer: ReplayBuffer, tenant: str) -> None:
    assert await buffer.add(tenant, trace(1, outcome=1.0)) is True
    assert await buffer.add(tenant, trace(1, outcome=0.0)) is False
    assert await buffer.size(tenant) == 1
    assert await buffer.added_count(tenant) == 1
    sample = await buffer.sample(tenant, 1, np.random.default_rng(0))
    assert sample.traces[0].outcome == 1.0  # the first version is kept


async def test_new_trace_gets_the_current_max_priority(buffer: ReplayBuffer, tenant: str) -> None:
    await buffer.add(tenant, trace(0))
    assert await buffer.priorities(tenant) == {"t0": 1.0}
    await buffer.update_priorities(tenant, ["t0"], [2.99])
    await buffer.add(tenant, trace(1))
    assert await buffer.priorities(tenant) == pytest.approx({"t0": 3.0, "t1": 3.0})
    await buffer.update_priorities(tenant, ["t0", "t1"], [0.19, 0.39])
    await buffer.add(tenant, trace(2))
    assert (await buffer.priorities(tenant))["t2"] == pytest.approx(0.4)


async def test_priority_is_abs_td_plus_epsilon(redis: aioredis.Redis, tenant: str) -> None:
    buffer = ReplayBuffer(redis, capacity=10, epsilon=0.05)
    await fill(buffer, tenant, 3)
    await buffer.update_priorities(tenant, ["t0", "t1", "t2"], np.array([0.0, -0.5, 0.25]))
    assert await buffer.priorities(tenant) == pytest.approx({"t0": 0.05, "t1": 0.55, "t2": 0.3})
    # Sampling never starves the zero-error trace.
    sample = await buffer.sample(tenant, 2000, np.random.default_rng(3))
    assert "t0" in sample.ids


async def test_update_skips_evicted_ids_and_rejects_bad_input(
    redis: aioredis.Redis, tenant: str
) -> None:
    buffer = ReplayBuffer(redis, capacity=2)
    await fill(buffer, tenant, 3)  # t0 evicted
    await buffer.update_priorities(tenant, ["t0", "t2"], [5.0, 1.0])
    assert await buffer.priorities(tenant) == pytest.approx({"t1": 1.0, "t2": 1.01})
    assert await buffer.size(tenant) == 2
    with pytest.raises(ValueError):
        await buffer.update_priorities(tenant, ["t1"], [1.0, 2.0])
    with pytest.raises(ValueError):
        await buffer.update_priorities(tenant, ["t1"], [float("nan")])


async def test_sampling_frequencies_follow_p_alpha(buffer: ReplayBuffer, tenant: str) -> None:
    await fill(buffer, tenant, 4)
    ids = ["t0", "t1", "t2", "t3"]
    priorities = np.array([0.1, 0.5, 1.0, 2.0])
    await buffer.update_priorities(tenant, ids, priorities - buffer.epsilon)
    expected = priorities**0.6 / (priorities**0.6).sum()

    rng = np.random.default_rng(42)
    counts = dict.fromkeys(ids, 0)
    for _ in range(100):
        sample = await buffer.sample(tenant, 200, rng)
        for trace_id, p in zip(sample.ids, sample.probabilities, strict=True):
            counts[trace_id] += 1
            assert p == pytest.approx(expected[ids.index(trace_id)])
    observed = np.array([counts[i] for i in ids])
    draws = observed.sum()
    chi2 = float((((observed - draws * expected) ** 2) / (draws * expected)).sum())
    print(
        f"observed {observed.tolist()}, expected {(draws * expected).round().tolist()}, chi2 {chi2:.2f}"
    )
    assert chi2 < CHI2_3DOF_P001
    # Sanity: the test can tell p^alpha from p itself and from uniform.
    for wrong in (priorities / priorities.sum(), np.full(4, 0.25)):
        wrong_chi2 = float((((observed - draws * wrong) ** 2) / (draws * wrong)).sum())
        assert wrong_chi2 > 10 * CHI2_3DOF_P001


async def test_a_seeded_sample_follows_the_order_traces_arrived_in_not_their_ids(
    buffer: ReplayBuffer, tenant: str
) -> None:
    """Replayed with other (random) event ids, the same executions and seed draw the same."""
    drawn = []
    for name, ids in (("a", range(10)), ("b", range(9, -1, -1))):
        for position, n in enumerate(ids):
            again = trace(n).model_copy(update={"intent": f"execution {position}"})
            assert await buffer.add(f"{tenant}-{name}", again)
        sample = await buffer.sample(f"{tenant}-{name}", 16, np.random.default_rng(3))
        drawn.append([t.intent for t in sample.traces])
    assert drawn[0] == drawn[1]
    assert len(set(drawn[0])) > 1


async def test_importance_weights(redis: aioredis.Redis, tenant: str) -> None:
    buffer = ReplayBuffer(redis, capacity=10, alpha=0.7, beta0=0.5, beta_steps=10)
    await fill(buffer, tenant, 5)
    ids = [f"t{n}" for n in range(5)]
    priorities = np.array([0.05, 0.2, 0.4, 0.8, 3.0])
    await buffer.update_priorities(tenant, ids, priorities - buffer.epsilon)
    probs = priorities**0.7 / (priorities**0.7).sum()

    sample = await buffer.sample(tenant, 64, np.random.default_rng(7))
    assert sample.beta == 0.5
    assert len(set(sample.ids)) > 1  # weights must differ inside the batch
    p = np.array([probs[ids.index(i)] for i in sample.ids])
    np.testing.assert_allclose(sample.probabilities, p)
    raw = (5 * p) ** -0.5
    np.testing.assert_allclose(sample.weights, raw / raw.max())
    assert sample.weights.max() == pytest.approx(1.0)
    assert np.all(sample.weights <= 1.0)
    # The rarest trace in the batch carries weight 1, the most likely the smallest weight.
    assert sample.weights[np.argmin(p)] == pytest.approx(1.0)
    assert sample.weights[np.argmax(p)] == pytest.approx(sample.weights.min())

    # Against the formula with numbers worked by hand: N = 2, P = (0.2, 0.8), beta = 1.
    np.testing.assert_allclose(
        importance_weights(np.array([0.2, 0.8]), 2, 1.0), [1.0, (1 / 1.6) / (1 / 0.4)]
    )


async def test_beta_anneals_to_one(redis: aioredis.Redis, tenant: str) -> None:
    buffer = ReplayBuffer(redis, capacity=10, beta0=0.4, beta_steps=4)
    await fill(buffer, tenant, 2)
    rng = np.random.default_rng(0)
    samples = [await buffer.sample(tenant, 4, rng) for _ in range(7)]
    assert [s.step for s in samples] == list(range(7))
    assert [s.beta for s in samples] == pytest.approx([0.4, 0.55, 0.7, 0.85, 1.0, 1.0, 1.0])
    # With beta = 1 the weights fully undo the non-uniform sampling.
    last = samples[-1]
    np.testing.assert_allclose(
        last.weights, (1 / last.probabilities) / (1 / last.probabilities).max()
    )


async def test_empty_buffer_gives_an_empty_sample(buffer: ReplayBuffer, tenant: str) -> None:
    sample = await buffer.sample(tenant, 8, np.random.default_rng(0))
    assert len(sample) == 0
    assert sample.beta == buffer.beta0
    await buffer.add(tenant, trace(0))
    assert (await buffer.sample(tenant, 1, np.random.default_rng(0))).step == 0


async def test_tenants_are_isolated(buffer: ReplayBuffer, tenant: str) -> None:
    other = f"{tenant}-other"
    await fill(buffer, tenant, 3)
    assert await buffer.add(other, trace(0))  # same trace id, other tenant: a new trace
    await buffer.update_priorities(other, ["t0"], [7.0])
    assert await buffer.size(other) == 1
    assert (await buffer.priorities(tenant))["t0"] == 1.0

    await buffer.delete_tenant(tenant)
    assert await buffer.size(tenant) == 0
    assert await buffer.priorities(tenant) == {}
    assert await buffer.size(other) == 1
    pending = await buffer.pending_tenants()
    assert other in pending and tenant not in pending


async def test_pending_tenants_keep_traces_added_during_training(
    buffer: ReplayBuffer, tenant: str
) -> None:
    other = f"{tenant}-other"
    assert tenant not in await buffer.pending_tenants()
    await fill(buffer, tenant, 2)
    await buffer.add(other, trace(0))
    assert {tenant, other} <= set(await buffer.pending_tenants())
    assert tenant in await buffer.pending_tenants(min_traces=2)
    assert other not in await buffer.pending_tenants(min_traces=2)

    upto = await buffer.added_count(tenant)  # a training round starts from here
    await buffer.add(tenant, trace(2))  # arrives while it runs
    await buffer.mark_trained(tenant, upto)
    assert tenant in await buffer.pending_tenants()  # not forgotten

    await buffer.mark_trained(tenant, await buffer.added_count(tenant))
    assert tenant not in await buffer.pending_tenants()
    await buffer.mark_trained(tenant, 1)  # a late, older round does not move the mark back
    assert tenant not in await buffer.pending_tenants()
    assert await buffer.add(tenant, trace(1)) is False  # a duplicate is not new
    assert tenant not in await buffer.pending_tenants()
    assert await buffer.add(tenant, trace(3))
    assert tenant in await buffer.pending_tenants()


async def test_tool_sets_are_the_distinct_sets_of_steps_stored(
    buffer: ReplayBuffer, tenant: str
) -> None:
    assert await buffer.tool_sets(tenant) == set()
    for n, path in enumerate((["a", "b"], ["b", "a"], ["c"], ["a", "b", "a"])):
        await buffer.add(tenant, Trace(trace_id=f"t{n}", intent="x", path=path, outcome=1.0))
    assert await buffer.tool_sets(tenant) == {frozenset({"a", "b"}), frozenset({"c"})}
    assert await buffer.tool_sets(f"{tenant}-other") == set()
