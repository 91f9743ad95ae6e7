"""Composition root of the planner service.

The contract (`proto/pml/v1/planner.proto`) is served with health and reflection; its RPCs are
not built yet and answer UNIMPLEMENTED (the generated base servicer's behaviour).
"""

from __future__ import annotations

import asyncio

from pml.v1 import planner_pb2_grpc
from pml_common.grpc_server import GrpcServer
from pml_common.lifecycle import wait_for_shutdown_signal
from pml_common.settings import Settings
from pml_common.telemetry import configure_logging, setup_telemetry

SERVICE = "planner"


async def serve(settings: Settings) -> None:
    configure_logging(SERVICE, settings)
    setup_telemetry(SERVICE, settings)
    server = GrpcServer(settings, settings.planner_port, SERVICE)
    servicer = planner_pb2_grpc.PlannerServiceServicer()
    server.add(
        lambda s: planner_pb2_grpc.add_PlannerServiceServicer_to_server(servicer, s),
        "pml.v1.PlannerService",
    )
    await server.start()
    await wait_for_shutdown_signal()
    await server.stop()


def main() -> None:
    asyncio.run(serve(Settings()))
