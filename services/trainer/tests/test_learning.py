"""Training rounds against the real Redis and Neo4j: what is learned, published, or refused."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from pml_common.embedding import Embedder, UseEmbedder
from pml_common.events import CapabilitySpec, Event, ToolSpec
from pml_common.lease_lock import LeaseLock
from pml_common.model_registry import ModelRegistry
from pml_common.settings import Settings
from pml_common.stores import redis_client
from pml_common.tool_graph import ToolGraph, read_tool_graph
from pml_shgat.gating import FRESHER_GROWTH, WEIGHT_GRID
from pml_shgat.hierarchy import Hierarchy
from pml_shgat.params import (
    Params,
    from_bytes,
    init_params,
    make_config,
    read_version,
    to_bytes,
)
from pml_shgat.serving import ServingModel
from pml_shgat.training import Batch, ShgatTrainer, StepStats, averaged_steps
from pml_trainer.graph_store import GraphStore
from pml_trainer.holdout import HoldOut
from pml_trainer.learning import LearningConfig, LearningLoop, RoundAbandoned
from pml_trainer.replay_buffer import ReplayBuffer, Trace

TOOLS = {
    "fs:read_file": "Read the complete contents of a file.",
    "fs:write_file": "Create or overwrite a file.",
    "s3:upload": "Upload an object to a storage bucket.",
    "s3:list": "List the objects of a bucket.",
    "mail:send": "Send an email message.",
    "cal:create_event": "Create a calendar event.",
    "web:search": "Search the web.",
    "web:fetch": "Fetch a web page.",
}
CAPABILITIES = [
    CapabilitySpec(id="backup", name="backup", tools=["fs:read_file", "s3:upload"]),
    CapabilitySpec(id="research", name="research", tools=["web:search", "web:fetch"]),
    CapabilitySpec(id="invite", name="invite", tools=["cal:create_event", "mail:send"]),
]
INTENTS = {
    "backup": ["keep my notes safe somewhere else", "make sure my diary survives a disk crash"],
    "research": ["find out what people say about rust", "gather material on solar panels"],
    "invite": ["get the team together on friday", "organise a meeting with alice"],
}


LEARNING = LearningConfig(
    batch_size=16, steps=40, min_traces=4, poll_s=0.1, key_dim=64, seed=0, min_holdout=2
)


class _Collector:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def publish(self, event: Event) -> str:
        self.events.append(event)
        return event.event_id


@dataclass
class Rig:
    redis: aioredis.Redis
    buffer: ReplayBuffer
    lock: LeaseLock
    registry: ModelRegistry
    holdout: HoldOut
    loop: LearningLoop
    published: _Collector
    embedder: Embedder


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return UseEmbedder()


@pytest.fixture
async def rig(
    settings: Settings, tenant: str, store: GraphStore, driver, embedder: Embedder
) -> AsyncIterator[Rig]:
    tools = [
        ToolSpec(id=t, server=t.split(":")[0], name=t.split(":")[1], description=d)
        for t, d in TOOLS.items()
    ]
    await store.register_tools(tenant, "e-tools", tools)
    for i, spec in enumerate(CAPABILITIES):
        await store.learn_capability(tenant, f"e-cap{i}", spec)
    redis = redis_client(settings)
    buffer = ReplayBuffer(redis, capacity=100)
    # generous: a loaded 2-core machine can hold the event loop for seconds between beats
    lock = LeaseLock(redis, name=f"pml:test:{tenant}:lock", lease_ms=10_000)
    registry = ModelRegistry(redis, keep_versions=3)
    holdout = HoldOut(redis)
    published = _Collector()
    loop = LearningLoop(
        buffer=buffer,
        lock=lock,
        registry=registry,
        driver=driver,
        database=settings.neo4j_database,
        embedder=embedder,
        publisher=published,
        config=LEARNING,
        holdout=holdout,
    )
    yield Rig(redis, buffer, lock, registry, holdout, loop, published, embedder)
    await redis.aclose()


def _parts(
    rig: Rig, settings: Settings, driver, embedder: Embedder, config: LearningConfig
) -> dict[str, Any]:
    """A loop's parts: the rig's stores, and `config`."""
    return {
        "buffer": rig.buffer,
        "lock": rig.lock,
        "registry": rig.registry,
        "driver": driver,
        "database": settings.neo4j_database,
        "embedder": embedder,
        "publisher": rig.published,
        "config": config,
        "holdout": rig.holdout,
    }


def _loop(
    rig: Rig, settings: Settings, driver, embedder: Embedder, config: LearningConfig
) -> LearningLoop:
    """A loop over the rig's stores with another configuration."""
    return LearningLoop(**_parts(rig, settings, driver, embedder, config))


