"""TenantViews on the real Neo4j and Redis: what is cached, and its bound."""

from __future__ import annotations

import numpy as np
import pytest
from redis.asyncio import Redis

from pml_common.embedding import Embedder, UseEmbedder
from pml_common.events import ToolSpec
from pml_common.model_registry import ModelRegistry
from pml_common.prequential import PrequentialStore
from pml_common.settings import Settings
from pml_common.tool_graph import GraphCapability, GraphTool, ToolGraph
from pml_trainer.evaluation import (
    Prequential,
    TenantViews,
    build_view,
    hierarchy_of,
    without_workflows,
)
from pml_trainer.graph_store import GraphStore
from pml_trainer.replay_buffer import Trace

TOOLS = {
    "fs:read_file": "Read the complete contents of a file.",
    "mail:send": "Send an email message.",
}


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return UseEmbedder()


async def _register(store: GraphStore, tenant: str) -> None:
    specs = [
        ToolSpec(id=t, server=t.split(":")[0], name=t.split(":")[1], description=d)
        for t, d in TOOLS.items()
    ]
    await store.register_tools(tenant, "e-tools", specs)


async def test_past_the_bound_the_least_recently_used_view_is_dropped_then_read_again(
    settings: Settings, store: GraphStore, driver, redis: Redis, embedder: Embedder, tenant: str
) -> None:
    other = f"{tenant}-b"
    await _register(store, tenant)
    await _register(store, other)
    registry = ModelRegistry(redis, settings.model_keep_versions)
    # One node: a single tenant's view at a time; views never expire during the test.
    views = TenantViews(
        driver, settings.neo4j_database, embedder, registry, max_age_s=3600, max_nodes=1
    )
    first = await views.get(tenant)
    assert first.hierarchy.num_tools == len(TOOLS)
    assert await views.get(tenant) is first  # cached
    await views.get(other)
    assert views._views.keys() == [other]
    again = await views.get(tenant)
    assert again is not first  # read again from the stores...
    assert again.hierarchy.tool_ids == first.hierarchy.tool_ids  # ...to the same view
    assert again.version == first.version == "untrained"
    assert views._views.keys() == [tenant]


def test_without_workflows_drops_the_capabilities_of_new_work_and_keeps_the_tools() -> None:
    rng = np.random.default_rng(0)
    ids = ("s:a", "s:b", "s:c")
    vectors = {i: rng.random(8).astype(np.float32) for i in ids}
    tools = tuple(GraphTool(i, i, "") for i in ids)
    caps = (
        GraphCapability("ab", "ab", "", ("s:a", "s:b"), ()),
        GraphCapability("bc", "bc", "", ("s:b", "s:c"), ()),
        GraphCapability("meta", "meta", "", (), ("ab", "bc")),
    )
    graph = ToolGraph("t", tools, caps, vectors)
    view = build_view(graph, hierarchy_of(graph, 8), None)
    unseen = without_workflows(view, graph, None, {frozenset({"s:b", "s:a"})})
    assert unseen.hierarchy.node_index("ab") is None
    assert unseen.hierarchy.node_index("meta") is not None
    assert unseen.hierarchy.node_index("bc") is not None
    # same tools in the same order, and the same first stage: scores compare index for index
    assert unseen.hierarchy.tool_ids == view.hierarchy.tool_ids
    assert unseen.baseline is view.baseline
    # nothing to hide: the view itself
    assert without_workflows(view, graph, None, {frozenset({"s:a", "s:c"})}) is view


async def test_a_batch_of_executions_is_ranked_as_each_would_be_alone(
    settings: Settings, store: GraphStore, driver, redis: Redis, embedder: Embedder, tenant: str
) -> None:
    """`observe_all` embeds a batch's intents together; each execution of each tenant gets the
    figures it gets alone, one using no tool the tenant has gets none, and each is counted."""
    other = f"{tenant}-b"
    await _register(store, tenant)
    await _register(store, other)
    registry = ModelRegistry(redis, settings.model_keep_versions)
    views = TenantViews(driver, settings.neo4j_database, embedder, registry)
    prequential = Prequential(views, PrequentialStore(redis), embedder)
    batch = [
        (tenant, Trace(trace_id="a", intent="send a mail to bob", path=["mail:send"], outcome=1)),
        (other, Trace(trace_id="b", intent="open my notes", path=["fs:read_file"], outcome=1)),
        (tenant, Trace(trace_id="c", intent="anything", path=["no:such_tool"], outcome=1)),
        (other, Trace(trace_id="d", intent="send a mail to bob", path=["fs:read_file"], outcome=1)),
    ]
    together = await prequential.observe_all(batch)
    assert together[2] is None
    assert together[0] is not None and together[0][3] == 1.0  # mail:send ranked first
    assert together[3] is not None and together[3][3] == 2.0  # read_file below mail:send
    counted = [(await PrequentialStore(redis).summary(t)).cumulative.count for t in (tenant, other)]
    assert counted == [1, 2]
    for (owner, trace), figures in zip(batch, together, strict=True):
        again = trace.model_copy(update={"trace_id": f"{trace.trace_id}-alone"})
        assert await prequential.observe(owner, again) == figures
