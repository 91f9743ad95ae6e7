"""ModelBuilder against the real Neo4j, Redis (registry, embedding cache) and embedder."""

from __future__ import annotations

import neo4j
import numpy as np
import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from pml_common.embedding import Embedder, build_embedder
from pml_common.model_registry import ModelRegistry
from pml_common.settings import Settings
from pml_scorer.models import UNTRAINED, ModelBuilder
from pml_shgat.params import ShgatConfig, init_params
from pml_shgat.serving import ServingModel

from .helpers import (
    publish_blob,
    publish_model,
    untrained_reference,
    variant,
    write_capability,
    write_catalog,
    write_tools,
)

INTENT = "commit and push my changes"


@pytest.fixture
def embedder(settings: Settings, redis: Redis) -> Embedder:
    return build_embedder(settings, redis)


@pytest.fixture
def builder(
    graph_db: neo4j.AsyncDriver, settings: Settings, embedder: Embedder, registry: ModelRegistry
) -> ModelBuilder:
    return ModelBuilder(
        graph_db, settings.neo4j_database, embedder, registry, settings.shgat_key_dim
    )


async def scores(model: ServingModel, embedder: Embedder) -> list[tuple[str, float]]:
    vector = (await embedder.embed_queries([INTENT]))[0]
    return [(s.id, s.score) for s in model.score_capabilities(vector, 100)]


async def test_untrained_until_published_then_the_published_version(
    builder: ModelBuilder,
    graph_db: neo4j.AsyncDriver,
    redis: Redis,
    registry: ModelRegistry,
    embedder: Embedder,
    settings: Settings,
    tenant: str,
) -> None:
    await write_catalog(graph_db, tenant)
    hierarchy, config, params = await untrained_reference(graph_db, settings, tenant, embedder)

    untrained = await builder.build(tenant)
    assert (untrained.version, untrained.record, untrained.registry_version) == (
        UNTRAINED,
        None,
        None,
    )
    assert untrained.model.hierarchy.tool_ids == hierarchy.tool_ids
    assert await scores(untrained.model, embedder) == await scores(
        ServingModel(config, params, hierarchy), embedder
    )

    trained = variant(config, params, seed=3)
    record = await publish_model(registry, redis, tenant, config, trained, {"loss": 0.1})
    published = await builder.build(tenant, untrained)
    assert published.record == record
    assert published.version == record.version == published.registry_version
    assert await scores(published.model, embedder) == await scores(
        ServingModel(config, trained, hierarchy), embedder
    )


async def test_nothing_changed_gives_back_the_same_model(
    builder: ModelBuilder, graph_db: neo4j.AsyncDriver, tenant: str
) -> None:
    await write_catalog(graph_db, tenant)
    first = await builder.build(tenant)
    assert await builder.build(tenant, first) is first
    # Statistics the model does not use (what most GraphChanged events are about): same model.
    await graph_db.execute_query(
        "MATCH (t:Tool {tenant_id: $t}) SET t.executions = 3, t.successes = 2", {"t": tenant}
    )
    assert await builder.build(tenant, first) is first

    await write_capability(
        graph_db, tenant, "cap:report", "report a bug", "File an issue.", ["github:create_issue"]
    )
    changed = await builder.build(tenant, first)
    assert changed is not first
    assert "cap:report" in changed.model.hierarchy.capability_ids
    # A changed description changes the model too (it changes the node's embedding).
    await write_tools(graph_db, tenant, [("git:git_push", "Upload commits to a server.")])
    assert await builder.build(tenant, changed) is not changed


async def test_a_version_published_for_an_unchanged_graph_reuses_its_hierarchy(
    builder: ModelBuilder,
    graph_db: neo4j.AsyncDriver,
    redis: Redis,
    registry: ModelRegistry,
    embedder: Embedder,
    settings: Settings,
    tenant: str,
) -> None:
    await write_catalog(graph_db, tenant)
    _, config, params = await untrained_reference(graph_db, settings, tenant, embedder)
    first = await builder.build(tenant)
    record = await publish_model(registry, redis, tenant, config, variant(config, params, seed=5))
    published = await builder.build(tenant, first)
    assert published.version == record.version
    assert published.model.hierarchy is first.model.hierarchy
    # A changed graph gets a hierarchy of its own, still with the published version.
    await write_capability(
        graph_db, tenant, "cap:report", "report a bug", "File an issue.", ["github:create_issue"]
    )
    changed = await builder.build(tenant, published)
    assert changed.version == record.version
    assert "cap:report" in changed.model.hierarchy.capability_ids


async def test_a_published_model_of_another_size_is_not_served(
    builder: ModelBuilder,
    graph_db: neo4j.AsyncDriver,
    redis: Redis,
    registry: ModelRegistry,
    tenant: str,
) -> None:
    await write_catalog(graph_db, tenant)
    other = ShgatConfig(dim=64, key_dim=32, heads=4)
    foreign = init_params(other, np.eye(64)[:5], 1)
    await publish_model(registry, redis, tenant, other, foreign)
    with capture_logs() as logs:
        built = await builder.build(tenant)
    assert built.version == UNTRAINED
    assert built.model.config.dim == builder.dim
    mismatch = [e for e in logs if e["event"] == "scorer.model_dim_mismatch"]
    assert mismatch and mismatch[0]["log_level"] == "error"
    assert (mismatch[0]["model_dim"], mismatch[0]["embedder_dim"]) == (64, builder.dim)
    # Known bad: not rebuilt again and again while nothing changes.
    assert await builder.build(tenant, built) is built


async def test_an_unreadable_published_model_is_not_served(
    builder: ModelBuilder,
    graph_db: neo4j.AsyncDriver,
    redis: Redis,
    registry: ModelRegistry,
    tenant: str,
) -> None:
    await write_catalog(graph_db, tenant)
    await publish_blob(registry, redis, tenant, b"not a model")
    with capture_logs() as logs:
        built = await builder.build(tenant)
    assert built.version == UNTRAINED
    assert any(e["event"] == "scorer.model_unreadable" for e in logs)


async def test_a_tenant_without_nodes_builds_an_empty_model(
    builder: ModelBuilder, tenant: str
) -> None:
    built = await builder.build(tenant)
    assert built.is_empty
    assert built.version == UNTRAINED
    assert built.model.num_levels == 0