async def _add_traces(rig: Rig, tenant: str) -> None:
    """Every intent learned; the backups, run again four times each, are held back: the first
    stage ranks reading the file, their first step, below writing it, so the executions' lesson
    shows there beyond the noise of a few executions (the other capabilities' first steps are
    the first stage's top tools already: held back, they would only say the correction ties
    it)."""
    spec = {c.id: c for c in CAPABILITIES}
    for cap, intents in INTENTS.items():
        for j, intent in enumerate(intents):
            trace = Trace(
                trace_id=f"{cap}-{j}",
                intent=intent,
                path=spec[cap].tools,
                outcome=1.0,
                capability_id=cap,
            )
            assert await rig.buffer.add(tenant, trace)
            for copy in range(4 if cap == "backup" else 0):
                again = trace.model_copy(update={"trace_id": f"{cap}-{j}-held-{copy}"})
                await rig.holdout.hold(tenant, again)


async def _capability_score(
    rig: Rig, driver, settings: Settings, tenant: str, params_blob: bytes | None
) -> float:
    graph = await read_tool_graph(driver, settings.neo4j_database, tenant, rig.embedder)
    h = Hierarchy.build(graph.tool_vectors, graph.capabilities, dim=rig.embedder.dim)
    if params_blob is None:
        config = make_config(h.dim, 64, h.num_nodes)
        params = init_params(config, h.features, h.num_levels)
    else:
        config, params = from_bytes(params_blob)
    model = ServingModel(config, params, h)
    intent = (await rig.embedder.embed_queries(["keep my notes safe somewhere else"]))[0]
    return model.node_scores(intent, ["backup"])[0]


async def test_a_round_learns_publishes_and_reprioritises(
    rig: Rig, tenant: str, driver, settings: Settings
) -> None:
    await _add_traces(rig, tenant)
    before = await _capability_score(rig, driver, settings, tenant, None)
    lease = await rig.lock.try_acquire()
    assert lease is not None
    async with rig.lock.hold(lease):
        record = await rig.loop.train_round(tenant, lease)
    assert record is not None and record.fencing_token == lease.token
    current = await rig.registry.current(tenant)
    assert current is not None and current[0].version == record.version
    after = await _capability_score(rig, driver, settings, tenant, current[1])
    assert after > before + 0.05, (before, after)
    # announced with its version and token
    [announcement] = rig.published.events
    assert announcement.type == "ModelPublished"
    assert announcement.model_version == record.version  # type: ignore[attr-defined]
    # TD errors replaced the initial max priority of the sampled traces
    priorities = await rig.buffer.priorities(tenant)
    assert any(abs(p - 1.0) > 1e-6 for p in priorities.values())
    assert (
        await rig.buffer.pending_tenants() == [] or tenant not in await rig.buffer.pending_tenants()
    )


