"""One `PlannerService.SuggestDag` call is one trace: planner → scorer and search over gRPC, and
the Neo4j queries each of them sends, every span linked to its parent."""

from __future__ import annotations

import uuid

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from pml.v1 import common_pb2, planner_pb2, planner_pb2_grpc, search_pb2, search_pb2_grpc
from pml_common.events import CapabilitySpec, ToolSpec
from pml_common.grpc_client import channel
from pml_common.local_runtime import free_port
from pml_common.settings import Settings
from pml_common.stores import neo4j_driver
from pml_common.testing import eventually
from pml_planner.main import serve as serve_planner
from pml_scorer.main import serve as serve_scorer
from pml_search.main import serve as serve_search
from pml_trainer.graph_store import GraphStore

from .traces import Trace, assert_local_child, assert_remote_child, serving

TOOLS = {
    "report:build_weekly": "Build the weekly activity report as a PDF.",
    "mail:send": "Send an email with attachments to a list of recipients.",
}
CAPABILITY = CapabilitySpec(
    id="report-by-mail",
    name="report-by-mail",
    description="Share the weekly report with the team by email",
    tools=list(TOOLS),
)
SUGGEST = "/pml.v1.PlannerService/SuggestDag"
SCORE = "/pml.v1.ScorerService/ScoreCapabilities"
SEARCH = "/pml.v1.SearchService/Search"


def _on_free_ports(settings: Settings) -> Settings:
    ports = {"search_port": free_port(), "scorer_port": free_port(), "planner_port": free_port()}
    return settings.model_copy(
        update={
            **ports,
            "search_addr": f"127.0.0.1:{ports['search_port']}",
            "scorer_addr": f"127.0.0.1:{ports['scorer_port']}",
            "planner_addr": f"127.0.0.1:{ports['planner_port']}",
        }
    )


async def _register_catalog(settings: Settings, tenant: str) -> None:
    """The catalog in search's index (its RPCs) and in the graph (the trainer's writes)."""
    async with channel(settings.search_addr, settings) as search_channel:
        search = search_pb2_grpc.SearchServiceStub(search_channel)
        await search.RegisterTools(
            search_pb2.RegisterToolsRequest(
                tenant_id=tenant,
                tools=[
                    common_pb2.Tool(id=t, server=t.split(":")[0], name=t, description=d)
                    for t, d in TOOLS.items()
                ],
            ),
            timeout=60,
        )
        await search.RegisterCapabilities(
            search_pb2.RegisterCapabilitiesRequest(
                tenant_id=tenant,
                capabilities=[
                    common_pb2.Capability(
                        id=CAPABILITY.id,
                        name=CAPABILITY.name,
                        description=CAPABILITY.description,
                        tools=CAPABILITY.tools,
                    )
                ],
            ),
            timeout=60,
        )
    driver = neo4j_driver(settings)
    try:
        graph = GraphStore(driver, settings.neo4j_database)
        await graph.ensure_schema()
        tools = [
            ToolSpec(id=t, server=t.split(":")[0], name=t, description=d) for t, d in TOOLS.items()
        ]
        await graph.register_tools(tenant, uuid.uuid4().hex, tools)
        await graph.learn_capability(tenant, uuid.uuid4().hex, CAPABILITY)
    finally:
        await driver.close()


async def _suggest_dag(settings: Settings, tenant: str) -> planner_pb2.SuggestDagResponse:
    async with channel(settings.planner_addr, settings) as planner_channel:
        return await planner_pb2_grpc.PlannerServiceStub(planner_channel).SuggestDag(
            planner_pb2.SuggestDagRequest(tenant_id=tenant, intent="send the weekly report"),
            timeout=60,
        )


def _neo4j_children(trace: Trace, span: ReadableSpan) -> list[ReadableSpan]:
    return [
        s for s in trace.children(span) if dict(s.attributes or {}).get("db.system.name") == "neo4j"
    ]


async def test_one_suggest_dag_call_is_one_trace_across_services_and_neo4j(
    settings: Settings, tenant: str, exporter: InMemorySpanExporter
) -> None:
    settings = _on_free_ports(settings)
    async with serving(
        [
            ("search", lambda: serve_search(settings), settings.search_addr),
            ("scorer", lambda: serve_scorer(settings), settings.scorer_addr),
            ("planner", lambda: serve_planner(settings), settings.planner_addr),
        ]
    ):
        # A first tenant warms the system up (Neo4j's query plans, the embedder), so that the
        # traced call does not meet the planner's deadline on the scorer on a busy machine.
        warm_up = f"{tenant}-warm-up"
        for name in (warm_up, tenant):
            await _register_catalog(settings, name)
        await _suggest_dag(settings, warm_up)
        exporter.clear()
        reply = await _suggest_dag(settings, tenant)
        # The planner answered with the capability's DAG (the scorer is untrained: search chose).
        assert reply.target_capability == CAPABILITY.id
        assert set(reply.nodes) == {CAPABILITY.id, *TOOLS}

        client = next(
            s
            for s in exporter.get_finished_spans()
            if s.name == SUGGEST and s.kind is SpanKind.CLIENT
        )

        async def finished() -> Trace:
            return Trace.of(exporter, client.context.trace_id)

        # search twice: the capabilities (untrained model), then the tools of the request's
        # one sub-goal (what `SuggestDag` composes from), a client and a server span each
        trace = await eventually(finished, lambda t: len(t.named(SEARCH)) == 4)

    assert trace.assert_one_tree() is client
    planner = trace.one(SUGGEST, SpanKind.SERVER)
    assert_remote_child(trace, planner, client)
    attrs = dict(planner.attributes or {})
    assert attrs["pml.tenant_id"] == tenant
    assert attrs["pml.planner.method"] == "drdsp"
    assert attrs["pml.planner.target"] == CAPABILITY.id
    assert attrs["pml.planner.target_source"] == "search"
    assert attrs["rpc.system"] == "grpc"

    # planner → scorer, then (untrained model) planner → search, each over gRPC.
    out = trace.one(SCORE, SpanKind.CLIENT)
    assert_local_child(trace, out, planner)
    assert_remote_child(trace, trace.one(SCORE, SpanKind.SERVER), out)
    searches = trace.named(SEARCH, SpanKind.SERVER)
    for out in trace.named(SEARCH, SpanKind.CLIENT):
        assert_local_child(trace, out, planner)
        [served] = [s for s in searches if s.parent and s.parent.span_id == out.context.span_id]
        assert_remote_child(trace, served, out)
    scorer = trace.one(SCORE, SpanKind.SERVER)
    for server in (scorer, *searches):  # every server names the tenant
        assert dict(server.attributes or {})["pml.tenant_id"] == tenant

    # The planner read the tenant's hypergraph, the scorer its tool graph, in their requests.
    planner_reads = _neo4j_children(trace, planner)
    assert {s.name for s in planner_reads} >= {"CALL MATCH Tool MATCH Capability"}
    assert len(planner_reads) == 3  # nodes, members, links
    scorer_reads = _neo4j_children(trace, scorer)
    assert {s.name for s in scorer_reads} == {
        "MATCH Tool",
        "MATCH Capability OPTIONAL MATCH CONTAINS",
    }
    search_reads = [s for server in searches for s in _neo4j_children(trace, server)]
    assert search_reads, "search's graph reads (reliability) are not in the trace"
    for span in (*planner_reads, *scorer_reads, *search_reads):
        assert span.kind is SpanKind.CLIENT
        attrs = dict(span.attributes or {})
        assert "$tenant" in str(attrs["db.query.text"])
        assert attrs["db.namespace"] == settings.neo4j_database
