"""The asyncio gRPC server every PML service runs, and how servicers report errors.

`GrpcServer` adds what every service needs around its servicers: health checking (SERVING once
started, NOT_SERVING while stopping), server reflection, OpenTelemetry server spans, message size
limits, TLS and bearer-token authentication when the settings turn them on (`grpc_security`),
and error mapping. A request whose bytes do not decode (corrupt protobuf, a string field that
is not UTF-8) is answered INVALID_ARGUMENT before any servicer runs. Servicers signal bad
requests by raising `RequestError` (see
`invalid_argument`, `not_found`, `failed_precondition`); a store that is down (Neo4j
ServiceUnavailable/SessionExpired, Redis ConnectionError/TimeoutError) becomes UNAVAILABLE, so
clients can retry instead of seeing UNKNOWN; a call to another PML service that fails becomes
UNAVAILABLE or DEADLINE_EXCEEDED naming that service (`dependency`). Anything else is logged
and becomes INTERNAL.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, NoReturn

import grpc  # type: ignore[import-untyped, unused-ignore]
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import aio_server_interceptor

from pml_common.grpc_security import server_credentials, server_interceptors
from pml_common.settings import Settings

log = structlog.get_logger("pml_common.grpc_server")

#: Longest error message sent to a caller: messages quote the caller's input, which may be huge,
#: and status details travel in a trailer of limited size.
MAX_ERROR_MESSAGE = 2000


@functools.cache
def unavailable_errors() -> tuple[type[BaseException], ...]:
    """Store failures a client may retry: the request was fine, a dependency was not.
    Imported on first use: clients share this module (message size options) and should not
    load the store drivers (a second of `pml` start-up)."""
    import neo4j.exceptions
    import redis.exceptions

    return (
        neo4j.exceptions.ServiceUnavailable,
        neo4j.exceptions.SessionExpired,
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
    )


class RequestError(Exception):
    """Raise from a servicer to answer with `code` and a message meant for the caller."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid_argument(message: str) -> RequestError:
    return RequestError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> RequestError:
    return RequestError(grpc.StatusCode.NOT_FOUND, message)


def failed_precondition(message: str) -> RequestError:
    return RequestError(grpc.StatusCode.FAILED_PRECONDITION, message)


def dependency_error(name: str, timeout_s: float, exc: grpc.aio.AioRpcError) -> RequestError:
    """What the caller should see when `name`, a service this one calls, failed with `exc`:
    DEADLINE_EXCEEDED when it did not answer in time, UNAVAILABLE otherwise (the request was
    fine, retry later); never INTERNAL, since nothing is wrong with this service."""
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestError(code, f"{name} did not answer within {timeout_s:g} s")
    return RequestError(
        grpc.StatusCode.UNAVAILABLE,
        f"{name} failed ({code.name}: {exc.details()}); retry later",
    )


@asynccontextmanager
async def dependency(name: str, timeout_s: float) -> AsyncIterator[None]:
    """Around calls to the service `name` (made with `timeout=timeout_s`): their failure
    becomes this service's UNAVAILABLE or DEADLINE_EXCEEDED naming `name`."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise dependency_error(name, timeout_s, exc) from exc


def check_deadline(context: grpc.aio.ServicerContext) -> None:
    """Raise DEADLINE_EXCEEDED when the caller's deadline has passed (call between steps of
    long work, so it is not done for a caller that has already given up)."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise RequestError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")


async def _abort_for(exc: Exception, context: grpc.aio.ServicerContext, method: str) -> NoReturn:
    """Turn an exception escaping a servicer into the status the caller should see."""
    if isinstance(exc, RequestError):
        await context.abort(exc.code, _shortened(exc.message))
    if isinstance(exc, grpc.aio.AioRpcError):
        # A call to another service nobody wrapped in `dependency`: still not this one's fault.
        log.warning("grpc.dependency_failed", method=method, code=exc.code().name)
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            _shortened(f"a service this one calls failed ({exc.code().name}: {exc.details()})"),
        )
    if isinstance(exc, unavailable_errors()):
        log.warning("grpc.store_unavailable", method=method, error=f"{type(exc).__name__}: {exc}")
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"a backing store is unavailable ({type(exc).__name__}: {exc}); retry later",
        )
    if isinstance(exc, NotImplementedError):
        # The generated base servicer raises it for RPCs a service does not implement.
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
    log.exception("grpc.handler_crashed", method=method)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__})")
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


def _shortened(message: str) -> str:
    if len(message) <= MAX_ERROR_MESSAGE:
        return message
    return message[: MAX_ERROR_MESSAGE - 1] + "…"


class _Undecodable:
    """Stands for a request whose bytes did not decode: gRPC would answer UNKNOWN (and log a
    traceback) for an exception raised by the deserializer, so the deserializer returns this and
    the guard answers INVALID_ARGUMENT instead."""

    def __init__(self, message: str) -> None:
        self.message = message


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:
            # DecodeError names the message type; the bytes are the caller's, not a crash.
            return _Undecodable(f"the request could not be decoded as {_type_of(exc)}: {exc}")

    return deserialize


def _type_of(exc: Exception) -> str:
    text = str(exc)
    if "with type '" in text:
        return text.split("with type '", 1)[1].split("'", 1)[0]
    return "the method's request message"


async def _refuse_undecodable(request: Any, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, _Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _shortened(request.message))