async def test_a_rounds_training_follows_the_executions_its_model_has_not_learned_from(
    rig: Rig, tenant: str
) -> None:
    await _add_traces(rig, tenant)
    lease = await rig.lock.try_acquire()
    assert lease is not None
    async with rig.lock.hold(lease):
        first = await rig.loop.train_round(tenant, lease)
        assert first is not None and first.metrics["accepted"] == 1.0
        # two more executions: the next round starts from the served version and learns those
        for i in range(2):
            trace = Trace(
                trace_id=f"more-{i}", intent="back up my notes", path=["s3:upload"], outcome=1.0
            )
            assert await rig.buffer.add(tenant, trace)
        second = await rig.loop.train_round(tenant, lease)
    assert second is not None
    assert first.metrics["traces_seen"] == 6.0 and second.metrics["traces_seen"] == 8.0
    # draws_per_execution traces drawn for each execution the starting model had not seen
    draws, batch = LEARNING.draws_per_execution, LEARNING.batch_size
    assert first.metrics["steps"] == math.ceil(draws * 6 / batch)
    assert second.metrics["steps"] == math.ceil(draws * 2 / batch)
    assert second.metrics["steps"] < first.metrics["steps"] < LEARNING.steps


async def test_a_round_publishes_the_mean_of_its_last_iterates(
    rig: Rig, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    iterates: list[Params] = []
    step = ShgatTrainer.step

    def recorded(trainer: ShgatTrainer, batch: Batch) -> StepStats:
        stats = step(trainer, batch)
        iterates.append(trainer.params)
        return stats

    monkeypatch.setattr(ShgatTrainer, "step", recorded)
    await _add_traces(rig, tenant)
    lease = await rig.lock.try_acquire()
    assert lease is not None
    async with rig.lock.hold(lease):
        record = await rig.loop.train_round(tenant, lease)
    current = await rig.registry.current(tenant)
    assert record is not None and current is not None and current[0].version == record.version
    steps = int(record.metrics["steps"])
    assert len(iterates) == steps >= 4
    last = iterates[-averaged_steps(steps) :]
    _, published = from_bytes(current[1])
    for name, value in published.items():
        np.testing.assert_allclose(value, np.mean([p[name] for p in last], axis=0), atol=1e-9)
    assert not all(np.allclose(published[n], iterates[-1][n]) for n in published)


def test_a_round_runs_one_step_at_least_and_its_most_at_most() -> None:
    config = LearningConfig(batch_size=32, steps=30, draws_per_execution=15.0)
    assert config.round_steps(0) == 1
    assert config.round_steps(3) == 2
    assert config.round_steps(64) == 30
    assert config.round_steps(10_000) == 30


async def test_a_lost_lease_abandons_the_round_and_publishes_nothing(rig: Rig, tenant: str) -> None:
    await _add_traces(rig, tenant)
    lease = await rig.lock.try_acquire()
    assert lease is not None
    lease.lost.set()  # what the heartbeat does when a renewal is refused
    with pytest.raises(RoundAbandoned):
        await rig.loop.train_round(tenant, lease)
    assert await rig.registry.current(tenant) is None
    assert rig.published.events == []
    assert tenant in await rig.buffer.pending_tenants()


async def test_a_paused_trainer_cannot_publish_over_a_newer_token(
    rig: Rig, tenant: str, settings: Settings
) -> None:
    await _add_traces(rig, tenant)
    paused = await LeaseLock(rig.redis, name=rig.lock.name, lease_ms=2000).try_acquire()
    assert paused is not None
    # The paused trainer never renews (no heartbeat ran): its lease expires, another takes over.
    await asyncio.sleep(2.2)
    other = LeaseLock(rig.redis, name=rig.lock.name, lease_ms=2000)
    newer = await other.try_acquire()
    assert newer is not None and newer.token > paused.token
    # A process paused between its lease check and its publish still believes the lease holds.
    paused.expires_at = time.monotonic() + 60
    assert paused.held()
    with pytest.raises(RoundAbandoned, match="fencing"):
        await rig.loop.train_round(tenant, paused)  # paused.held() is still True locally
    assert await rig.registry.current(tenant) is None
    assert rig.published.events == []


async def test_the_loop_trains_pending_tenants_while_holding_the_lock(
    clean_stores: None, rig: Rig, tenant: str
) -> None:
    await _add_traces(rig, tenant)
    stop = asyncio.Event()
    task = asyncio.create_task(rig.loop.run(stop))
    try:
        for _ in range(1200):  # generous: a loaded 2-core machine can be slow
            if await rig.registry.current(tenant) is not None:
                break
            await asyncio.sleep(0.1)
        assert await rig.registry.current(tenant) is not None
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    # stopping released the lock
    assert await rig.redis.get(rig.lock.name) is None


async def test_the_loop_learns_a_burst_as_one_round(
    clean_stores: None, rig: Rig, tenant: str, settings: Settings, driver, embedder: Embedder
) -> None:
    """Executions arriving closer together than the quiet period are one round's: the first
    version learned them all, whenever the loop looked while they arrived."""
    quiet = replace(LEARNING, quiet_s=2.0, max_wait_s=120.0)
    loop = _loop(rig, settings, driver, embedder, quiet)
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        for i in range(12):  # more than min_traces long before the last one arrives
            trace = Trace(
                trace_id=f"burst-{i}", intent="keep my notes safe", path=["s3:upload"], outcome=1.0
            )
            assert await rig.buffer.add(tenant, trace)
            await asyncio.sleep(0.1)
        judged = None
        for _ in range(1200):
            judged = await rig.registry.current(tenant) or await rig.registry.last_rejected(tenant)
            if judged is not None:
                break
            await asyncio.sleep(0.1)
        assert judged is not None and judged[0].metrics["traces_seen"] == 12.0
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_seeded_round_trains_the_same_version_whatever_was_drawn_before(
    rig: Rig, tenant: str
) -> None:
    """A round's draws follow from the seed, the tenant and its executions: replaying the same
    executions after other rounds drew trains the same parameters."""

    async def replayed() -> bytes:
        await rig.registry.delete_tenant(tenant)
        await rig.buffer.delete_tenant(tenant)
        await rig.holdout.delete_tenant(tenant)
        await _add_traces(rig, tenant)
        lease = await rig.lock.try_acquire()
        assert lease is not None
        async with rig.lock.hold(lease):
            record = await rig.loop.train_round(tenant, lease)
        assert record is not None
        judged = await rig.registry.current(tenant) or await rig.registry.last_rejected(tenant)
        assert judged is not None and judged[0].version == record.version
        return judged[1]

    first = await replayed()
    again = await replayed()
    _, a = from_bytes(first)
    _, b = from_bytes(again)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


async def _register(store: GraphStore, tenant: str) -> None:
    tools = [
        ToolSpec(id=t, server=t.split(":")[0], name=t.split(":")[1], description=d)
        for t, d in TOOLS.items()
    ]
    await store.register_tools(tenant, f"e-tools-{tenant}", tools)


async def _add_executions(rig: Rig, tenant: str, count: int) -> None:
    spec = {c.id: c for c in CAPABILITIES}
    pairs = [(cap, intent) for cap, intents in INTENTS.items() for intent in intents]
    for i in range(count):
        cap, intent = pairs[i % len(pairs)]
        trace = Trace(trace_id=f"many-{i}", intent=intent, path=spec[cap].tools, outcome=1.0)
        assert await rig.buffer.add(tenant, trace)


async def _judged_version(rig: Rig, tenant: str) -> str | None:
    judged = await rig.registry.current(tenant) or await rig.registry.last_rejected(tenant)
    return judged[0].version if judged is not None else None


async def test_a_tenant_ready_during_another_tenants_long_round_is_trained_beside_it(
    clean_stores: None,
    rig: Rig,
    tenant: str,
    store: GraphStore,
    settings: Settings,
    driver,
    embedder: Embedder,
) -> None:
    """Rounds take turns step by step: a tenant whose few executions arrive while another
    tenant's long round runs gets its version before that round ends, not after it."""
    small = f"{tenant}-small"
    await _register(store, small)
    await _add_executions(rig, tenant, 100)  # 94 steps of 16 at 15 draws per execution
    loop = _loop(rig, settings, driver, embedder, replace(LEARNING, steps=200))
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = asyncio.create_task(loop.run(stop))
        try:
            for _ in range(1200):
                if any(e["event"] == "learning.round_started" for e in logs):
                    break
                await asyncio.sleep(0.05)
            assert [e["tenant"] for e in logs if e["event"] == "learning.round_started"] == [tenant]
            await _add_executions(rig, small, 4)  # 4 steps
            for _ in range(2400):
                if await _judged_version(rig, small) is not None:
                    break
                await asyncio.sleep(0.05)
            assert await _judged_version(rig, small) is not None
            assert await _judged_version(rig, tenant) is None, "the long round ended first"
            for _ in range(2400):
                if await _judged_version(rig, tenant) is not None:
                    break
                await asyncio.sleep(0.05)
            assert await _judged_version(rig, tenant) is not None
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)


