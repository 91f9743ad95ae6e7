"""Live SHGAT training: PER batches from the replay buffer, only while holding the lease lock.

A round trains one tenant: read its hierarchy from Neo4j, start from the tenant's current
model in the registry (or the initial one), run `steps` PER batches, and publish the result
with the lease's fencing token. After each batch the sampled traces get new priorities from
their TD error, `outcome − predictPathSuccess(intent, path)` under the updated model.

Safety: the lease is checked before every step and before publishing, and a lost lease
abandons the round; the registry accepts a publish only with the newest fencing token, so even
a trainer that was paused past its lease (and does not know yet) cannot overwrite a newer model.
Event consumption never waits on training: rounds run in their own task, and the numpy work of
each step runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import structlog
from neo4j import AsyncDriver

from pml_common.embedding import Embedder
from pml_common.events import ModelPublished
from pml_common.lease_lock import Lease, LeaseLock
from pml_common.model_registry import ModelRecord, ModelRegistry, StaleFencingToken
from pml_common.tool_graph import read_tool_graph
from pml_shgat.hierarchy import Hierarchy
from pml_shgat.params import Params, ShgatConfig, from_bytes, init_params, make_config, to_bytes
from pml_shgat.serving import ServingModel
from pml_shgat.training import ShgatTrainer, make_batch, path_examples
from pml_trainer.handlers import Publisher
from pml_trainer.replay_buffer import ReplayBuffer, Sample

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class LearningConfig:
    batch_size: int = 32
    steps: int = 30
    learning_rate: float = 0.003
    min_traces: int = 16
    poll_s: float = 1.0
    key_dim: int = 128
    seed: int | None = None


class RoundAbandoned(Exception):
    """The lease was lost during a round: nothing of it may be published."""


class LearningLoop:
    def __init__(
        self,
        *,
        buffer: ReplayBuffer,
        lock: LeaseLock,
        registry: ModelRegistry,
        driver: AsyncDriver,
        database: str,
        embedder: Embedder,
        publisher: Publisher,
        config: LearningConfig,
    ) -> None:
        self._buffer = buffer
        self._lock = lock
        self._registry = registry
        self._driver = driver
        self._database = database
        self._embedder = embedder
        self._publisher = publisher
        self._config = config
        self._rng = np.random.default_rng(config.seed)

    async def run(self, stop: asyncio.Event) -> None:
        """Acquire the lock, train what is pending, release; repeat until `stop`.

        The lock is released after every pass that trained something, and taken again after
        a random pause, so that replicas share the work and none becomes a single point of
        slowness; tokens grow with every hand-over, which is what fencing relies on.
        """
        while not stop.is_set():
            lease = await self._lock.acquire(self._config.poll_s, stop)
            if lease is None:
                return
            try:
                async with self._lock.hold(lease):
                    await self._train_one_pass(lease, stop)
            except Exception as exc:  # a store outage must not end learning for good
                log.warning("learning.interrupted", error=repr(exc), token=lease.token)
            await _sleep_unless(stop, self._rng.uniform(0, self._config.poll_s))

    async def _train_one_pass(self, lease: Lease, stop: asyncio.Event) -> None:
        """Wait (holding the lock) until some tenant is pending, then train each once."""
        while lease.held() and not stop.is_set():
            pending = await self._buffer.pending_tenants(self._config.min_traces)
            if pending:
                break
            await _sleep_unless(stop, self._config.poll_s, lease.lost)
        else:
            return
        for tenant in pending:
            if not lease.held() or stop.is_set():
                return
            try:
                await self.train_round(tenant, lease, stop)
            except RoundAbandoned:
                return  # logged by the round; the caller waits for the lock again

    async def train_round(
        self, tenant: str, lease: Lease, stop: asyncio.Event | None = None
    ) -> ModelRecord | None:
        """Train one tenant and publish the new version; None when there is nothing to learn.

        Raises `RoundAbandoned` when the lease is lost or `stop` is set before the publish.
        """
        wall_start = time.time()
        log.info("learning.round_started", tenant=tenant, token=lease.token, at=wall_start)
        try:
            return await self._round(tenant, lease, stop, wall_start)
        except RoundAbandoned as exc:
            log.warning(
                "learning.round_abandoned",
                tenant=tenant,
                token=lease.token,
                reason=str(exc),
                started_at=wall_start,
                at=time.time(),
            )
            raise

    async def _round(
        self,
        tenant: str,
        lease: Lease,
        stop: asyncio.Event | None,
        wall_start: float,
    ) -> ModelRecord | None:
        upto = await self._buffer.added_count(tenant)
        hierarchy = await self._hierarchy(tenant)
        if hierarchy.num_nodes == 0:
            await self._buffer.mark_trained(tenant, upto)
            return None
        config, params = await self._starting_point(tenant, hierarchy)
        trainer = ShgatTrainer(config, params, hierarchy, self._config.learning_rate)
        losses, errors = [], []
        for _ in range(self._config.steps):
            _check(lease, stop)
            loss, td = await self._step(tenant, trainer, hierarchy)
            losses.append(loss)
            errors.append(td)
        _check(lease, stop)
        metrics = {
            "loss": float(np.mean(losses[-5:])),
            "mean_abs_td": float(np.mean(errors[-5:])),
            "steps": float(len(losses)),
            "traces": float(await self._buffer.size(tenant)),
            # executions received before the round started: all of them could be sampled
            "traces_seen": float(upto),
            "train_s": time.time() - wall_start,
        }
        record = await self._publish(tenant, lease, config, trainer.params, metrics)
        await self._buffer.mark_trained(tenant, upto)
        log.info(
            "learning.round_finished",
            tenant=tenant,
            token=lease.token,
            version=record.version,
            at=time.time(),
            started_at=wall_start,
            **metrics,
        )
        return record

    async def _step(
        self, tenant: str, trainer: ShgatTrainer, hierarchy: Hierarchy
    ) -> tuple[float, float]:
        sample = await self._buffer.sample(tenant, self._config.batch_size, self._rng)
        intents = await self._intent_vectors(sample)
        examples = [
            example
            for trace, weight, intent in zip(sample.traces, sample.weights, intents, strict=True)
            for example in path_examples(
                hierarchy, intent, trace.path, trace.outcome, float(weight), trace.capability_id
            )
        ]
        if not examples:
            return 0.0, 0.0
        batch = make_batch(examples, hierarchy, self._rng)
        stats = await asyncio.to_thread(trainer.step, batch)
        td = await asyncio.to_thread(_td_errors, trainer, hierarchy, sample, intents)
        await self._buffer.update_priorities(tenant, sample.ids, td)
        return stats.loss, float(np.mean(np.abs(td)))

    async def _hierarchy(self, tenant: str) -> Hierarchy:
        graph = await read_tool_graph(self._driver, self._database, tenant, self._embedder)
        return Hierarchy.build(graph.tool_vectors, graph.capabilities, dim=self._embedder.dim)

    async def _starting_point(
        self, tenant: str, hierarchy: Hierarchy
    ) -> tuple[ShgatConfig, Params]:
        """The tenant's current model, or a new one when none fits this embedder."""
        current = await self._registry.current(tenant)
        if current is not None:
            config, params = from_bytes(current[1])
            if config.dim == hierarchy.dim:
                return config, params
            log.warning("learning.model_reset", tenant=tenant, reason="embedding size changed")
        config = make_config(hierarchy.dim, self._config.key_dim, hierarchy.num_nodes)
        return config, init_params(config, hierarchy.features, hierarchy.num_levels)

    async def _intent_vectors(self, sample: Sample) -> list[np.ndarray]:
        unique = list(dict.fromkeys(t.intent for t in sample.traces))
        vectors = await self._embedder.embed_queries(unique) if unique else []
        by_text = dict(zip(unique, vectors, strict=True))
        return [by_text[t.intent] for t in sample.traces]

    async def _publish(
        self,
        tenant: str,
        lease: Lease,
        config: ShgatConfig,
        params: Params,
        metrics: dict[str, float],
    ) -> ModelRecord:
        try:
            record = await self._registry.publish(
                tenant, to_bytes(config, params), lease.token, metrics
            )
        except StaleFencingToken as exc:
            raise RoundAbandoned(str(exc)) from exc
        await self._publisher.publish(
            ModelPublished.create(
                tenant_id=tenant,
                model_version=record.version,
                fencing_token=lease.token,
                metrics=metrics,
            )
        )
        return record


def _td_errors(
    trainer: ShgatTrainer, hierarchy: Hierarchy, sample: Sample, intents: Sequence[np.ndarray]
) -> np.ndarray:
    model = ServingModel(trainer.config, trainer.params, hierarchy)
    predicted = [
        model.predict_path_success(intent, trace.path)
        for trace, intent in zip(sample.traces, intents, strict=True)
    ]
    return np.asarray([t.outcome for t in sample.traces]) - np.asarray(predicted)


def _check(lease: Lease, stop: asyncio.Event | None) -> None:
    if not lease.held():
        raise RoundAbandoned(f"lease {lease.token} lost")
    if stop is not None and stop.is_set():
        raise RoundAbandoned("the trainer is stopping")


async def _sleep_unless(
    stop: asyncio.Event, seconds: float, other: asyncio.Event | None = None
) -> None:
    waiters = [asyncio.ensure_future(stop.wait())]
    if other is not None:
        waiters.append(asyncio.ensure_future(other.wait()))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()
