"""Helpers of the scorer's tests: the graph in the trainer's schema, models in the registry.

Graphs are written with Cypher in the trainer's schema (services/trainer graph_store):
(:Tool {tenant_id, id, name, description}), (:Capability {tenant_id, id, name, description})
-[:CONTAINS {position}]->(:Tool | :Capability). Models are published to the real registry with
a fencing token taken from the trainer's fencing counter, as a trainer holding the lock would.
"""

from __future__ import annotations

from collections.abc import Sequence

import neo4j
import numpy as np
from numpy.typing import NDArray
from redis.asyncio import Redis

from pml_common.bus import EventBus
from pml_common.embedding import Embedder
from pml_common.events import ModelPublished
from pml_common.lease_lock import FENCING_COUNTER_KEY
from pml_common.model_registry import ModelRecord, ModelRegistry
from pml_common.settings import Settings
from pml_common.tool_first_stage import FusedFirstStage
from pml_common.tool_graph import read_tool_graph
from pml_shgat.hierarchy import Hierarchy
from pml_shgat.params import Params, ShgatConfig, init_params, make_config, to_bytes
from pml_shgat.serving import ScoredNode

TOOLS = [
    ("filesystem:read_file", "Read the complete contents of a file from the file system."),
    ("filesystem:write_file", "Create a new file or overwrite an existing file with content."),
    ("filesystem:list_directory", "List all files and directories in a specified path."),
    ("playwright:browser_navigate", "Navigate the browser to a URL."),
    ("playwright:browser_take_screenshot", "Take a screenshot of the current page."),
    ("github:create_issue", "Create a new issue in a GitHub repository."),
    ("git:git_commit", "Record changes to the repository with a commit message."),
    ("git:git_push", "Push local commits to the remote repository."),
]

#: (id, name, description, member tools, member capabilities); `publish` is level 1.
CAPABILITIES = [
    (
        "cap:edit_file",
        "edit a file",
        "Read a file and write it back changed.",
        ["filesystem:read_file", "filesystem:write_file"],
        [],
    ),
    (
        "cap:screenshot_page",
        "screenshot a web page",
        "Open a web page in the browser and take a screenshot of it.",
        ["playwright:browser_navigate", "playwright:browser_take_screenshot"],
        [],
    ),
    (
        "cap:ship_changes",
        "ship code changes",
        "Commit changes and push them to the remote repository.",
        ["git:git_commit", "git:git_push"],
        [],
    ),
    ("cap:publish", "publish work", "", [], ["cap:edit_file", "cap:ship_changes"]),
]


async def write_tools(
    driver: neo4j.AsyncDriver, tenant: str, tools: Sequence[tuple[str, str]] = TOOLS
) -> None:
    await driver.execute_query(
        """
        UNWIND $tools AS t
        MERGE (n:Tool {tenant_id: $tenant, id: t.id})
        SET n.name = t.name, n.description = t.description, n.server = t.server
        """,
        {
            "tenant": tenant,
            "tools": [
                {"id": i, "name": i.split(":")[1], "description": d, "server": i.split(":")[0]}
                for i, d in tools
            ],
        },
    )


async def write_capability(
    driver: neo4j.AsyncDriver,
    tenant: str,
    cap_id: str,
    name: str,
    description: str,
    tools: Sequence[str] = (),
    capabilities: Sequence[str] = (),
) -> None:
    await driver.execute_query(
        """
        MERGE (c:Capability {tenant_id: $tenant, id: $id})
        SET c.name = $name, c.description = $description
        WITH c
        UNWIND $members AS m
        MATCH (n {tenant_id: $tenant, id: m.id}) WHERE n:Tool OR n:Capability
        MERGE (c)-[r:CONTAINS]->(n)
        SET r.position = m.position
        """,
        {
            "tenant": tenant,
            "id": cap_id,
            "name": name,
            "description": description,
            "members": [{"id": m, "position": p} for p, m in enumerate([*tools, *capabilities])],
        },
    )


async def write_catalog(driver: neo4j.AsyncDriver, tenant: str) -> None:
    await write_tools(driver, tenant)
    for cap in CAPABILITIES:
        await write_capability(driver, tenant, *cap)


async def untrained_reference(
    driver: neo4j.AsyncDriver, settings: Settings, tenant: str, embedder: Embedder
) -> tuple[Hierarchy, ShgatConfig, Params]:
    """The hierarchy the scorer builds for the tenant (same reader, same embedder), and the
    untrained model's configuration and parameters."""
    graph = await read_tool_graph(driver, settings.neo4j_database, tenant, embedder)
    hierarchy = Hierarchy.build(graph.tool_vectors, graph.capabilities, dim=embedder.dim)
    config = make_config(hierarchy.dim, settings.shgat_key_dim, hierarchy.num_nodes)
    return hierarchy, config, init_params(config, hierarchy.features, hierarchy.num_levels)


async def first_stage_reference(
    driver: neo4j.AsyncDriver,
    settings: Settings,
    tenant: str,
    embedder: Embedder,
    tool_embedder: Embedder,
) -> FusedFirstStage:
    """The tenant's untrained first stage, built here from the same graph reader."""
    graph = await read_tool_graph(driver, settings.neo4j_database, tenant, embedder, tool_embedder)
    return FusedFirstStage.of_graph(graph)


def ranked(ids: tuple[str, ...], scores: np.ndarray, k: int) -> list[ScoredNode]:
    """The `k` best of `scores` as the scorer serves tools (ties keep the catalog order)."""
    order = np.argsort(-scores, kind="stable")[:k]
    return [ScoredNode(ids[i], float(scores[i]), -1) for i in order]


def variant(config: ShgatConfig, params: Params, seed: int) -> Params:
    """Visibly different parameters: a random rotation-ish intent projection and key scaling."""
    rng = np.random.default_rng(seed)
    changed = dict(params)
    changed["W_intent"] = params["W_intent"] + 0.6 * rng.standard_normal(
        params["W_intent"].shape
    ) / np.sqrt(config.dim)
    changed["W_k"] = params["W_k"] * (0.5 + rng.random())
    return changed


async def publish_blob(
    registry: ModelRegistry,
    redis: Redis,
    tenant: str,
    blob: bytes,
    metrics: dict[str, float] | None = None,
) -> ModelRecord:
    """Publish as the lock holder would: the newest fencing token (INCR of the counter)."""
    token = int(await redis.incr(FENCING_COUNTER_KEY))
    return await registry.publish(tenant, blob, token, metrics or {})


async def publish_model(
    registry: ModelRegistry,
    redis: Redis,
    tenant: str,
    config: ShgatConfig,
    params: Params,
    metrics: dict[str, float] | None = None,
    extra: dict[str, NDArray[np.generic]] | None = None,
) -> ModelRecord:
    return await publish_blob(registry, redis, tenant, to_bytes(config, params, extra), metrics)


async def announce_model(
    bus: EventBus,
    registry: ModelRegistry,
    redis: Redis,
    tenant: str,
    config: ShgatConfig,
    params: Params,
    metrics: dict[str, float] | None = None,
    extra: dict[str, NDArray[np.generic]] | None = None,
) -> ModelRecord:
    """Publish a version and announce it with `ModelPublished`, as the trainer does; `extra`:
    arrays published with it (an execution memory's)."""
    record = await publish_model(registry, redis, tenant, config, params, metrics, extra)
    await bus.publish(
        ModelPublished.create(
            tenant_id=tenant,
            model_version=record.version,
            fencing_token=record.fencing_token,
            metrics=record.metrics,
        )
    )
    return record