async def test_a_tenant_whose_serving_model_is_unreadable_is_trained_anew(
    rig: Rig, tenant: str
) -> None:
    """Unreadable bytes in the registry are served as the first stage alone; the trainer
    starts from the untrained model instead of failing the tenant's every round."""
    lease = await rig.lock.try_acquire()
    assert lease is not None
    async with rig.lock.hold(lease):
        broken = await rig.registry.publish(tenant, b"not a model", lease.token, {})
        await _add_traces(rig, tenant)
        with capture_logs() as logs:
            record = await rig.loop.train_round(tenant, lease)
    assert record is not None and record.version > broken.version
    assert record.metrics["traces_seen"] == 6.0
    reset = [e for e in logs if e["event"] == "learning.model_reset"]
    assert reset and reset[0]["reason"].startswith("unreadable")


class _FailingFor(LearningLoop):
    """A loop whose rounds of one tenant fail on reading its graph (a fault injected)."""

    def __init__(self, broken: str, **parts: Any) -> None:
        super().__init__(**parts)
        self.broken = broken

    async def _graph(self, tenant: str) -> tuple[ToolGraph, Hierarchy]:
        if tenant == self.broken:
            raise RuntimeError(f"injected fault for {tenant}")
        return await super()._graph(tenant)


async def test_a_round_that_fails_does_not_stop_another_tenants_round(
    clean_stores: None,
    rig: Rig,
    tenant: str,
    store: GraphStore,
    settings: Settings,
    driver,
    embedder: Embedder,
) -> None:
    """A tenant whose round fails is logged and retried at a later pass; another pending tenant
    is still trained, in the same pass or the next."""
    broken = f"{tenant}-broken"
    await _register(store, broken)
    await _add_executions(rig, broken, 6)
    await _add_executions(rig, tenant, 6)
    loop = _FailingFor(broken, **_parts(rig, settings, driver, embedder, LEARNING))
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = asyncio.create_task(loop.run(stop))
        try:
            for _ in range(1200):
                retried = [e for e in logs if e["event"] == "learning.round_failed"]
                if await _judged_version(rig, tenant) is not None and len(retried) >= 2:
                    break
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
    assert await _judged_version(rig, tenant) is not None
    failed = [e for e in logs if e["event"] == "learning.round_failed"]
    assert len(failed) >= 2 and {e["tenant"] for e in failed} == {broken}
    assert "injected fault" in failed[0]["error"]
    assert await rig.buffer.pending_tenants(LEARNING.min_traces) == {broken: 6}


