"""Blocking gRPC and event helpers the command line uses."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.json_format import MessageToDict
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pml.v1 import (
    common_pb2,
    planner_pb2,
    planner_pb2_grpc,
    scorer_pb2_grpc,
    search_pb2,
    search_pb2_grpc,
)
from pml_cli.eval_runs import retry_unavailable
from pml_cli.phases import phase
from pml_common.grpc_client import blocking_channel
from pml_common.settings import Settings

if TYPE_CHECKING:  # the event models take a tenth of a second to build: not for `pml search`
    from pml_common.events import Event, ToolSpec

REGISTER_BATCH = 500


def channel(address: str, settings: Settings) -> grpc.Channel:
    """A traced channel with the message size limits, TLS and bearer token of `settings`."""
    return blocking_channel(address, settings)


def search_stub(settings: Settings) -> search_pb2_grpc.SearchServiceStub:
    return search_pb2_grpc.SearchServiceStub(channel(settings.search_addr, settings))


@contextmanager
def scratch_tenants(
    settings: Settings, console: Console, *tenants: str, timeout: float = 300.0
) -> Iterator[None]:
    """Tenants a bench or an evaluation fills for itself, deleted when it ends, whether it
    succeeded or failed. Not after an interruption: the user asked to stop now, and a deletion
    waits for what search is still doing for the tenant (a large registration holds it for
    minutes); a private system's stores go with it, and on the running system the tenants left
    are named."""
    try:
        yield
    except KeyboardInterrupt:
        console.print(f"interrupted: tenants left undeleted: {', '.join(tenants)}")
        raise
    except BaseException:
        _delete_tenants(settings, console, tenants, timeout)
        raise
    _delete_tenants(settings, console, tenants, timeout)


def _delete_tenants(
    settings: Settings, console: Console, tenants: Sequence[str], timeout: float
) -> None:
    stub = search_stub(settings)
    with phase(console, f"deleting {' and '.join(tenants)}"):
        for tenant in tenants:
            request = search_pb2.DeleteTenantRequest(tenant_id=tenant)
            retry_unavailable(partial(stub.DeleteTenant, request, timeout=timeout))


def scorer_stub(settings: Settings) -> scorer_pb2_grpc.ScorerServiceStub:
    return scorer_pb2_grpc.ScorerServiceStub(channel(settings.scorer_addr, settings))


def planner_stub(settings: Settings) -> planner_pb2_grpc.PlannerServiceStub:
    return planner_pb2_grpc.PlannerServiceStub(channel(settings.planner_addr, settings))


#: What `method` of PredictNext and SuggestDag accepts; the first is the planner's default.
PLAN_METHODS = ("drdsp", "legacy", "discovery", "search", "blend")


def predict_next(
    settings: Settings, tenant: str, intent: str, context: Sequence[str] | None, method: str
) -> planner_pb2.PredictNextResponse:
    reply: planner_pb2.PredictNextResponse = planner_stub(settings).PredictNext(
        planner_pb2.PredictNextRequest(
            tenant_id=tenant, intent=intent, context_tools=list(context or []), method=method
        ),
        timeout=30,
    )
    return reply


def suggest_dag(
    settings: Settings, tenant: str, intent: str, method: str
) -> planner_pb2.SuggestDagResponse:
    reply: planner_pb2.SuggestDagResponse = planner_stub(settings).SuggestDag(
        planner_pb2.SuggestDagRequest(tenant_id=tenant, intent=intent, method=method), timeout=30
    )
    return reply


def planner_info(settings: Settings, tenant: str) -> planner_pb2.PlannerInfoResponse:
    reply: planner_pb2.PlannerInfoResponse = planner_stub(settings).PlannerInfo(
        planner_pb2.PlannerInfoRequest(tenant_id=tenant), timeout=30
    )
    return reply


def tool_message(tool: ToolSpec) -> common_pb2.Tool:
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
        return [as_dict(t) for t in reply.tools]
    result = stub.Search(
        search_pb2.SearchRequest(tenant_id=tenant, query=query, limit=limit), timeout=30
    )
    return [as_dict(r) for r in result.results]


def as_dict(message: Any) -> dict[str, Any]:
    """A reply as JSON-ready data, with proto field names and default values printed."""
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


def _verdict(confidence: float, threshold: float, accepted: bool) -> str:
    mark = "[green]accepted[/]" if accepted else "[yellow]not accepted[/]"
    return f"{confidence:.3f} (threshold {threshold:.3f}) {mark}"


def _path(ids: Sequence[str]) -> str:
    return escape(" → ".join(ids)) if ids else "-"


def print_next(console: Console, reply: planner_pb2.PredictNextResponse) -> None:
    """The next step, why, and the ranked candidates."""
    console.print(f"[bold]next tool[/]   {escape(reply.next_tool) or '-'}")
    console.print(f"[bold]capability[/]  {escape(reply.target_capability) or '-'}")
    console.print(f"[bold]path[/]        {_path(reply.path)}")
    console.print(
        f"[bold]confidence[/]  {_verdict(reply.confidence, reply.threshold, reply.accepted)}"
    )
    console.print(f"[bold]reason[/]      {escape(reply.reason) or '-'}")
    console.print(f"[bold]method[/]      {escape(reply.method) or '-'}")
    if reply.candidates:
        table = Table("#", "candidate", "score")
        for rank, candidate in enumerate(reply.candidates, start=1):
            table.add_row(str(rank), escape(candidate.tool), f"{candidate.score:.3f}")
        console.print(table)
    else:
        console.print("no candidates")


def print_dag(console: Console, reply: planner_pb2.SuggestDagResponse) -> None:
    """The suggested workflow: nodes, dependency edges and an execution order."""
    console.print(f"[bold]capability[/]  {escape(reply.target_capability) or '-'}")
    console.print(
        f"[bold]confidence[/]  {_verdict(reply.confidence, reply.threshold, reply.accepted)}"
    )
    console.print(f"[bold]reason[/]      {escape(reply.reason) or '-'}")
    console.print(f"[bold]method[/]      {escape(reply.method) or '-'}")
    console.print(f"[bold]nodes[/]       {escape(', '.join(reply.nodes)) or '-'}")
    if reply.composed:
        console.print(f"[bold]composed[/]    {escape(', '.join(reply.composed))}")
    console.print(f"[bold]order[/]       {_path(reply.order)}")
    if reply.edges:
        table = Table("source", "target", "type")
        for edge in reply.edges:
            table.add_row(escape(edge.source), escape(edge.target), escape(edge.type) or "-")
        console.print(table)
    else:
        console.print("no edges")


def print_planner_info(console: Console, reply: planner_pb2.PlannerInfoResponse) -> None:
    """The methods a request naming none gets, and each method's prequential figures."""

    def why(judged: Sequence[int]) -> str:
        if judged and min(judged) >= reply.min_evidence:
            return " (by the figures)"
        return f" (default until every method has {reply.min_evidence} judged)"

    next_why = why([m.predictions for m in reply.methods])
    console.print(f"[bold]next step[/]   {escape(reply.next_method)}{next_why}")
    dag_why = why([m.dags for m in reply.methods])
    console.print(f"[bold]dag[/]         {escape(reply.dag_method)}{dag_why}")
    console.print(
        f"[bold]executions[/]  {reply.executions} judged, {reply.skipped_executions} skipped, "
        f"{reply.unjudged_executions} not judged (search or the scorer failed)"
    )
    console.print(
        f"[bold]blend[/]       transitions {reply.blend_transitions_weight:g}, hyperpath "
        f"{reply.blend_hyperpath_weight:g} (search's order 1)"
    )
    table = Table("method", "predictions", "next_hit@1", "next_hit@3", "dags", "node F1")
    for m in reply.methods:
        table.add_row(*_figure_cells(m), f"{m.next_hit_at_3:.3f}", str(m.dags), f"{m.node_f1:.3f}")
    console.print(table)
    new_work = Table("method", "predictions", "next_hit@1", "dags", "node F1", title="new work")
    for m in reply.new_work_methods:
        new_work.add_row(*_figure_cells(m), str(m.dags), f"{m.node_f1:.3f}")
    console.print(new_work)
    console.print(
        "A method replaces the zero-shot one (the blend, search's order for DAGs) only if it "
        "beats it on all runs beyond noise and is not worse on new work."
    )


