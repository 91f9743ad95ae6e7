"""Composition root of the trainer: the single writer of the tool graph.

It consumes catalog, capability, execution and tenant events in consumer group `trainer`,
applies them to Neo4j, publishes `GraphChanged`, keeps executions in the replay buffer, and
serves gRPC health only. Beside the consumers, the learning loop trains SHGAT whenever this
replica holds the trainer lock (several replicas may run; one trains at a time). SIGTERM/SIGINT
stop it gracefully: health goes first (so no orchestrator waits on a stopping pod), then the
bus (in-flight handlers finish or stay pending for another replica), then the stores.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

import structlog
from redis.asyncio import Redis
from threadpoolctl import threadpool_limits

from pml_common.bus import EventBus
from pml_common.embedding import build_embedder, build_tool_embedder
from pml_common.events import utcnow
from pml_common.grpc_server import GrpcServer
from pml_common.lease_lock import LeaseLock
from pml_common.lifecycle import wait_for_shutdown_signal
from pml_common.model_registry import ModelRegistry
from pml_common.prequential import PrequentialStore
from pml_common.settings import Settings
from pml_common.stores import neo4j_driver, redis_client
from pml_common.telemetry import configure_logging, setup_telemetry
from pml_trainer.cold_start import ColdStartConfig, load_templates
from pml_trainer.evaluation import Prequential, TenantViews
from pml_trainer.graph_store import GraphStore
from pml_trainer.handlers import TrainerHandlers
from pml_trainer.holdout import HoldOut
from pml_trainer.learning import LearningConfig, LearningLoop
from pml_trainer.replay_buffer import ReplayBuffer

SERVICE = "trainer"
#: How often applied-event records older than the bus's dedupe window are deleted.
PRUNE_INTERVAL_S = 3600
log = structlog.get_logger(__name__)


async def serve(settings: Settings) -> None:
    configure_logging(SERVICE, settings)
    setup_telemetry(SERVICE, settings)
    # One BLAS thread: a round's products are small (a query adapter's fit is 2 to 7 times
    # faster on one thread than on OpenBLAS's pool of two, a training step 7 % slower), and the
    # pool's workers would compete with the consumers and the event loop on a small pod.
    threadpool_limits(limits=1, user_api="blas")
    # A broken templates file stops the start-up here, not at the first registration.
    templates = load_templates(settings.workflow_templates)
    driver = neo4j_driver(settings)
    redis = redis_client(settings)
    bus = EventBus(settings, SERVICE)
    server = GrpcServer(settings, settings.trainer_port, SERVICE)
    try:
        store = GraphStore(driver, settings.neo4j_database)
        await store.ensure_schema()
        embedder = build_embedder(settings, redis)
        tool_embedder = build_tool_embedder(settings, redis)
        replay = _replay_buffer(settings, redis)
        registry = ModelRegistry(redis, settings.model_keep_versions)
        holdout = HoldOut(redis)
        views = TenantViews(
            driver,
            settings.neo4j_database,
            embedder,
            registry,
            tool_embedder=tool_embedder,
            max_nodes=settings.trainer_cache_max_nodes,
        )
        prequential = Prequential(views, PrequentialStore(redis), embedder, tool_embedder)
        handlers = TrainerHandlers(
            store,
            bus,
            embedder,
            templates,
            ColdStartConfig(similarity_threshold=settings.cold_start_similarity),
            replay,
            registry,
            holdout,
            prequential,
        )
        handlers.subscribe(bus)
        # Load the embedding model before consuming: every execution is ranked (prequential)
        # with an embedding of its intent, and should not wait on a first load.
        await embedder.embed_queries(["warm up"])
        await tool_embedder.embed_queries(["warm up"])
        await bus.start()
        await server.start()
        learning = LearningLoop(
            buffer=replay,
            lock=LeaseLock(redis, lease_ms=settings.trainer_lease_ms, owner=settings.consumer_name),
            registry=registry,
            driver=driver,
            database=settings.neo4j_database,
            embedder=embedder,
            publisher=bus,
            config=_learning_config(settings),
            holdout=holdout,
            tool_embedder=tool_embedder,
        )
        stop_learning = asyncio.Event()
        learner = asyncio.create_task(learning.run(stop_learning), name="learning")
        pruner = asyncio.create_task(_prune_forever(store, settings), name="prune-applied")
        log.info("trainer.started", port=settings.trainer_port, templates=len(templates))
        received = await wait_for_shutdown_signal()
        log.info("trainer.stopping", signal=received.name)
        stop_learning.set()
        pruner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pruner
        await learner  # releases the lock, so another replica takes over without waiting
    finally:
        await server.stop()
        await bus.stop()
        await redis.aclose()
        await driver.close()


def _replay_buffer(settings: Settings, redis: Redis) -> ReplayBuffer:
    return ReplayBuffer(
        redis,
        settings.replay_capacity,
        alpha=settings.per_alpha,
        beta0=settings.per_beta0,
        beta_steps=settings.per_beta_steps,
        epsilon=settings.per_epsilon,
    )


def _learning_config(settings: Settings) -> LearningConfig:
    return LearningConfig(
        batch_size=settings.train_batch_size,
        steps=settings.train_steps,
        draws_per_execution=settings.train_draws_per_execution,
        learning_rate=settings.train_learning_rate,
        min_traces=settings.replay_min_traces,
        # Waiting for the lock polls well inside one lease, so a dead holder is replaced fast.
        poll_s=min(settings.train_poll_s, settings.trainer_lease_ms / 3000),
        key_dim=settings.shgat_key_dim,
        seed=settings.train_seed,
        quiet_s=settings.train_quiet_s,
        max_wait_s=settings.train_max_wait_s,
        concurrent_rounds=settings.train_concurrent_rounds,
    )


async def _prune_forever(store: GraphStore, settings: Settings) -> None:
    retention = timedelta(seconds=settings.dedupe_ttl_s)
    while True:
        try:
            deleted = await store.prune_applied(utcnow() - retention)
            log.info("trainer.applied_events_pruned", deleted=deleted)
        except Exception as exc:  # a missed round is harmless: the next one catches up
            log.warning("trainer.prune_failed", error=repr(exc))
        await asyncio.sleep(PRUNE_INTERVAL_S)


def main() -> None:
    asyncio.run(serve(Settings()))