# --- the gate: a version is served only if it ranks held-back executions better -------------

#: Held-back executions whose words point elsewhere than the tools they used, so that the first
#: stage ranks them poorly and only a model that learned these users can do better.
SHIFTED = {"backup": "research", "research": "invite", "invite": "backup"}


async def _gate_situation(
    rig: Rig, driver, settings: Settings, tenant: str
) -> tuple[ToolGraph, Hierarchy, bytes, bytes]:
    """Held-back executions, the graph and its hierarchy, and two candidates: one that maps every
    held-back intent onto the tools it used (knows these users), one onto other tools."""
    spec = {c.id: c for c in CAPABILITIES}
    for cap, intents in INTENTS.items():
        for j, intent in enumerate(intents):
            used = spec[SHIFTED[cap]].tools
            trace = Trace(trace_id=f"held-{cap}-{j}", intent=intent, path=used, outcome=1.0)
            await rig.holdout.hold(tenant, trace)
    graph = await read_tool_graph(driver, settings.neo4j_database, tenant, rig.embedder)
    h = Hierarchy.build(graph.tool_vectors, graph.capabilities, dim=rig.embedder.dim)
    config = make_config(h.dim, 64, h.num_nodes)
    initial = init_params(config, h.features, h.num_levels)
    texts = [i for intents in INTENTS.values() for i in intents]
    queries = np.asarray(await rig.embedder.embed_queries(texts), dtype=np.float64)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    targets = np.asarray(
        [
            h.features[[h.node_index(t) for t in spec[SHIFTED[cap]].tools]].mean(axis=0)
            for cap, intents in INTENTS.items()
            for _ in intents
        ]
    )
    # W_intent · q_i = (mean of the tools execution i used), exactly, for every held-back intent.
    knows = {**initial, "W_intent": targets.T @ np.linalg.pinv(queries.T)}
    # ... or of tools these executions did not use (the ones their words point at)
    elsewhere = np.asarray(
        [
            h.features[[h.node_index(t) for t in spec[cap].tools]].mean(axis=0)
            for cap, intents in INTENTS.items()
            for _ in intents
        ]
    )
    misleads = {**initial, "W_intent": elsewhere.T @ np.linalg.pinv(queries.T)}
    return graph, h, to_bytes(config, knows), to_bytes(config, misleads)