async def _decoded(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
    async for request in requests:
        await _refuse_undecodable(request, context)
        yield request


def _guard_unary(behavior: Callable[..., Any], method: str) -> Callable[..., Awaitable[Any]]:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _refuse_undecodable(request, context)
        if hasattr(request, "__aiter__"):  # a client stream
            request = _decoded(request, context)
        try:
            result = behavior(request, context)
            # Generated base servicers are synchronous; awaiting only what is awaitable lets
            # both kinds run on the aio server.
            return await result if inspect.isawaitable(result) else result
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort_for(exc, context, method)

    return guarded


def _guard_stream(behavior: Callable[..., Any], method: str) -> Callable[..., AsyncIterator[Any]]:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await _refuse_undecodable(request, context)
        if hasattr(request, "__aiter__"):  # a client stream
            request = _decoded(request, context)
        try:
            result = behavior(request, context)
            if inspect.isawaitable(result):
                result = await result
            if hasattr(result, "__aiter__"):
                async for item in result:
                    yield item
            else:
                for item in result:
                    yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort_for(exc, context, method)

    return guarded


class _ErrorMappingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc, unused-ignore]
    """Wraps every handler so servicers raise exceptions instead of setting status codes."""

    def __init__(self) -> None:
        # The wrapped handler of each method, made once: gRPC asks for the handler on every
        # call, and building it is Python work on the event loop of a busy server.
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: gRPC answers UNIMPLEMENTED itself
            return None
        method = handler_call_details.method
        made = self._wrapped.get(method)
        if made is None or made[0] is not handler:
            made = (handler, _error_mapped(handler, method))
            self._wrapped[method] = made
        return made[1]


def _error_mapped(handler: Any, method: str) -> Any:
    kwargs = {
        "request_deserializer": _tolerant(handler.request_deserializer),
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(
            _guard_unary(handler.unary_unary, method), **kwargs
        )
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(
            _guard_unary(handler.stream_unary, method), **kwargs
        )
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            _guard_stream(handler.unary_stream, method), **kwargs
        )
    return grpc.stream_stream_rpc_method_handler(
        _guard_stream(handler.stream_stream, method), **kwargs
    )


#: How long RPCs under way may still run on a connection the server asked to close: as long
#: as the longest deadline clients give (a registration of thousands of tools embeds them all).
MAX_CONNECTION_AGE_GRACE_MS = 600_000


def message_size_options(settings: Settings) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", settings.grpc_max_message_bytes),
        ("grpc.max_receive_message_length", settings.grpc_max_message_bytes),
    ]


def connection_age_options(settings: Settings) -> list[tuple[str, int]]:
    """A connection-level load balancer (a Kubernetes Service) only balances new connections:
    closing old ones now and then lets long-lived clients reach replicas added since."""
    if settings.grpc_max_connection_age_s <= 0:
        return []
    return [
        ("grpc.max_connection_age_ms", round(settings.grpc_max_connection_age_s * 1000)),
        ("grpc.max_connection_age_grace_ms", MAX_CONNECTION_AGE_GRACE_MS),
    ]


class GrpcServer:
    """One aio gRPC server with health, reflection, tracing, optional TLS and token
    authentication, and error mapping."""

    def __init__(self, settings: Settings, port: int, service_name: str) -> None:
        self._settings = settings
        self._port = port
        self._service_name = service_name
        self._services: list[str] = []
        self.health = HealthServicer()
        # Read now, so a missing certificate or token stops the start-up with its reason.
        self._credentials = server_credentials(settings)
        # Tracing outermost, so its span sees the status authentication or the error mapping
        # produced; authentication before the servicers (and their error mapping) run.
        self._server = grpc.aio.server(
            interceptors=[
                aio_server_interceptor(),  # type: ignore[no-untyped-call]
                *server_interceptors(settings),
                _ErrorMappingInterceptor(),
            ],
            options=[*message_size_options(settings), *connection_age_options(settings)],
            maximum_concurrent_rpcs=settings.grpc_workers,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self._started = False
        self.bound_port: int | None = None

    @property
    def server(self) -> grpc.aio.Server:
        return self._server

    def add(self, register: Callable[[grpc.aio.Server], None], full_service_name: str) -> None:
        """Register a servicer, e.g. `(lambda s: add_XServicer_to_server(impl, s), "pml.v1.X")`."""
        if self._started:
            raise RuntimeError("add() must be called before start()")
        register(self._server)
        self._services.append(full_service_name)

    async def start(self) -> int:
        """Bind and serve; returns the bound port (ask for port 0 to get a free one)."""
        reflection.enable_server_reflection(
            [
                *self._services,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            self._server,
        )
        address = f"{self._settings.grpc_host}:{self._port}"
        if self._credentials is None:
            port = self._server.add_insecure_port(address)
        else:
            port = self._server.add_secure_port(address, self._credentials)
        if not port:
            raise RuntimeError(f"{self._service_name}: cannot bind gRPC server to {address}")
        await self._server.start()
        self._started = True
        self.bound_port = int(port)
        for name in self._services:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "grpc.started",
            service=self._service_name,
            address=address,
            port=port,
            services=self._services,
            tls=self._credentials is not None,
            mutual_tls=self._credentials is not None and self._settings.tls_client_auth,
            auth=self._settings.auth_enabled,
        )
        return int(port)

    async def stop(self, grace: float = 5.0) -> None:
        """Report NOT_SERVING (load balancers drain), then stop after `grace` seconds at most."""
        if not self._started:
            return
        await self.health.enter_graceful_shutdown()
        await self._server.stop(grace)
        self._started = False
        log.info("grpc.stopped", service=self._service_name)

    async def wait(self) -> None:
        await self._server.wait_for_termination()
