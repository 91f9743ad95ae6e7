"""SearchService over a real gRPC server (port 0), real embedder, Redis, Neo4j and Qdrant."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any, TypeVar

import grpc
import neo4j
import pytest
import redis.asyncio as aioredis

from pml.v1 import common_pb2, search_pb2, search_pb2_grpc
from pml_common.events import GraphChanged, ToolSpec, ToolsRegistered
from pml_common.settings import Settings
from pml_common.testing import eventually
from pml_search.catalog_index import TOOL
from pml_search.main import SearchApp
from pml_search.validation import tool_entry

T = TypeVar("T")

CATALOG = [
    ("filesystem:read_file", "Read the complete contents of a file from the file system."),
    (
        "filesystem:write_file",
        "Create a new file or completely overwrite an existing file with new content.",
    ),
    (
        "filesystem:list_directory",
        "Get a detailed listing of all files and directories in a specified path.",
    ),
    ("playwright:browser_navigate", "Navigate the browser to a URL."),
    ("playwright:browser_take_screenshot", "Take a screenshot of the current page."),
    ("github:create_issue", "Create a new issue in a GitHub repository."),
    ("git:git_commit", "Record changes to the repository with a commit message."),
    ("memory:search_nodes", "Search for nodes in the knowledge graph based on a query."),
]


def tools(catalog: list[tuple[str, str]] = CATALOG) -> list[common_pb2.Tool]:
    return [
        common_pb2.Tool(id=i, server=i.split(":")[0], name=i.split(":")[1], description=d)
        for i, d in catalog
    ]


async def write_tool_stats(
    driver: neo4j.AsyncDriver, tenant: str, tool_id: str, executions: int, successes: int
) -> None:
    await driver.execute_query(
        """
        MERGE (t:Tool {tenant_id: $tenant, id: $id})
        SET t.executions = $executions, t.successes = $successes,
            t.success_rate = CASE WHEN $executions > 0
                                  THEN toFloat($successes) / $executions END
        """,
        {"tenant": tenant, "id": tool_id, "executions": executions, "successes": successes},
    )


async def write_link(
    driver: neo4j.AsyncDriver, tenant: str, src: str, dst: str, weight: float, **props: Any
) -> None:
    await driver.execute_query(
        """
        MERGE (a:Tool {tenant_id: $tenant, id: $src})
        MERGE (b:Tool {tenant_id: $tenant, id: $dst})
        MERGE (a)-[l:LINK {type: $type}]->(b)
        SET l.weight = $weight, l.source = $source, l.count = 1
        """,
        {
            "tenant": tenant,
            "src": src,
            "dst": dst,
            "weight": weight,
            "type": props.get("type", "sequence"),
            "source": props.get("source", "observed"),
        },
    )


async def register(stub: search_pb2_grpc.SearchServiceStub, tenant: str) -> None:
    reply = await stub.RegisterTools(
        search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=tools()), timeout=60
    )
    assert reply.registered == len(CATALOG)
    assert len(reply.event_ids) == 1


async def search_ids(
    stub: search_pb2_grpc.SearchServiceStub, tenant: str, query: str, **fields: Any
) -> list[str]:
    reply = await stub.Search(
        search_pb2.SearchRequest(tenant_id=tenant, query=query, **fields), timeout=30
    )
    return [r.id for r in reply.results]


async def status_of(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


async def test_register_then_search_finds_read_file_first(
    stub: search_pb2_grpc.SearchServiceStub, tenant: str
) -> None:
    await register(stub, tenant)
    reply = await stub.Search(
        search_pb2.SearchRequest(tenant_id=tenant, query="read a file", limit=3), timeout=30
    )
    assert reply.results[0].id == "filesystem:read_file"
    assert len(reply.results) == 3
    top = reply.results[0]
    assert top.kind == search_pb2.NODE_KIND_TOOL
    assert top.server == "filesystem"
    assert top.name == "read_file"
    assert top.reliability_factor == 1.0  # never executed: neutral
    assert not top.HasField("success_rate")
    assert top.final_score == pytest.approx(min(top.semantic_score, 0.95))
    scores = [r.final_score for r in reply.results]
    assert scores == sorted(scores, reverse=True)
    stages = [t.stage for t in reply.timings]
    assert {"validate", "embed", "retrieve", "graph", "rank"} <= set(stages)
    assert all(t.ms >= 0 for t in reply.timings)


async def test_search_kinds_filter_and_min_semantic_score(
    stub: search_pb2_grpc.SearchServiceStub, tenant: str
) -> None:
    await register(stub, tenant)
    await stub.RegisterCapabilities(
        search_pb2.RegisterCapabilitiesRequest(
            tenant_id=tenant,
            capabilities=[
                common_pb2.Capability(
                    id="cap:screenshot_site",
                    name="screenshot a web site",
                    description="Open a URL in the browser and save a screenshot of it.",
                    tools=["playwright:browser_navigate", "playwright:browser_take_screenshot"],
                )
            ],
        ),
        timeout=60,
    )
    both = await search_ids(stub, tenant, "take a screenshot of a web page", limit=20)
    assert "cap:screenshot_site" in both
    assert len(both) == len(CATALOG) + 1
    caps = await stub.Search(
        search_pb2.SearchRequest(
            tenant_id=tenant,
            query="take a screenshot of a web page",
            kinds=[search_pb2.NODE_KIND_CAPABILITY],
        ),
        timeout=30,
    )
    assert [(r.id, r.kind) for r in caps.results] == [
        ("cap:screenshot_site", search_pb2.NODE_KIND_CAPABILITY)
    ]
    node = await stub.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id="cap:screenshot_site"))
    assert (node.kind, node.name, node.executions) == (
        search_pb2.NODE_KIND_CAPABILITY,
        "screenshot a web site",
        0,
    )
    assert not node.HasField("success_rate")
    only_tools = await search_ids(
        stub, tenant, "take a screenshot", kinds=[search_pb2.NODE_KIND_TOOL], limit=20
    )
    assert "cap:screenshot_site" not in only_tools
    assert only_tools[0] == "playwright:browser_take_screenshot"
    # a threshold between the best and the worst semantic score keeps only those above it
    full = await stub.Search(
        search_pb2.SearchRequest(tenant_id=tenant, query="take a screenshot", limit=20),
        timeout=30,
    )
    semantic = sorted(r.semantic_score for r in full.results)
    cut = (semantic[0] + semantic[-1]) / 2
    kept = await stub.Search(
        search_pb2.SearchRequest(
            tenant_id=tenant, query="take a screenshot", limit=20, min_semantic_score=cut
        ),
        timeout=30,
    )
    assert 0 < len(kept.results) < len(full.results)
    assert all(r.semantic_score >= cut for r in kept.results)


async def test_reliability_reorders_once_graph_stats_show_a_failing_tool(
    app: SearchApp,
    stub: search_pb2_grpc.SearchServiceStub,
    graph_db: neo4j.AsyncDriver,
    tenant: str,
) -> None:
    await register(stub, tenant)
    before = await search_ids(stub, tenant, "read a file", limit=5)
    assert before[0] == "filesystem:read_file"

    # The trainer records 10 runs of read_file with 2 successes, and 20/20 for write_file...
    await write_tool_stats(graph_db, tenant, "filesystem:read_file", 10, 2)
    await write_tool_stats(graph_db, tenant, "filesystem:write_file", 20, 20)
    # ...and the ranking does not change until it announces it (the view is cached)...
    assert await search_ids(stub, tenant, "read a file", limit=5) == before
    # ...then publishes GraphChanged, which search consumes.
    await app.bus.publish(
        GraphChanged.create(
            tenant_id=tenant,
            reason="test",
            node_ids=["filesystem:read_file", "filesystem:write_file"],
        )
    )

    async def results() -> list[search_pb2.SearchResult]:
        reply = await stub.Search(
            search_pb2.SearchRequest(tenant_id=tenant, query="read a file", limit=20), timeout=30
        )
        return list(reply.results)

    after = await eventually(results, lambda rs: rs[0].id != "filesystem:read_file")
    by_id = {r.id: r for r in after}
    failing = by_id["filesystem:read_file"]
    assert failing.reliability_factor == pytest.approx(0.1)
    assert failing.success_rate == pytest.approx(0.2)
    assert failing.executions == 10
    assert failing.final_score == pytest.approx(failing.semantic_score * 0.1)
    reliable = by_id["filesystem:write_file"]
    assert reliable.reliability_factor == pytest.approx(1.2)
    assert reliable.final_score == pytest.approx(min(reliable.semantic_score * 1.2, 0.95))
    assert after[0].id == "filesystem:write_file"
    assert [r.id for r in after].index("filesystem:read_file") > before.index(
        "filesystem:read_file"
    )


async def test_search_tools_with_context_uses_graph(
    app: SearchApp,
    stub: search_pb2_grpc.SearchServiceStub,
    graph_db: neo4j.AsyncDriver,
    tenant: str,
) -> None:
    await register(stub, tenant)
    nav, shot = "playwright:browser_navigate", "playwright:browser_take_screenshot"
    write, read = "filesystem:write_file", "filesystem:read_file"
    # nav -> shot -> write, and read -> write: shot and read share the neighbour write.
    await write_link(graph_db, tenant, nav, shot, 1.0, type="dependency")
    await write_link(graph_db, tenant, shot, write, 0.5)
    await write_link(graph_db, tenant, read, write, 0.8)

    plain = await stub.SearchTools(
        search_pb2.SearchToolsRequest(tenant_id=tenant, query="save an image", limit=8),
        timeout=30,
    )
    assert plain.alpha == 1.0
    assert all(t.graph_score == 0.0 for t in plain.tools)
    assert all(t.final_score == pytest.approx(t.semantic_score) for t in plain.tools)

    await app.bus.publish(GraphChanged.create(tenant_id=tenant, reason="test"))

    async def with_context() -> search_pb2.SearchToolsResponse:
        return await stub.SearchTools(
            search_pb2.SearchToolsRequest(
                tenant_id=tenant,
                query="save an image",
                limit=8,
                context_tools=[nav],
                include_related=True,
            ),
            timeout=30,
        )

    reply = await eventually(
        with_context, lambda r: any(t.graph_score > 0 for t in r.tools), within_s=20
    )
    assert reply.alpha == pytest.approx(0.8)  # 3 edges: sparse graph
    by_id = {t.tool_id: t for t in reply.tools}
    assert by_id[shot].graph_score == 1.0  # direct neighbour of the context tool
    # write is two hops from nav through shot (degree 2, weaker edge 0.5): AA = 0.5/ln 2
    assert by_id[write].graph_score == pytest.approx(min(0.5 / 0.6931471805599453 / 2, 1.0))
    assert by_id[read].graph_score == 0.0
    for t in reply.tools:
        expected = min(0.8 * t.semantic_score + 0.2 * t.graph_score, 0.95)
        assert t.final_score == pytest.approx(expected)
    finals = [t.final_score for t in reply.tools]
    assert finals == sorted(finals, reverse=True)
    related = {(r.tool_id, r.relation, round(r.score, 6)) for r in by_id[shot].related_tools}
    assert related == {(nav, "often_before", 1.0), (write, "often_after", 0.5)}
    plain_rank = [t.tool_id for t in plain.tools].index(shot)
    assert [t.tool_id for t in reply.tools].index(shot) <= plain_rank
    assert {"validate", "embed", "retrieve", "graph", "rerank", "related"} <= {
        s.stage for s in reply.timings
    }


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"query": ""}, "query"),
        ({"query": "  \t "}, "query"),
        ({"query": "x" * 100_001}, "the maximum is 100000"),
        ({"query": "read", "limit": -1}, "limit"),
        ({"query": "read", "limit": 101}, "limit"),
        ({"query": "read", "kinds": [7]}, "kinds"),
        ({"query": "read", "kinds": [1, 2, 1]}, "kinds holds 3 values; at most 2"),
        ({"tenant_id": "a\nb", "query": "read"}, "control characters"),
        ({"query": "read", "min_semantic_score": 1.5}, "min_semantic_score"),
    ],
)
async def test_search_rejects_bad_input(
    stub: search_pb2_grpc.SearchServiceStub, tenant: str, fields: dict[str, Any], fragment: str
) -> None:
    code, details = await status_of(
        stub.Search(search_pb2.SearchRequest(**{"tenant_id": tenant, **fields}), timeout=30)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in details


async def test_search_tools_unknown_context_is_not_found_naming_ids(
    stub: search_pb2_grpc.SearchServiceStub, tenant: str
) -> None:
    await register(stub, tenant)
    code, details = await status_of(
        stub.SearchTools(
            search_pb2.SearchToolsRequest(
                tenant_id=tenant,
                query="read a file",
                context_tools=["filesystem:read_file", "nope:ghost", "nope:phantom"],
            ),
            timeout=30,
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND
    assert "nope:ghost" in details and "nope:phantom" in details
    assert "filesystem:read_file" not in details
    code, details = await status_of(
        stub.SearchTools(
            search_pb2.SearchToolsRequest(
                tenant_id=tenant, query="read a file", context_tools=["not a tool id"]
            ),
            timeout=30,
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "context_tools" in details


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        (common_pb2.Tool(id="no_server_part", name="x"), "<server>:<tool>"),
        (common_pb2.Tool(id="fs:has\ttab", name="x"), "control characters"),
        (common_pb2.Tool(id="fs :spaced", name="x"), "spaces around"),
        (
            common_pb2.Tool(
                id="fs:deep", name="d", input_schema_json='{"a":' * 300 + "1" + "}" * 300
            ),
            "nested deeper than 64 levels",
        ),
        (common_pb2.Tool(id="fs:nameless", name="  "), "name must not be empty"),
        (common_pb2.Tool(id="fs:x", server="other", name="x"), "does not match"),
        (common_pb2.Tool(id="fs:y", name="y", input_schema_json="[1"), "input_schema_json"),
        (common_pb2.Tool(id="filesystem:read_file", name="dup"), "more than once"),
        (common_pb2.Tool(id="fs:" + "x" * 600, name="x"), "longer than 512 characters"),
        (
            common_pb2.Tool(id="fs:z", name="z", input_schema_json='{"a":' * 200_000),
            "input_schema_json is longer than 100000",
        ),
        (
            common_pb2.Tool(id="fs:z", name="z", input_schema_json="[" * 90_000),
            "nested too deeply",
        ),
    ],
)
async def test_bad_tool_batch_is_rejected_and_stores_nothing(
    stub: search_pb2_grpc.SearchServiceStub, tenant: str, bad: common_pb2.Tool, fragment: str
) -> None:
    batch = [*tools(CATALOG[:2]), bad]
    code, details = await status_of(
        stub.RegisterTools(search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=batch))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in details
    assert "nothing was registered" in details
    code, _ = await status_of(
        stub.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id="filesystem:read_file"))
    )
    assert code == grpc.StatusCode.NOT_FOUND
    assert await search_ids(stub, tenant, "read a file") == []


async def test_register_and_get_node_errors(
    stub: search_pb2_grpc.SearchServiceStub, tenant: str
) -> None:
    code, details = await status_of(
        stub.RegisterTools(search_pb2.RegisterToolsRequest(tenant_id=tenant))
    )
    assert (code, "tools must not be empty") == (grpc.StatusCode.INVALID_ARGUMENT, details)
    code, details = await status_of(
        stub.RegisterCapabilities(
            search_pb2.RegisterCapabilitiesRequest(
                tenant_id=tenant,
                capabilities=[common_pb2.Capability(id="c1", name="ok", tools=["bad tool"])],
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "'bad tool'" in details
    code, details = await status_of(
        stub.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id="fs:nothing"))
    )
    assert code == grpc.StatusCode.NOT_FOUND
    assert "fs:nothing" in details
    code, _ = await status_of(stub.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id="")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, details = await status_of(
        stub.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id="fs:" + "x" * 600))
    )
    assert (code, details) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "id is longer than 512 characters",
    )
    code, details = await status_of(stub.DeleteTenant(search_pb2.DeleteTenantRequest()))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "tenant_id" in details


@pytest.mark.parametrize(
    ("capability", "fragment"),
    [
        (
            common_pb2.Capability(id="c", name="c", tools=[f"fs:t{i}" for i in range(1001)]),
            "at most 1000 tools and 1000 capabilities",
        ),
        (
            common_pb2.Capability(id="c", name="c", capabilities=[f"k{i}" for i in range(1001)]),
            "at most 1000 tools and 1000 capabilities",
        ),
        (
            common_pb2.Capability(id="c", name="c", capabilities=["k" * 513]),
            "capabilities must hold ids of 1 to 512 characters",
        ),
        (
            common_pb2.Capability(id="c", name="c", tools=["fs:" + "t" * 600]),
            "tools must be tool ids",
        ),
    ],
)
async def test_capability_fan_out_and_id_lengths_are_bounded(
    stub: search_pb2_grpc.SearchServiceStub,
    tenant: str,
    capability: common_pb2.Capability,
    fragment: str,
) -> None:
    code, details = await status_of(
        stub.RegisterCapabilities(
            search_pb2.RegisterCapabilitiesRequest(tenant_id=tenant, capabilities=[capability])
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in details
    assert len(details) < 2000  # the huge ids are quoted by their start only


async def test_tenant_isolation_default_tenant_and_delete(
    stub: search_pb2_grpc.SearchServiceStub, tenant: str
) -> None:
    other = tenant + "-other"
    await register(stub, tenant)
    assert await search_ids(stub, other, "read a file") == []
    code, _ = await status_of(
        stub.GetNode(search_pb2.GetNodeRequest(tenant_id=other, id="filesystem:read_file"))
    )
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await status_of(
        stub.SearchTools(
            search_pb2.SearchToolsRequest(
                tenant_id=other, query="read", context_tools=["filesystem:read_file"]
            )
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND

    # An empty tenant_id is the default tenant (settings.default_tenant = "default").
    await stub.RegisterTools(
        search_pb2.RegisterToolsRequest(tools=tools([("fetch:fetch", "Fetch a URL from the web")]))
    )
    assert await search_ids(stub, "default", "download a web page") == ["fetch:fetch"]
    node = await stub.GetNode(search_pb2.GetNodeRequest(id="fetch:fetch"))
    assert node.description == "Fetch a URL from the web"
    assert await search_ids(stub, tenant, "download a web page", limit=20) != ["fetch:fetch"]

    deleted = await stub.DeleteTenant(search_pb2.DeleteTenantRequest(tenant_id=tenant))
    assert deleted.deleted == len(CATALOG)
    assert deleted.event_id
    assert await search_ids(stub, tenant, "read a file") == []
    assert await search_ids(stub, "default", "download a web page") == ["fetch:fetch"]


async def test_events_index_and_rpc_work_is_not_redone(
    app: SearchApp, stub: search_pb2_grpc.SearchServiceStub, tenant: str
) -> None:
    await register(stub, tenant)
    # The ToolsRegistered the RPC published is consumed: the hashes match, nothing is rewritten.
    same = [
        tool_entry(
            tenant, ToolSpec(id=i, server=i.split(":")[0], name=i.split(":")[1], description=d)
        )
        for i, d in CATALOG
    ]
    result = await app.catalog.index(tenant, TOOL, same)
    assert (result.indexed, result.unchanged) == (0, len(CATALOG))

    # A catalog event published by someone else is indexed by the search consumer.
    spec = ToolSpec(
        id="slack:post_message",
        server="slack",
        name="post_message",
        description="Post a message to a Slack channel",
    )
    await app.bus.publish(ToolsRegistered.create(tenant_id=tenant, tools=[spec]))
    found = await eventually(
        lambda: search_ids(stub, tenant, "send a chat message to my team", limit=1),
        lambda ids: ids == ["slack:post_message"],
    )
    assert found == ["slack:post_message"]
    # A changed description is re-embedded; the same content again is not.
    changed = tool_entry(tenant, spec.model_copy(update={"description": "Post to Slack"}))
    assert (await app.catalog.index(tenant, TOOL, [changed])).indexed == 1
    assert (await app.catalog.index(tenant, TOOL, [changed])).indexed == 0


REAL_NAMES = [
    # Ids keep the servers' real names: spaces, dots, any script.
    ("MCP Jupiter:jupiter_get_quote", "MCP Jupiter", "Get a swap quote for two Solana tokens."),
    ("pure.md MCP server:unblock-url", "pure.md MCP server", "Fetch a web page as markdown."),
    ("Яндекс Трекер:создать_задачу", "Яндекс Трекер", "Создать задачу в трекере."),
    # A server name holding the separator, which its id spells another way.
    (
        "Peekaboo MCP - Lightning-fast macOS Screenshots:image",
        "Peekaboo MCP: Lightning-fast macOS Screenshots",
        "Capture a screenshot of the macOS screen or of one window.",
    ),
]


async def test_real_server_names_register_and_a_pasted_intent_searches(
    stub: search_pb2_grpc.SearchServiceStub, tenant: str, settings: Settings
) -> None:
    batch = [
        common_pb2.Tool(id=i, server=s, name=i.partition(":")[2], description=d)
        for i, s, d in REAL_NAMES
    ]
    reply = await stub.RegisterTools(
        search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=batch), timeout=60
    )
    assert reply.registered == len(REAL_NAMES)
    for tool_id, server, _ in REAL_NAMES:
        node = await stub.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id=tool_id))
        assert (node.id, node.server) == (tool_id, server)
    # An intent of 18,000+ characters (a pasted image) is accepted; its start is what is embedded.
    pasted = "take a screenshot of the screen " + "iVBORw0KGgoAAAANSUhEUgAA" * 760
    assert len(pasted) > 18_000
    found = await search_ids(stub, tenant, pasted, limit=2)
    assert found[0] == REAL_NAMES[3][0]
    context = await stub.SearchTools(
        search_pb2.SearchToolsRequest(
            tenant_id=tenant, query=pasted, context_tools=[REAL_NAMES[0][0]], limit=2
        ),
        timeout=30,
    )
    assert context.tools
    # ...and travels in the registration event as registered.
    rows = await app_redis_events(settings, reply.event_ids[0])
    assert [t["id"] for t in rows["tools"]] == [i for i, _, _ in REAL_NAMES]


async def app_redis_events(settings: Settings, entry_id: str) -> dict[str, Any]:
    """The ToolsRegistered event of stream entry `entry_id`, as it stands in its stream."""
    client = aioredis.Redis.from_url(settings.redis_url)
    try:
        entries = await client.xrange(ToolsRegistered.STREAM, min=entry_id, max=entry_id)
    finally:
        await client.aclose()
    assert entries, f"entry {entry_id} not in {ToolsRegistered.STREAM}"
    body: dict[str, Any] = json.loads(entries[0][1][b"data"])
    return body
