"""GrpcServer: health, reflection, error mapping, and one trace from client to event consumer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import grpc
import neo4j.exceptions
import pytest
import redis.exceptions
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from pml.v1 import search_pb2, search_pb2_grpc
from pml_common.bus import EventBus
from pml_common.events import ExecutionCompleted, ExecutionStep
from pml_common.grpc_client import channel
from pml_common.grpc_server import (
    MAX_ERROR_MESSAGE,
    GrpcServer,
    RequestError,
    _ErrorMappingInterceptor,
    check_deadline,
    failed_precondition,
    invalid_argument,
    not_found,
)
from pml_common.settings import Settings
from pml_common.telemetry import setup_telemetry

SERVICE = "pml.v1.SearchService"


class TinySearch(search_pb2_grpc.SearchServiceServicer):
    """GetNode only; the request id picks the behaviour under test."""

    def __init__(self, bus: EventBus | None = None) -> None:
        self.bus = bus
        self.work_done_late: list[str] = []

    async def GetNode(
        self, request: search_pb2.GetNodeRequest, context: grpc.aio.ServicerContext
    ) -> search_pb2.SearchResult:
        match request.id:
            case "bad":
                raise invalid_argument("limit must be between 1 and 100")
            case "missing":
                raise not_found("no tool 'missing'")
            case "early":
                raise failed_precondition("catalog not loaded")
            case "redis-down":
                raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:1")
            case "neo4j-down":
                raise neo4j.exceptions.ServiceUnavailable("cannot reach bolt://127.0.0.1:1")
            case "crash":
                raise ValueError("secret internals")
            case "echo-huge-input":
                raise invalid_argument(f"bad id {'x' * 100_000!r}")
            case "peer":
                return search_pb2.SearchResult(id=request.id, name=context.peer())
            case "slow":
                await asyncio.sleep(0.3)
                check_deadline(context)
                self.work_done_late.append(request.id)
            case "publish":
                assert self.bus is not None
                await self.bus.publish(
                    ExecutionCompleted.create(
                        tenant_id=request.tenant_id,
                        intent="traced",
                        steps=[ExecutionStep(node_id="fs:read", success=True)],
                        outcome="success",
                    )
                )
        return search_pb2.SearchResult(id=request.id, name="node " + request.id)


@pytest.fixture
def servicer() -> TinySearch:
    return TinySearch()


@pytest.fixture
async def served(
    settings: Settings, servicer: TinySearch
) -> AsyncIterator[tuple[GrpcServer, grpc.aio.Channel]]:
    server = GrpcServer(settings, 0, "search-test")
    server.add(lambda s: search_pb2_grpc.add_SearchServiceServicer_to_server(servicer, s), SERVICE)
    port = await server.start()
    assert port > 0
    async with channel(f"127.0.0.1:{port}", settings) as ch:
        yield server, ch
    await server.stop(0)


async def get_node(ch: grpc.aio.Channel, node_id: str, **kw: Any) -> search_pb2.SearchResult:
    stub = search_pb2_grpc.SearchServiceStub(ch)
    reply: search_pb2.SearchResult = await stub.GetNode(
        search_pb2.GetNodeRequest(tenant_id="t", id=node_id), **kw
    )
    return reply


async def status_of(ch: grpc.aio.Channel, node_id: str, **kw: Any) -> tuple[Any, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await get_node(ch, node_id, **kw)
    return err.value.code(), err.value.details() or ""


async def test_served_rpc_answers(served: tuple[GrpcServer, grpc.aio.Channel]) -> None:
    _, ch = served
    reply = await get_node(ch, "fs:read")
    assert reply.id == "fs:read"
    assert reply.name == "node fs:read"


async def test_health_is_serving_then_not_serving_on_stop(settings: Settings) -> None:
    server = GrpcServer(settings, 0, "search-test")
    servicer = TinySearch()
    server.add(lambda s: search_pb2_grpc.add_SearchServiceServicer_to_server(servicer, s), SERVICE)
    port = await server.start()
    async with channel(f"127.0.0.1:{port}", settings) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for name in ("", SERVICE):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await health.Check(health_pb2.HealthCheckRequest(service="pml.v1.Nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    await server.stop(0)
    # The server no longer answers; its health servicer reports what a draining probe saw.
    for name in ("", SERVICE):
        reply = await server.health.Check(health_pb2.HealthCheckRequest(service=name), None)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING, name


async def test_reflection_lists_services(served: tuple[GrpcServer, grpc.aio.Channel]) -> None:
    _, ch = served
    stub = reflection_pb2_grpc.ServerReflectionStub(ch)
    call = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names: list[str] = []
    async for response in call:
        names.extend(s.name for s in response.list_services_response.service)
    assert SERVICE in names
    assert "grpc.health.v1.Health" in names


@pytest.mark.parametrize(
    ("node_id", "code", "message"),
    [
        ("bad", grpc.StatusCode.INVALID_ARGUMENT, "limit must be between 1 and 100"),
        ("missing", grpc.StatusCode.NOT_FOUND, "no tool 'missing'"),
        ("early", grpc.StatusCode.FAILED_PRECONDITION, "catalog not loaded"),
        ("redis-down", grpc.StatusCode.UNAVAILABLE, "ConnectionError"),
        ("neo4j-down", grpc.StatusCode.UNAVAILABLE, "ServiceUnavailable"),
        ("crash", grpc.StatusCode.INTERNAL, "internal error (ValueError)"),
    ],
)
async def test_errors_map_to_status_codes(
    served: tuple[GrpcServer, grpc.aio.Channel], node_id: str, code: Any, message: str
) -> None:
    _, ch = served
    got_code, details = await status_of(ch, node_id)
    assert got_code == code
    assert message in details
    assert "secret internals" not in details
    # The server survives and keeps answering.
    assert (await get_node(ch, "fine")).id == "fine"


async def test_each_methods_handler_is_wrapped_once_and_again_when_it_changes() -> None:
    interceptor = _ErrorMappingInterceptor()
    first = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    second = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    handlers = {"/pml.v1.SearchService/GetNode": first}

    async def continuation(details: Any) -> Any:
        return handlers.get(details.method)

    def call(method: str) -> Any:
        return interceptor.intercept_service(continuation, SimpleNamespace(method=method))

    wrapped = await call("/pml.v1.SearchService/GetNode")
    assert wrapped is not first and wrapped.unary_unary is not None
    assert await call("/pml.v1.SearchService/GetNode") is wrapped
    handlers["/pml.v1.SearchService/GetNode"] = second
    assert await call("/pml.v1.SearchService/GetNode") is not wrapped
    assert await call("/pml.v1.SearchService/Unknown") is None


async def test_error_messages_quoting_huge_input_are_shortened(
    served: tuple[GrpcServer, grpc.aio.Channel],
) -> None:
    _, ch = served
    code, details = await status_of(ch, "echo-huge-input")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("bad id 'xxx")
    assert len(details) == MAX_ERROR_MESSAGE


async def test_messages_over_the_size_limit_are_refused(settings: Settings) -> None:
    small = settings.model_copy(update={"grpc_max_message_bytes": 4096})
    server = GrpcServer(small, 0, "search-test")
    servicer = TinySearch()
    server.add(lambda s: search_pb2_grpc.add_SearchServiceServicer_to_server(servicer, s), SERVICE)
    port = await server.start()
    try:
        # A client allowed to send more than the server accepts.
        async with channel(f"127.0.0.1:{port}", settings) as ch:
            assert (await get_node(ch, "x" * 1000)).id == "x" * 1000
            code, details = await status_of(ch, "x" * 10_000)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in details
        # A client with the same limit refuses to send it at all.
        async with channel(f"127.0.0.1:{port}", small) as ch:
            code, _ = await status_of(ch, "x" * 10_000)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await server.stop(0)


async def test_clients_are_asked_to_reconnect_after_the_connection_age(settings: Settings) -> None:
    """A client holding one channel opens a new connection once the server's age is reached (a
    Kubernetes Service can then send it to another replica), without a failed call."""
    aged = settings.model_copy(update={"grpc_max_connection_age_s": 0.5})
    server = GrpcServer(aged, 0, "search-test")
    server.add(
        lambda s: search_pb2_grpc.add_SearchServiceServicer_to_server(TinySearch(), s), SERVICE
    )
    port = await server.start()
    try:
        async with channel(f"127.0.0.1:{port}", aged) as ch:
            peers = set()
            for _ in range(8):
                peers.add((await get_node(ch, "peer")).name)
                await asyncio.sleep(0.4)
    finally:
        await server.stop(0)
    assert len(peers) >= 2  # the client's address changed: new connections


async def test_unimplemented_rpc(served: tuple[GrpcServer, grpc.aio.Channel]) -> None:
    _, ch = served
    stub = search_pb2_grpc.SearchServiceStub(ch)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Search(search_pb2.SearchRequest(query="x"))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_deadline_is_honoured(
    served: tuple[GrpcServer, grpc.aio.Channel], servicer: TinySearch
) -> None:
    _, ch = served
    got_code, _ = await status_of(ch, "slow", timeout=0.1)
    assert got_code == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.sleep(0.5)
    assert servicer.work_done_late == [], "work went on after the caller's deadline"
    await get_node(ch, "slow", timeout=5)
    assert servicer.work_done_late == ["slow"]


async def test_check_deadline_raises_once_time_is_gone() -> None:
    class Ctx:
        def __init__(self, remaining: float | None) -> None:
            self.remaining = remaining

        def time_remaining(self) -> float | None:
            return self.remaining

    check_deadline(Ctx(None))  # type: ignore[arg-type]
    check_deadline(Ctx(1.0))  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="deadline exceeded") as err:
        check_deadline(Ctx(0.0))  # type: ignore[arg-type]
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_one_trace_from_client_through_server_to_event_consumer(
    settings: Settings, tenant: str
) -> None:
    exporter = InMemorySpanExporter()
    setup_telemetry("pml-test", settings, span_exporter=exporter)
    consumed = asyncio.Event()
    consumer_ctx: list[trace.SpanContext] = []

    async def on_event(event: ExecutionCompleted) -> None:
        if event.tenant_id == tenant:
            consumer_ctx.append(trace.get_current_span().get_span_context())
            consumed.set()

    bus = EventBus(settings, "search-test")
    bus.subscribe(ExecutionCompleted, f"trace-{tenant}", on_event)
    server = GrpcServer(settings, 0, "search-test")
    servicer = TinySearch(bus)
    server.add(lambda s: search_pb2_grpc.add_SearchServiceServicer_to_server(servicer, s), SERVICE)
    async with bus:
        port = await server.start()
        try:
            tracer = trace.get_tracer("test")
            with tracer.start_as_current_span("caller") as caller:
                async with channel(f"127.0.0.1:{port}", settings) as ch:
                    stub = search_pb2_grpc.SearchServiceStub(ch)
                    await stub.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id="publish"))
            await asyncio.wait_for(consumed.wait(), 10)
            await asyncio.sleep(0.2)  # the consumer span ends just after its handler returns
        finally:
            await server.stop(0)

    trace_id = caller.get_span_context().trace_id
    spans = [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]
    by_id = {s.context.span_id: s for s in spans}
    assert consumer_ctx[0].trace_id == trace_id
    consume = by_id[consumer_ctx[0].span_id]
    assert consume.name == "consume ExecutionCompleted"
    assert consume.kind == SpanKind.CONSUMER

    chain: list[ReadableSpan] = [consume]
    while chain[-1].parent is not None:
        chain.append(by_id[chain[-1].parent.span_id])
    kinds = [(s.kind, s.name) for s in chain]
    assert (SpanKind.SERVER, "/pml.v1.SearchService/GetNode") in kinds, kinds
    assert (SpanKind.CLIENT, "/pml.v1.SearchService/GetNode") in kinds, kinds
    assert any(k == SpanKind.PRODUCER for k, _ in kinds), kinds
    assert chain[-1].context.span_id == caller.get_span_context().span_id
    server_span = next(s for s in chain if s.kind == SpanKind.SERVER)
    assert server_span.resource.attributes["service.name"]