def _decisive(metrics: dict[str, float], ranker: str) -> tuple[float, float]:
    """What the gate compares: held-back recall@5, then the first executed tool's MRR."""
    return metrics[f"holdout_{ranker}_recall_at_5"], metrics[f"holdout_{ranker}_mrr"]


async def test_a_version_worse_than_the_serving_one_is_kept_as_rejected(
    rig: Rig, tenant: str, driver, settings: Settings
) -> None:
    graph, h, good, bad = await _gate_situation(rig, driver, settings, tenant)
    for cap in SHIFTED.values():
        used = next(c.tools for c in CAPABILITIES if c.id == cap)
        trained = Trace(trace_id=f"trained-{cap}", intent=cap, path=used, outcome=1.0)
        await rig.buffer.add(tenant, trained)
    lease = await rig.lock.try_acquire()
    assert lease is not None
    async with rig.lock.hold(lease):
        serving = await rig.registry.publish(tenant, good, lease.token, {"correction_weight": 8.0})
        published = await rig.registry.current(tenant)
        config, params = from_bytes(bad)
        record = await rig.loop.admit(tenant, lease, graph, h, published, config, params, {})
    assert record.metrics["accepted"] == 0.0
    # still served: the version that ranks held-back executions better
    current = await rig.registry.current_record(tenant)
    assert current is not None and current.version == serving.version
    assert rig.published.events == []
    # kept as the last rejected candidate, with the figures it was judged on
    rejected = await rig.registry.last_rejected(tenant)
    assert rejected is not None and rejected[0].version == record.version != serving.version
    assert rejected[1] == bad
    m = rejected[0].metrics
    assert m["holdout_size"] == 6.0
    # the replay buffer ran these sets of tools: none of the held-back executions is novel
    assert m["holdout_novel_size"] == 0.0
    # ranked lower than the serving version (recall@5 of 8 tools, then the first tool's MRR)
    assert _decisive(m, "candidate") < _decisive(m, "serving")
    assert _decisive(m, "serving") > _decisive(m, "first_stage")
    assert m["correction_weight"] in WEIGHT_GRID


