"""Composition root of the ingest service: `python -m pml_ingest`.

Serves `IngestService` on `settings.ingest_port` (with health and reflection): Submit publishes
`DocumentSubmitted`, GetStatus reads the per-pass status in Redis, DeleteDocument publishes
`DocumentDeleted`. The passes themselves run in their own processes:
`python -m pml_ingest.worker <pass>` (see `pml_ingest.worker`).
"""

from __future__ import annotations

import asyncio

import structlog

from pml.v1 import ingest_pb2_grpc
from pml_common.bus import EventBus
from pml_common.grpc_server import GrpcServer
from pml_common.lifecycle import wait_for_shutdown_signal
from pml_common.settings import Settings
from pml_common.stores import redis_client
from pml_common.telemetry import configure_logging, setup_telemetry
from pml_ingest.service import IngestServicer
from pml_ingest.status import StatusStore

SERVICE = "ingest"
log = structlog.get_logger(__name__)


async def serve(settings: Settings) -> None:
    configure_logging(SERVICE, settings)
    setup_telemetry(SERVICE, settings)
    redis = redis_client(settings)
    bus = EventBus(settings, SERVICE, redis=redis)
    server = GrpcServer(settings, settings.ingest_port, SERVICE)
    servicer = IngestServicer(settings, StatusStore(redis), bus)
    server.add(
        lambda s: ingest_pb2_grpc.add_IngestServiceServicer_to_server(servicer, s),
        "pml.v1.IngestService",
    )
    try:
        await bus.start()
        await server.start()
        log.info("ingest.started", port=settings.ingest_port)
        await wait_for_shutdown_signal()
    finally:
        await server.stop()
        await bus.stop()
        await redis.aclose()


def main() -> None:
    asyncio.run(serve(Settings()))
