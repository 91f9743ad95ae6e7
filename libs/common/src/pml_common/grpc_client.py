"""Channels to PML's gRPC services, traced and with the servers' message size limits."""

from __future__ import annotations

import grpc  # type: ignore[import-untyped, unused-ignore]
from opentelemetry.instrumentation.grpc import aio_client_interceptors

from pml_common.grpc_server import message_size_options
from pml_common.settings import Settings


def channel(address: str, settings: Settings) -> grpc.aio.Channel:
    """An insecure aio channel to `address` whose calls open client spans and propagate the
    trace context, so the server's spans join the caller's trace."""
    return grpc.aio.insecure_channel(
        address,
        options=message_size_options(settings),
        interceptors=aio_client_interceptors(),  # type: ignore[no-untyped-call]
    )