async def test_a_version_better_than_the_serving_one_and_the_first_stage_is_published(
    rig: Rig, tenant: str, driver, settings: Settings
) -> None:
    graph, h, good, bad = await _gate_situation(rig, driver, settings, tenant)
    lease = await rig.lock.try_acquire()
    assert lease is not None
    async with rig.lock.hold(lease):
        await rig.registry.publish(tenant, bad, lease.token, {"correction_weight": 1.0})
        published = await rig.registry.current(tenant)
        config, params = from_bytes(good)
        record = await rig.loop.admit(tenant, lease, graph, h, published, config, params, {})
    assert record.metrics["accepted"] == 1.0
    current = await rig.registry.current(tenant)
    assert current is not None and current[0].version == record.version and current[1] == good
    [announcement] = rig.published.events
    assert announcement.model_version == record.version  # type: ignore[attr-defined]
    m = record.metrics
    assert m["correction_weight"] > 0.0
    # nothing was trained on: every held-back set of tools is new, and the candidate helps there
    assert m["holdout_novel_size"] == 6.0
    assert _decisive(m, "novel_candidate") > _decisive(m, "novel_first_stage")
    assert _decisive(m, "candidate") > _decisive(m, "serving")
    assert _decisive(m, "candidate") > _decisive(m, "first_stage")
    assert await rig.registry.last_rejected(tenant) is None


async def test_a_candidate_that_ties_the_serving_one_replaces_it_only_if_it_learned_from_more(
    rig: Rig, tenant: str, driver, settings: Settings
) -> None:
    graph, h, good, _ = await _gate_situation(rig, driver, settings, tenant)
    lease = await rig.lock.try_acquire()
    assert lease is not None
    async with rig.lock.hold(lease):
        # at the grid's largest weight the correction orders the tools alone: nothing the
        # same parameters could do with another weight ranks better
        weight = WEIGHT_GRID[-1]
        serving = await rig.registry.publish(
            tenant, good, lease.token, {"correction_weight": weight, "traces_seen": 40.0}
        )
        published = await rig.registry.current(tenant)
        config, params = from_bytes(good)
        # the same parameters: a tie on held-back executions
        little = {"traces_seen": 40.0 * FRESHER_GROWTH - 1}
        same = await rig.loop.admit(tenant, lease, graph, h, published, config, params, little)
        assert same.metrics["accepted"] == 0.0
        current = await rig.registry.current_record(tenant)
        assert current is not None and current.version == serving.version
        more = {"traces_seen": 40.0 * FRESHER_GROWTH}
        fresher = await rig.loop.admit(tenant, lease, graph, h, published, config, params, more)
    m = fresher.metrics
    assert m["accepted"] == 1.0
    assert _decisive(m, "candidate") == _decisive(m, "serving") > _decisive(m, "first_stage")
    current = await rig.registry.current_record(tenant)
    assert current is not None and current.version == fresher.version


