"""Blocking gRPC and event helpers the command line uses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from opentelemetry.instrumentation.grpc import client_interceptor
from opentelemetry.instrumentation.grpc.grpcext import intercept_channel
from rich.console import Console
from rich.table import Table

from pml.v1 import common_pb2, scorer_pb2_grpc, search_pb2, search_pb2_grpc
from pml_common.bus import EventBus
from pml_common.events import Event, ToolSpec
from pml_common.settings import Settings

REGISTER_BATCH = 500


def channel(address: str, settings: Settings) -> grpc.Channel:
    options = [
        ("grpc.max_send_message_length", settings.grpc_max_message_bytes),
        ("grpc.max_receive_message_length", settings.grpc_max_message_bytes),
    ]
    # OpenTelemetry's interceptor has its own channel wrapper (grpcext), not grpc's.
    return intercept_channel(grpc.insecure_channel(address, options), client_interceptor())


def search_stub(settings: Settings) -> search_pb2_grpc.SearchServiceStub:
    return search_pb2_grpc.SearchServiceStub(channel(settings.search_addr, settings))


def scorer_stub(settings: Settings) -> scorer_pb2_grpc.ScorerServiceStub:
    return scorer_pb2_grpc.ScorerServiceStub(channel(settings.scorer_addr, settings))


def tool_message(tool: ToolSpec) -> common_pb2.Tool:
    import json

    return common_pb2.Tool(
        id=tool.id,
        server=tool.server,
        name=tool.name,
        description=tool.description,
        input_schema_json=json.dumps(tool.input_schema) if tool.input_schema is not None else "",
    )


def register_tools(settings: Settings, tenant: str, tools: Sequence[ToolSpec]) -> int:
    stub = search_stub(settings)
    registered = 0
    for start in range(0, len(tools), REGISTER_BATCH):
        batch = [tool_message(t) for t in tools[start : start + REGISTER_BATCH]]
        reply = stub.RegisterTools(
            search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=batch), timeout=600
        )
        registered += reply.registered
    return registered


def search(
    settings: Settings, tenant: str, query: str, limit: int, context: Sequence[str] | None
) -> list[dict[str, Any]]:
    stub = search_stub(settings)
    if context:
        reply = stub.SearchTools(
            search_pb2.SearchToolsRequest(
                tenant_id=tenant,
                query=query,
                limit=limit,
                context_tools=list(context),
                include_related=True,
            ),
            timeout=30,
        )
        return [_as_dict(t) for t in reply.tools]
    result = stub.Search(
        search_pb2.SearchRequest(tenant_id=tenant, query=query, limit=limit), timeout=30
    )
    return [_as_dict(r) for r in result.results]


def _as_dict(message: Any) -> dict[str, Any]:
    return MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def print_results(console: Console, rows: list[dict[str, Any]]) -> None:
    table = Table("#", "id", "final", "semantic", "graph", "reliability")
    for rank, row in enumerate(rows, start=1):
        table.add_row(
            str(rank),
            row.get("id") or row.get("tool_id", ""),
            f"{row.get('final_score', 0):.3f}",
            f"{row.get('semantic_score', 0):.3f}",
            f"{row.get('graph_score', 0):.3f}" if "graph_score" in row else "-",
            f"{row.get('reliability_factor', 0):.1f}",
        )
    console.print(table)


async def publish_events(settings: Settings, events: Sequence[Event]) -> list[str]:
    async with EventBus(settings, "pml-cli") as bus:
        for event in events:
            await bus.publish(event)
    return [e.event_id for e in events]
