"""Composition root of the planner service: `python -m pml_planner`.

From one `Settings`: logging and telemetry, Redis (adaptive thresholds, suggestion memory,
prequential figures), the Neo4j driver (read only), channels to the scorer (target
capabilities) and search (fallback targets, the search method), the per-tenant planners, the
event subscriptions and the gRPC server on `settings.planner_port`. SIGTERM/SIGINT stop it
gracefully: the server first, then the consumers (the replica's group is removed), then the
clients.
"""

from __future__ import annotations

import asyncio

import structlog

from pml.v1 import planner_pb2_grpc, scorer_pb2_grpc, search_pb2_grpc
from pml_common.bus import EventBus, create_replica_group, destroy_replica_group
from pml_common.grpc_client import channel
from pml_common.grpc_server import GrpcServer
from pml_common.lifecycle import wait_for_shutdown_signal
from pml_common.settings import Settings
from pml_common.stores import neo4j_driver, redis_client
from pml_common.telemetry import configure_logging, setup_telemetry
from pml_planner.consumers import REPLICA_EVENTS, PlannerConsumers
from pml_planner.outcomes import SuggestionMemory
from pml_planner.prequential import JUDGE_TIMEOUT_S, Judge, PrequentialStore
from pml_planner.service import PlannerServicer
from pml_planner.targets import TargetSource
from pml_planner.tenants import TenantPlanners
from pml_planner.thresholds import RedisThresholdStore

SERVICE = "planner"
log = structlog.get_logger(__name__)


class PlannerApp:
    def __init__(self, settings: Settings, port: int | None = None) -> None:
        self.settings = settings
        self.port = settings.planner_port if port is None else port
        self._redis = redis_client(settings)
        self._driver = neo4j_driver(settings)
        self._scorer_channel = channel(settings.scorer_addr, settings)
        self._search_channel = channel(settings.search_addr, settings)
        thresholds = RedisThresholdStore(self._redis)
        memory = SuggestionMemory(self._redis, thresholds)
        max_nodes = settings.planner_cache_max_nodes
        planners = TenantPlanners(self._driver, settings.neo4j_database, max_nodes)
        scorer = scorer_pb2_grpc.ScorerServiceStub(self._scorer_channel)
        search = search_pb2_grpc.SearchServiceStub(self._search_channel)
        targets = TargetSource(scorer, search)
        # The judge answers nobody: it waits longer rather than leave a run unjudged when
        # search is slow (a large catalog refreshing while the trainer trains).
        judge_targets = TargetSource(scorer, search, timeout_s=JUDGE_TIMEOUT_S)
        figures = PrequentialStore(self._redis)
        self.bus = EventBus(settings, SERVICE)
        judge = Judge(planners, judge_targets, figures, max_nodes)
        consumers = PlannerConsumers(planners, memory, judge, figures)
        self._group = consumers.subscribe(self.bus, settings.consumer_name)
        servicer = PlannerServicer(settings, planners, targets, thresholds, memory, figures)
        self._server = GrpcServer(settings, self.port, SERVICE)
        self._server.add(
            lambda s: planner_pb2_grpc.add_PlannerServiceServicer_to_server(servicer, s),
            "pml.v1.PlannerService",
        )

    async def start(self) -> int:
        await create_replica_group(self._redis, self._group, REPLICA_EVENTS)
        await self.bus.start()
        self.port = await self._server.start()
        log.info("planner.started", port=self.port)
        return self.port

    async def stop(self) -> None:
        await self._server.stop()
        await self.bus.stop()
        await destroy_replica_group(self._redis, self._group, REPLICA_EVENTS)
        await self._scorer_channel.close()
        await self._search_channel.close()
        await self._driver.close()
        await self._redis.aclose()
        log.info("planner.stopped")


async def serve(settings: Settings) -> None:
    configure_logging(SERVICE, settings)
    setup_telemetry(SERVICE, settings)
    app = PlannerApp(settings)
    await app.start()
    try:
        await wait_for_shutdown_signal()
    finally:
        await app.stop()


def main() -> None:
    asyncio.run(serve(Settings()))