async def test_a_candidate_whose_memory_knows_these_users_is_published_with_it(
    rig: Rig, tenant: str, driver, settings: Settings
) -> None:
    """SHGAT misleads, but the executions remembered show what these users run for such words:
    the version is published with its execution memory weighted and SHGAT's correction at 0."""
    graph, h, _, bad = await _gate_situation(rig, driver, settings, tenant)
    spec = {c.id: c for c in CAPABILITIES}
    remembered = [
        Trace(trace_id=f"seen-{cap}-{j}", intent=intent, path=spec[SHIFTED[cap]].tools, outcome=1)
        for cap, intents in INTENTS.items()
        for j, intent in enumerate(intents)
        # each habit seen five times: still four others when one is left out, and enough
        # executions to be scored out of fold (`corrections.MIN_OUT_OF_FOLD`)
        for _ in range(5)
    ]
    remembered = [
        t.model_copy(update={"trace_id": f"{t.trace_id}-{i}"}) for i, t in enumerate(remembered)
    ]
    for trace in remembered:
        await rig.buffer.add(tenant, trace)
    lease = await rig.lock.try_acquire()
    assert lease is not None
    async with rig.lock.hold(lease):
        config, params = from_bytes(bad)
        record = await rig.loop.admit(
            tenant, lease, graph, h, None, config, params, {}, remembered=remembered
        )
    m = record.metrics
    assert m["accepted"] == 1.0, m
    assert m["memory_weight"] > 0.0 and m["correction_weight"] == 0.0
    assert m["memory_executions"] == len(remembered)
    # the memory was also judged on the executions it learned from, each scored out of fold
    assert m["out_of_fold_size"] == len(remembered)
    assert m["holdout_cross_fitted_recall_at_5"] > m["holdout_cross_fitted_first_stage_recall_at_5"]
    assert _decisive(m, "candidate") > _decisive(m, "first_stage")
    current = await rig.registry.current(tenant)
    assert current is not None and current[0].version == record.version
    memory = read_version(current[1]).memory
    assert memory is not None
    assert [e.tools for e in memory.executions] == [tuple(t.path) for t in remembered]


async def test_a_candidate_learns_how_these_users_word_their_requests_and_carries_it(
    rig: Rig, tenant: str, driver, settings: Settings
) -> None:
    """With the tool embedder, a round fits a query adapter on the remembered executions: the
    shifted habits' requests then rank the tools these users ran, and the version's bytes and
    metrics carry the adapter and its weight."""
    _, _, _, bad = await _gate_situation(rig, driver, settings, tenant)
    graph = await read_tool_graph(
        driver, settings.neo4j_database, tenant, rig.embedder, rig.embedder
    )
    h = Hierarchy.build(graph.tool_vectors, graph.capabilities, dim=rig.embedder.dim)
    spec = {c.id: c for c in CAPABILITIES}
    remembered = [
        Trace(trace_id=f"seen-{cap}-{j}", intent=intent, path=spec[SHIFTED[cap]].tools, outcome=1)
        for cap, intents in INTENTS.items()
        for j, intent in enumerate(intents)
    ]
    for trace in remembered:
        await rig.buffer.add(tenant, trace)
    loop = LearningLoop(
        buffer=rig.buffer,
        lock=rig.lock,
        registry=rig.registry,
        driver=driver,
        database=settings.neo4j_database,
        embedder=rig.embedder,
        publisher=rig.published,
        config=LEARNING,
        holdout=rig.holdout,
        tool_embedder=rig.embedder,
    )
    lease = await rig.lock.try_acquire()
    assert lease is not None
    async with rig.lock.hold(lease):
        config, params = from_bytes(bad)
        record = await loop.admit(
            tenant, lease, graph, h, None, config, params, {}, remembered=remembered
        )
    m = record.metrics
    assert m["accepted"] == 1.0 and m["adapter_weight"] > 0.0, m
    assert _decisive(m, "candidate") > _decisive(m, "first_stage")
    current = await rig.registry.current(tenant)
    assert current is not None and current[0].version == record.version
    adapter = read_version(current[1]).adapter
    assert adapter is not None and adapter.parts == (rig.embedder.dim,)


async def test_no_version_is_published_without_enough_held_back_executions(
    rig: Rig, tenant: str, driver, settings: Settings
) -> None:
    graph, h, good, _ = await _gate_situation(rig, driver, settings, tenant)
    await rig.holdout.delete_tenant(tenant)
    lease = await rig.lock.try_acquire()
    assert lease is not None
    async with rig.lock.hold(lease):
        config, params = from_bytes(good)
        record = await rig.loop.admit(tenant, lease, graph, h, None, config, params, {})
    assert record.metrics["accepted"] == 0.0 and record.metrics["holdout_size"] == 0.0
    assert await rig.registry.current(tenant) is None
