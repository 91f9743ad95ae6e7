"""Process lifecycle shared by every service's composition root."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

from pml_common.grpc_server import GrpcServer
from pml_common.settings import Settings
from pml_common.telemetry import configure_logging, setup_telemetry


async def wait_for_shutdown_signal() -> signal.Signals:
    """Return once SIGTERM or SIGINT arrives (Kubernetes stops pods with SIGTERM)."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _resolve, received, sig)
    try:
        return await received
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _resolve(received: asyncio.Future[signal.Signals], sig: signal.Signals) -> None:
    if not received.done():
        received.set_result(sig)


def serve_contract(
    service: str,
    port_of: Callable[[Settings], int],
    add_to_server: Callable[[Any, Any], None],
    servicer: Any,
    full_service_name: str,
) -> None:
    """Run a service whose RPCs are not built yet: its generated base servicer answers
    UNIMPLEMENTED, with health, reflection, logging and tracing like every other service."""

    async def serve(settings: Settings) -> None:
        configure_logging(service, settings)
        setup_telemetry(service, settings)
        server = GrpcServer(settings, port_of(settings), service)
        server.add(lambda s: add_to_server(servicer, s), full_service_name)
        await server.start()
        await wait_for_shutdown_signal()
        await server.stop()

    asyncio.run(serve(Settings()))
