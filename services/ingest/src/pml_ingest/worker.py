"""A pass worker: `python -m pml_ingest.worker <pass>`, pass in chunking, pass1, pass2a, pass2b,
pass3.

Each pass runs as its own process and consumer group (`ingest-<pass>`), chained to the next by
the `*Completed` events (see `pml_ingest.passes`), and serves gRPC health on
`ingest_worker_port` with service name `pml.v1.IngestWorker` (SERVING once consuming).
SIGTERM/SIGINT stop it gracefully: health first, then the bus (an event in flight finishes or
stays pending for another replica), then the stores.
"""

from __future__ import annotations

import asyncio
import sys

import structlog
from grpc_health.v1 import health_pb2

from pml_common.bus import EventBus
from pml_common.grpc_server import GrpcServer
from pml_common.latest_wins import LatestWins
from pml_common.lifecycle import wait_for_shutdown_signal
from pml_common.settings import Settings
from pml_common.stores import neo4j_driver, redis_client
from pml_common.telemetry import configure_logging, setup_telemetry
from pml_ingest.graph_store import GraphStore
from pml_ingest.passes import PASS_TYPES, PassRuntime, build_pass, group_of
from pml_ingest.status import StatusStore

#: gRPC health service name every pass worker reports.
HEALTH_SERVICE = "pml.v1.IngestWorker"
log = structlog.get_logger(__name__)


async def serve(settings: Settings, pass_name: str) -> None:
    service = f"ingest-{pass_name}"
    configure_logging(service, settings)
    setup_telemetry(service, settings)
    driver = neo4j_driver(settings)
    redis = redis_client(settings)
    bus = EventBus(settings, service)
    server = GrpcServer(settings, settings.ingest_worker_port, service)
    try:
        store = GraphStore(driver, settings.neo4j_database, settings.ingest_write_batch)
        await store.ensure_schema()
        claims = LatestWins(redis, group_of("chunking"))
        runtime = PassRuntime(store, StatusStore(redis), bus, settings, claims)
        handler = build_pass(pass_name, runtime)
        handler.subscribe(bus)
        await bus.start()
        await server.start()
        await server.health.set(HEALTH_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        log.info("ingest.worker_started", pass_name=pass_name, port=settings.ingest_worker_port)
        received = await wait_for_shutdown_signal()
        log.info("ingest.worker_stopping", pass_name=pass_name, signal=received.name)
    finally:
        await server.stop()
        await bus.stop()
        await redis.aclose()
        await driver.close()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in PASS_TYPES:
        sys.stderr.write(f"usage: python -m pml_ingest.worker {{{','.join(PASS_TYPES)}}}\n")
        raise SystemExit(2)
    asyncio.run(serve(Settings(), args[0]))


if __name__ == "__main__":
    main()
