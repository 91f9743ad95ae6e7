"""Composition root of the scorer service.

The contract (`proto/pml/v1/scorer.proto`) is served with health and reflection; its RPCs are
not built yet and answer UNIMPLEMENTED (the generated base servicer's behaviour).
"""

from __future__ import annotations

import asyncio

from pml.v1 import scorer_pb2_grpc
from pml_common.grpc_server import GrpcServer
from pml_common.lifecycle import wait_for_shutdown_signal
from pml_common.settings import Settings
from pml_common.telemetry import configure_logging, setup_telemetry

SERVICE = "scorer"


async def serve(settings: Settings) -> None:
    configure_logging(SERVICE, settings)
    setup_telemetry(SERVICE, settings)
    server = GrpcServer(settings, settings.scorer_port, SERVICE)
    servicer = scorer_pb2_grpc.ScorerServiceServicer()
    server.add(
        lambda s: scorer_pb2_grpc.add_ScorerServiceServicer_to_server(servicer, s),
        "pml.v1.ScorerService",
    )
    await server.start()
    await wait_for_shutdown_signal()
    await server.stop()


def main() -> None:
    asyncio.run(serve(Settings()))
