"""Composition root of the scorer service: `python -m pml_scorer`.

Builds, from one `Settings`: logging and telemetry, the Redis client (model registry, embedding
cache), the Neo4j driver (read only), the embedder, the per-tenant models (`ModelSnapshots`),
this replica's event subscriptions (see `consumers`) and the gRPC server on
`settings.scorer_port` with `ScorerService`. SIGTERM/SIGINT stop it gracefully: the server
stops accepting RPCs and finishes those in flight, then the consumers stop, the replica's group
is removed, then the clients close.
"""

from __future__ import annotations

import asyncio

import structlog
from threadpoolctl import threadpool_limits

from pml.v1 import scorer_pb2_grpc
from pml_common.bus import EventBus, create_replica_group, destroy_replica_group
from pml_common.embedding import build_embedder, build_tool_embedder
from pml_common.grpc_server import GrpcServer
from pml_common.lifecycle import wait_for_shutdown_signal
from pml_common.model_registry import ModelRegistry
from pml_common.prequential import PrequentialStore
from pml_common.settings import Settings
from pml_common.stores import neo4j_driver, redis_client
from pml_common.telemetry import configure_logging, setup_telemetry
from pml_scorer.consumers import EVENTS, ScorerConsumers
from pml_scorer.models import ModelBuilder
from pml_scorer.service import ScorerServicer
from pml_scorer.snapshots import ModelSnapshots

SERVICE = "scorer"
log = structlog.get_logger(__name__)


class ScorerApp:
    """Every part of the running service, started and stopped in order."""

    def __init__(self, settings: Settings, port: int | None = None) -> None:
        # Scoring is one (nodes × key_dim) float32 matrix-vector product per request: one BLAS
        # thread does it fastest on a small pod, where a pool per core competes with gRPC and
        # the event loop (the same finding as search, services/search/README.md).
        threadpool_limits(limits=1, user_api="blas")
        self.settings = settings
        self.port = settings.scorer_port if port is None else port
        self._redis = redis_client(settings)
        self._driver = neo4j_driver(settings)
        self.embedder = build_embedder(settings, self._redis)
        self.tool_embedder = build_tool_embedder(settings, self._redis)
        registry = ModelRegistry(self._redis, settings.model_keep_versions)
        builder = ModelBuilder(
            self._driver,
            settings.neo4j_database,
            self.embedder,
            registry,
            settings.shgat_key_dim,
            self.tool_embedder,
        )
        self.snapshots = ModelSnapshots(builder, settings.scorer_cache_max_nodes)
        self.bus = EventBus(settings, SERVICE)
        self._group = ScorerConsumers(self.snapshots).subscribe(self.bus, settings.consumer_name)
        self.servicer = ScorerServicer(
            settings,
            self.snapshots,
            self.embedder,
            registry,
            PrequentialStore(self._redis),
            self.tool_embedder,
        )
        self._server = GrpcServer(settings, self.port, SERVICE)
        self._server.add(
            lambda s: scorer_pb2_grpc.add_ScorerServiceServicer_to_server(self.servicer, s),
            "pml.v1.ScorerService",
        )

    async def start(self) -> int:
        """Start consuming and serving; returns the bound port."""
        # Load the embedding model now rather than on the first request.
        await self.embedder.embed_queries(["warm up"])
        await self.tool_embedder.embed_queries(["warm up"])
        await create_replica_group(self._redis, self._group, EVENTS)
        await self.bus.start()
        self.port = await self._server.start()
        log.info("scorer started", port=self.port)
        return self.port

    async def stop(self) -> None:
        await self._server.stop()
        await self.bus.stop()
        await destroy_replica_group(self._redis, self._group, EVENTS)
        await self._driver.close()
        await self._redis.aclose()
        log.info("scorer stopped")


async def serve(settings: Settings) -> None:
    configure_logging(SERVICE, settings)
    setup_telemetry(SERVICE, settings)
    app = ScorerApp(settings)
    await app.start()
    try:
        await wait_for_shutdown_signal()
    finally:
        await app.stop()


def main() -> None:
    asyncio.run(serve(Settings()))
