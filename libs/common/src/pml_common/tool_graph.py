"""Read-only view of a tenant's tools and capabilities as the trainer wrote them to Neo4j.

The scorer, the trainer's learning loop and the planner all need the same thing: every tool,
every capability with its direct members (`CONTAINS`), and an embedding of each node made from
`catalog_text` so that it comes from the shared embedding cache. Only the trainer writes these
nodes; this module never does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from neo4j import AsyncDriver
from numpy.typing import NDArray

from pml_common.embedding import Embedder, catalog_text, part_dims, part_reach
from pml_common.first_stage import Reach

_TOOLS = """
MATCH (t:Tool {tenant_id: $tenant})
RETURN t.id AS id, coalesce(t.name, t.id) AS name, coalesce(t.description, '') AS description,
       coalesce(t.server, '') AS server, coalesce(t.input_fields, []) AS fields
ORDER BY id
"""

_CAPABILITIES = """
MATCH (c:Capability {tenant_id: $tenant})
OPTIONAL MATCH (c)-[r:CONTAINS]->(m)
WITH c, r, m ORDER BY r.position
RETURN c.id AS id, coalesce(c.name, c.id) AS name,
       coalesce(c.description, '') AS description,
       [x IN collect(CASE WHEN m:Tool THEN m.id END) WHERE x IS NOT NULL] AS tools,
       [x IN collect(CASE WHEN m:Capability THEN m.id END) WHERE x IS NOT NULL] AS capabilities
ORDER BY id
"""

_TENANTS = """
MATCH (n) WHERE (n:Tool OR n:Capability) AND n.tenant_id IS NOT NULL
RETURN DISTINCT n.tenant_id AS tenant ORDER BY tenant
"""


@dataclass(frozen=True)
class GraphTool:
    id: str
    name: str
    description: str
    #: The MCP server and the input schema's field names, read for the first stage's
    #: lexical index.
    server: str = ""
    fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class GraphCapability:
    id: str
    name: str
    description: str
    tools: tuple[str, ...]
    capabilities: tuple[str, ...]
    #: Embedding of its text; None when it has no description, so that its members define it.
    embedding: NDArray[np.float32] | None = None


@dataclass(frozen=True)
class ToolGraph:
    tenant_id: str
    tools: tuple[GraphTool, ...]
    capabilities: tuple[GraphCapability, ...]
    tool_vectors: dict[str, NDArray[np.float32]]
    #: The tools' embeddings by the tool embedder (`PML_TOOL_EMBEDDER`, the first stage's dense
    #: side), in the order of `tools`, the widths of its models and how far each reads
    #: (`embedding.part_reach`); None when not asked for.
    catalog_vectors: NDArray[np.float32] | None = None
    catalog_parts: tuple[int, ...] = ()
    catalog_reach: tuple[Reach, ...] = ()

    def servers_of(self, tool_ids: Sequence[str]) -> list[str]:
        """The server of each tool of `tool_ids` ("" for an id the graph does not hold)."""
        server = {t.id: t.server for t in self.tools}
        return [server.get(t, "") for t in tool_ids]


async def read_tool_graph(
    driver: AsyncDriver,
    database: str,
    tenant: str,
    embedder: Embedder,
    tool_embedder: Embedder | None = None,
) -> ToolGraph:
    """The tenant's tools and capabilities with their members and embeddings (`embedder`'s,
    and `tool_embedder`'s too when given)."""
    tools_result = await driver.execute_query(_TOOLS, tenant=tenant, database_=database)
    caps_result = await driver.execute_query(_CAPABILITIES, tenant=tenant, database_=database)
    tools = tuple(
        GraphTool(r["id"], r["name"], r["description"], r["server"], tuple(r["fields"]))
        for r in tools_result.records
    )
    texts = [catalog_text(t.name, t.description) for t in tools]
    tool_vectors = await _embed(embedder, texts)
    catalog = await _embed(tool_embedder, texts) if tool_embedder is not None else None
    described = [r for r in caps_result.records if r["description"].strip()]
    cap_vectors = await _embed(
        embedder, [catalog_text(r["name"], r["description"]) for r in described]
    )
    vector_of = {r["id"]: cap_vectors[i] for i, r in enumerate(described)}
    capabilities = tuple(
        GraphCapability(
            id=r["id"],
            name=r["name"],
            description=r["description"],
            tools=tuple(r["tools"]),
            capabilities=tuple(r["capabilities"]),
            embedding=vector_of.get(r["id"]),
        )
        for r in caps_result.records
    )
    return ToolGraph(
        tenant_id=tenant,
        tools=tools,
        capabilities=capabilities,
        tool_vectors={t.id: tool_vectors[i] for i, t in enumerate(tools)},
        catalog_vectors=catalog,
        catalog_parts=part_dims(tool_embedder) if tool_embedder is not None else (),
        catalog_reach=part_reach(tool_embedder) if tool_embedder is not None else (),
    )


async def graph_tenants(driver: AsyncDriver, database: str) -> list[str]:
    """Tenants that have at least one tool or capability."""
    result = await driver.execute_query(_TENANTS, database_=database)
    return [r["tenant"] for r in result.records]


async def _embed(embedder: Embedder, texts: Sequence[str]) -> NDArray[np.float32]:
    if not texts:
        return np.zeros((0, embedder.dim), dtype=np.float32)
    return np.asarray(await embedder.embed_passages(texts), dtype=np.float32)
