from __future__ import annotations

import numpy as np

from pml_common.embedding import UseEmbedder, catalog_text
from pml_common.settings import Settings
from pml_common.stores import neo4j_driver
from pml_common.tool_graph import graph_tenants, read_tool_graph

_SEED = """
CREATE (a:Tool {tenant_id: $tenant, id: 's:a', name: 'read_file', description: 'Read a file.'})
CREATE (b:Tool {tenant_id: $tenant, id: 's:b', name: 'write_file', description: ''})
CREATE (leaf:Capability {tenant_id: $tenant, id: 'copy', name: 'copy', description: 'Copy a file'})
CREATE (top:Capability {tenant_id: $tenant, id: 'backup', name: 'backup', description: ''})
CREATE (leaf)-[:CONTAINS {position: 1}]->(b)
CREATE (leaf)-[:CONTAINS {position: 0}]->(a)
CREATE (top)-[:CONTAINS {position: 0}]->(leaf)
CREATE (:Tool {tenant_id: $other, id: 's:z', name: 'z', description: ''})
"""


async def test_reads_members_in_order_and_embeds_like_search(
    settings: Settings, tenant: str
) -> None:
    driver = neo4j_driver(settings)
    embedder = UseEmbedder()
    try:
        await driver.execute_query(_SEED, tenant=tenant, other=f"{tenant}-other")
        graph = await read_tool_graph(driver, settings.neo4j_database, tenant, embedder)
        assert [t.id for t in graph.tools] == ["s:a", "s:b"]
        caps = {c.id: c for c in graph.capabilities}
        assert caps["copy"].tools == ("s:a", "s:b")
        assert caps["backup"].capabilities == ("copy",) and caps["backup"].tools == ()
        assert caps["backup"].embedding is None  # no description: its members define it
        expected = await embedder.embed_passages([catalog_text("read_file", "Read a file.")])
        np.testing.assert_allclose(graph.tool_vectors["s:a"], expected[0], atol=1e-5)
        assert caps["copy"].embedding is not None
        tenants = await graph_tenants(driver, settings.neo4j_database)
        assert {tenant, f"{tenant}-other"} <= set(tenants)
    finally:
        await driver.close()
