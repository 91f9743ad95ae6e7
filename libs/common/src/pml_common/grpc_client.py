"""Channels to PML's gRPC services: traced, with the servers' message size limits, over TLS
and with the bearer token when the settings ask for them (see `grpc_security`).

Every client of a PML service opens its channel here: the services calling each other
(`channel`, aio), the `pml` command and the health check (`blocking_channel`).
"""

from __future__ import annotations

from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]
from opentelemetry.instrumentation.grpc import aio_client_interceptors, client_interceptor
from opentelemetry.instrumentation.grpc.grpcext import intercept_channel

from pml_common.grpc_security import (
    AioTokenInterceptor,
    BlockingTokenInterceptor,
    channel_credentials,
    tls_channel_options,
    token_metadata,
)
from pml_common.grpc_server import message_size_options
from pml_common.settings import Settings


def channel_options(settings: Settings) -> list[tuple[str, Any]]:
    """Options of every channel: message size limits, and the TLS name override if set."""
    return [*message_size_options(settings), *tls_channel_options(settings)]


def channel(address: str, settings: Settings) -> grpc.aio.Channel:
    """An aio channel to `address` whose calls open client spans and propagate the trace
    context (so the server's spans join the caller's trace), and carry the bearer token."""
    interceptors: list[Any] = list(aio_client_interceptors())  # type: ignore[no-untyped-call]
    metadata = token_metadata(settings)
    if metadata:
        interceptors.append(AioTokenInterceptor(metadata))
    credentials = channel_credentials(settings)
    options = channel_options(settings)
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)


def blocking_channel(address: str, settings: Settings, *, traced: bool = True) -> grpc.Channel:
    """A blocking channel to `address`, with the bearer token; traced unless `traced` is False
    (health probes, which would otherwise fill the tracing backend)."""
    credentials = channel_credentials(settings)
    options = channel_options(settings)
    base = (
        grpc.insecure_channel(address, options)
        if credentials is None
        else grpc.secure_channel(address, credentials, options)
    )
    metadata = token_metadata(settings)
    if metadata:
        base = grpc.intercept_channel(base, BlockingTokenInterceptor(metadata))
    if not traced:
        return base
    # OpenTelemetry's blocking interceptor has its own channel wrapper (grpcext), not grpc's.
    return intercept_channel(base, client_interceptor())  # type: ignore[no-untyped-call, no-any-return, unused-ignore]
