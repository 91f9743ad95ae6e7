"""TenantViews on the real Neo4j and Redis: what is cached, and its bound."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from pml_common.embedding import Embedder, UseEmbedder
from pml_common.events import ToolSpec
from pml_common.model_registry import ModelRegistry
from pml_common.settings import Settings
from pml_trainer.evaluation import TenantViews
from pml_trainer.graph_store import GraphStore

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