def _figure_cells(m: planner_pb2.MethodFigures) -> tuple[str, str, str]:
    return escape(m.method), str(m.predictions), f"{m.next_hit_at_1:.3f}"


async def publish_events(settings: Settings, events: Sequence[Event]) -> list[str]:
    from pml_common.bus import EventBus  # the bus and its Redis client: a second to import

    async with EventBus(settings, "pml-cli") as bus:
        for event in events:
            await bus.publish(event)
    return [e.event_id for e in events]


def consumers_caught_up(
    settings: Settings, events: Sequence[type[Event]], within_s: float
) -> float | None:
    """Seconds until every consumer group of each event type's stream, in turn, has read
    and acknowledged all of it; None if they have not within `within_s`."""
    import redis

    from pml_common.settings import redis_credentials

    def caught_up(store: redis.Redis, stream: str) -> bool:
        if not store.exists(stream):  # nothing published: nothing to read
            return True
        groups = store.xinfo_groups(stream)
        return all(g["pending"] == 0 and not g.get("lag") for g in groups)

    start = time.monotonic()
    with redis.Redis.from_url(settings.redis_url, **redis_credentials(settings)) as store:
        for event in events:
            while not caught_up(store, event.STREAM):
                if time.monotonic() - start >= within_s:
                    return None
                time.sleep(0.5)
    return round(time.monotonic() - start, 1)
