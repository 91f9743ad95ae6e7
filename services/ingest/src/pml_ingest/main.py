"""Composition root of the ingest service.

The contract (`proto/pml/v1/ingest.proto`) is served with health and reflection; its RPCs are
not built yet and answer UNIMPLEMENTED (the generated base servicer's behaviour).
"""

from __future__ import annotations

import asyncio

from pml.v1 import ingest_pb2_grpc
from pml_common.grpc_server import GrpcServer
from pml_common.lifecycle import wait_for_shutdown_signal
from pml_common.settings import Settings
from pml_common.telemetry import configure_logging, setup_telemetry

SERVICE = "ingest"


async def serve(settings: Settings) -> None:
    configure_logging(SERVICE, settings)
    setup_telemetry(SERVICE, settings)
    server = GrpcServer(settings, settings.ingest_port, SERVICE)
    servicer = ingest_pb2_grpc.IngestServiceServicer()
    server.add(
        lambda s: ingest_pb2_grpc.add_IngestServiceServicer_to_server(servicer, s),
        "pml.v1.IngestService",
    )
    await server.start()
    await wait_for_shutdown_signal()
    await server.stop()


def main() -> None:
    asyncio.run(serve(Settings()))
