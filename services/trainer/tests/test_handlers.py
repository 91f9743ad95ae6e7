"""Handlers with the real bus, embedder, Redis and Neo4j: what changes, and what is announced."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from pml_common.bus import EVENT_FIELD, EventBus
from pml_common.embedding import build_embedder
from pml_common.events import (
    CapabilityLearned,
    CapabilitySpec,
    ExecutionCompleted,
    ExecutionStep,
    GraphChanged,
    Streams,
    TenantDeleted,
    ToolSpec,
    ToolsRegistered,
    parse_event,
)
from pml_common.graph_statistics import SOURCE_MULTIPLIER
from pml_common.settings import Settings
from pml_trainer.cold_start import ColdStartConfig, load_templates
from pml_trainer.graph_store import GraphStore
from pml_trainer.handlers import TrainerHandlers

from .test_cold_start import SEED_004

# Descriptions of the seed-004 tools as their MCP servers publish them (abridged).
DESCRIPTIONS = {
    "tavily:tavily-search": "A powerful web search tool that provides real-time results.",
    "tavily:tavily-extract": "Extract and process raw content from web pages.",
    "exa:search": "Search the web using Exa AI.",
    "memory:create_entities": "Create multiple new entities in the knowledge graph.",
    "memory:add_observations": "Add new observations to existing entities in the graph.",
    "memory:search_nodes": "Search for nodes in the knowledge graph based on a query.",
    "memory:open_nodes": "Open specific nodes in the knowledge graph by their names.",
    "filesystem:read_file": "Read the complete contents of a file from the file system.",
    "filesystem:read_multiple_files": "Read the contents of multiple files simultaneously.",
    "filesystem:write_file": "Create a new file or overwrite an existing file with new content.",
    "filesystem:list_directory": "Get a detailed listing of all files and directories in a path.",
    "playwright:playwright_navigate": "Navigate to a URL in the browser.",
    "playwright:playwright_screenshot": "Take a screenshot of the current page or an element.",
    "playwright:playwright_click": "Click an element on the page.",
    "playwright:playwright_fill": "Fill out an input field.",
}


def tool_specs() -> list[ToolSpec]:
    specs = []
    for tool_id, description in DESCRIPTIONS.items():
        server, _, name = tool_id.partition(":")
        specs.append(ToolSpec(id=tool_id, server=server, name=name, description=description))
    return specs


@pytest.fixture
async def handlers(
    store: GraphStore, settings: Settings, redis: aioredis.Redis
) -> AsyncIterator[TrainerHandlers]:
    async with EventBus(settings, "trainer-test") as bus:
        yield TrainerHandlers(
            store,
            bus,
            build_embedder(settings, redis),
            load_templates(),
            ColdStartConfig(similarity_threshold=settings.cold_start_similarity),
        )


async def announced(redis: aioredis.Redis, tenant: str) -> list[GraphChanged]:
    # The stream is shared with other tests, some of which write entries that are not events.
    entries = await redis.xrange(Streams.GRAPH_CHANGED)
    payloads = [f[EVENT_FIELD.encode()] for _, f in entries if EVENT_FIELD.encode() in f]
    events = [parse_event(p) for p in payloads if tenant.encode() in p]
    return [e for e in events if isinstance(e, GraphChanged) and e.tenant_id == tenant]


async def test_registration_builds_seed_004_edges_and_announces_them(
    handlers: TrainerHandlers, store: GraphStore, redis: aioredis.Redis, tenant: str
) -> None:
    event = ToolsRegistered.create(tenant_id=tenant, tools=tool_specs())
    await handlers.on_tools_registered(event)
    edges = {(e.src, e.dst, e.type): e for e in await store.edges(tenant)}
    for src, dst in (pair for pairs in SEED_004.values() for pair in pairs):
        edge = edges[(src, dst, "sequence")]
        # A template edge, unless a heavier guess (similarity) covers the same pair.
        assert edge.weight >= 0.5 * SOURCE_MULTIPLIER["template"] - 1e-9, edge
        assert edge.source in ("template", "inferred") and edge.count == 0
    assert any(e.origin == "template" for e in edges.values())
    same_server = [e for e in edges.values() if e.origin == "same_server"]
    assert same_server and all(e.src.split(":")[0] == e.dst.split(":")[0] for e in same_server)
    [changed] = await announced(redis, tenant)
    assert changed.reason == "tools_registered"
    assert set(DESCRIPTIONS) <= set(changed.node_ids)

    # The same event again (a redelivery) changes nothing and announces nothing.
    before = await store.edges(tenant)
    await handlers.on_tools_registered(event)
    assert await store.edges(tenant) == before
    assert len(await announced(redis, tenant)) == 1


async def test_duplicate_execution_is_not_announced(
    handlers: TrainerHandlers, store: GraphStore, redis: aioredis.Redis, tenant: str
) -> None:
    event = ExecutionCompleted.create(
        tenant_id=tenant,
        intent="save a page",
        steps=[
            ExecutionStep(node_id="fetch:fetch", success=True),
            ExecutionStep(node_id="filesystem:write_file", success=False),
        ],
        outcome="failure",
        capability_id="save-page",
    )
    await handlers.on_execution_completed(event)
    await handlers.on_execution_completed(event)
    [changed] = await announced(redis, tenant)
    assert changed.reason == "execution_completed"
    assert changed.node_ids == ["fetch:fetch", "filesystem:write_file", "save-page"]
    stats = await store.success_stats(tenant, ["filesystem:write_file", "save-page"])
    assert stats["filesystem:write_file"].executions == 1
    assert stats["save-page"].success_rate == 0.0


async def test_a_batch_of_executions_of_two_tenants_is_applied_in_order_each_once(
    handlers: TrainerHandlers, store: GraphStore, redis: aioredis.Redis, tenant: str
) -> None:
    """One read batch, one transaction: every new execution counted for its own tenant and
    announced, an event already applied (a redelivery inside a batch) neither."""
    other = f"{tenant}-b"

    def run(owner: str, ok: bool) -> ExecutionCompleted:
        return ExecutionCompleted.create(
            tenant_id=owner,
            intent="read a file",
            steps=[ExecutionStep(node_id="filesystem:read_file", success=ok)],
            outcome="success" if ok else "failure",
        )

    first = run(tenant, True)
    await handlers.on_execution_completed(first)
    batch = [run(tenant, False), first, run(other, True), run(other, True), run(tenant, True)]
    await handlers.on_executions_completed(batch)
    mine = (await store.success_stats(tenant, ["filesystem:read_file"]))["filesystem:read_file"]
    theirs = (await store.success_stats(other, ["filesystem:read_file"]))["filesystem:read_file"]
    assert (mine.executions, mine.successes) == (3, 2)
    assert (theirs.executions, theirs.successes) == (2, 2)
    assert len(await announced(redis, tenant)) == 3
    assert len(await announced(redis, other)) == 2


async def test_capability_and_tenant_deletion_are_announced_once(
    handlers: TrainerHandlers, store: GraphStore, redis: aioredis.Redis, tenant: str
) -> None:
    learned = CapabilityLearned.create(
        tenant_id=tenant,
        capability=CapabilitySpec(id="commit", name="Commit", tools=["git:git_add"]),
    )
    await handlers.on_capability_learned(learned)
    await handlers.on_capability_learned(learned)
    deleted = TenantDeleted.create(tenant_id=tenant)
    await handlers.on_tenant_deleted(deleted)
    await handlers.on_tenant_deleted(deleted)
    reasons = [(e.reason, e.node_ids) for e in await announced(redis, tenant)]
    assert reasons == [("capability_learned", ["commit", "git:git_add"]), ("tenant_deleted", [])]
    assert await store.success_stats(tenant, ["commit", "git:git_add"]) == {}
