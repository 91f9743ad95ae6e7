"""Read-only, in-memory view of the tool graph the trainer writes in Neo4j.

Search never writes Neo4j. For each tenant it keeps the execution statistics of tools and
capabilities and the tool→tool LINK edges in memory, loaded on the tenant's first request and
refreshed when the trainer publishes `GraphChanged` (only the named nodes when the event names
some, the whole tenant otherwise). The ranking hot path therefore makes no Neo4j round trip.

Memory: the views hold at most `max_entries` nodes and links over all tenants
(`PML_SEARCH_CACHE_MAX_ENTRIES`); the least recently used tenants are dropped and read again on
their next request. An empty view counts as one, so requests naming any tenant ids stay within
the bound too.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import neo4j
import structlog

from pml_common.settings import Settings
from pml_common.tenant_cache import TenantCache
from pml_search.ranking import LinkGraph, success_rate_of

log = structlog.get_logger(__name__)

_TOOL_STATS = """
MATCH (n:Tool {tenant_id: $tenant})
WHERE n.id IN $ids
RETURN n.id AS id, n.executions AS executions, n.successes AS successes,
       n.success_rate AS success_rate
"""

_CAPABILITY_STATS = """
MATCH (n:Capability {tenant_id: $tenant})
WHERE n.id IN $ids
RETURN n.id AS id, n.executions AS executions, n.successes AS successes,
       n.success_rate AS success_rate
"""

# Whole-tenant reads return columns (one record of lists), not a record per row: the async
# driver spends ~0.1 ms per record, so a 10,000-tool tenant's 90,000 links took 11 s as rows
# against 0.4-1.4 s as columns, and a tenant's first request waited for them.
_ALL_TOOL_STATS = """
MATCH (n:Tool {tenant_id: $tenant})
RETURN collect(n.id) AS id, collect(coalesce(n.executions, 0)) AS executions,
       collect(coalesce(n.successes, 0)) AS successes,
       collect([n.success_rate]) AS success_rate
"""

_ALL_CAPABILITY_STATS = """
MATCH (n:Capability {tenant_id: $tenant})
RETURN collect(n.id) AS id, collect(coalesce(n.executions, 0)) AS executions,
       collect(coalesce(n.successes, 0)) AS successes,
       collect([n.success_rate]) AS success_rate
"""

_ALL_LINKS = """
MATCH (a:Tool {tenant_id: $tenant})-[l:LINK]->(b:Tool {tenant_id: $tenant})
RETURN collect(a.id) AS src, collect(b.id) AS dst, collect(coalesce(l.weight, 0.0)) AS weight
"""

_LINKS_TOUCHING = """
MATCH (a:Tool {tenant_id: $tenant})-[l:LINK]-(b:Tool {tenant_id: $tenant})
WHERE a.id IN $ids
RETURN startNode(l).id AS src, endNode(l).id AS dst, l.weight AS weight
"""


@dataclass(frozen=True)
class NodeStats:
    executions: int
    successes: int
    success_rate: float | None  # None when never executed


@dataclass
class TenantGraph:
    """One tenant's statistics and edges, as last read from Neo4j."""

    tools: dict[str, NodeStats] = field(default_factory=dict)
    capabilities: dict[str, NodeStats] = field(default_factory=dict)
    links: LinkGraph = field(default_factory=LinkGraph)

    def stats(self, kind: str, node_id: str) -> NodeStats | None:
        table = self.tools if kind == "tool" else self.capabilities
        return table.get(node_id)

    def size(self) -> int:
        """Nodes and links held."""
        return len(self.tools) + len(self.capabilities) + self.links.edge_count()

    def weight(self) -> int:
        """The view's weight in the cache: its size, and at least 1."""
        return max(1, self.size())


def _stats_of(record: neo4j.Record | dict[str, Any]) -> NodeStats:
    executions = int(record["executions"] or 0)
    successes = int(record["successes"] or 0)
    rate = success_rate_of(
        {
            "executions": executions,
            "successes": successes,
            "success_rate": record["success_rate"],
        }
    )
    return NodeStats(executions=executions, successes=successes, success_rate=rate)


def _edges_of(records: Iterable[neo4j.Record]) -> list[tuple[str, str, float]]:
    return [(r["src"], r["dst"], float(r["weight"] or 0.0)) for r in records]


def _stats_columns(record: neo4j.Record) -> dict[str, NodeStats]:
    """Node statistics from one record of columns (`_ALL_TOOL_STATS`); `success_rate` comes
    wrapped in one-element lists, since `collect` drops nulls and would misalign it."""
    columns = zip(
        record["id"], record["executions"], record["successes"], record["success_rate"], strict=True
    )
    return {
        node_id: _stats_of(
            {"executions": executions, "successes": successes, "success_rate": rate[0]}
        )
        for node_id, executions, successes, rate in columns
    }


def _edge_columns(record: neo4j.Record) -> list[tuple[str, str, float]]:
    return [
        (src, dst, float(weight))
        for src, dst, weight in zip(record["src"], record["dst"], record["weight"], strict=True)
    ]


#: Default of `max_entries`: the setting's.
MAX_ENTRIES: int = Settings.model_fields["search_cache_max_entries"].default


class GraphView:
    """Per-tenant cache of the graph facts ranking needs."""

    def __init__(
        self, driver: neo4j.AsyncDriver, database: str, max_entries: int = MAX_ENTRIES
    ) -> None:
        self._driver = driver
        self._database = database
        self._tenants: TenantCache[str, TenantGraph] = TenantCache(
            "search.graph", max_entries, TenantGraph.weight, busy=self._busy
        )
        # A lock nobody holds or waits for is forgotten: tenant ids come from requests.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def get(self, tenant: str) -> TenantGraph:
        """The tenant's view, read from Neo4j on first use only."""
        cached = self._tenants.get(tenant)
        if cached is not None:
            return cached
        async with self._lock(tenant):
            cached = self._tenants.get(tenant)
            if cached is None:
                cached = self._tenants.put(tenant, await self._load(tenant))
            return cached

    def cached(self, tenant: str) -> TenantGraph | None:
        return self._tenants.peek(tenant)

    async def refresh(self, tenant: str, node_ids: Sequence[str] = ()) -> None:
        """Re-read the named nodes (and their edges), or the whole tenant when none are named.

        A tenant neither cached nor being read is left alone: its first request reads it whole
        anyway. One being read is refreshed once the read is stored, since that read may have
        happened before the change this refresh announces.
        """
        if tenant not in self._tenants and not self._busy(tenant):
            return
        async with self._lock(tenant):
            current = self._tenants.peek(tenant)
            if current is None:
                return
            if not node_ids:
                self._tenants.replace(tenant, await self._load(tenant))
                return
            await self._refresh_nodes(tenant, current, list(dict.fromkeys(node_ids)))
            self._tenants.shrink()  # the view may have grown

    def forget(self, tenant: str) -> None:
        self._tenants.pop(tenant)

    def _lock(self, tenant: str) -> asyncio.Lock:
        return self._locks.setdefault(tenant, asyncio.Lock())

    def _busy(self, tenant: str) -> bool:
        """Whether the tenant is being read or refreshed (its view must not be dropped)."""
        lock = self._locks.get(tenant)
        return lock is not None and lock.locked()

    async def _query(self, cypher: str, **params: Any) -> list[neo4j.Record]:
        async def work(tx: neo4j.AsyncManagedTransaction) -> list[neo4j.Record]:
            result = await tx.run(cypher, params)
            return [record async for record in result]

        async with self._driver.session(
            database=self._database, default_access_mode=neo4j.READ_ACCESS
        ) as session:
            return await session.execute_read(work)

    async def _load(self, tenant: str) -> TenantGraph:
        (tools,), (caps,), (links,) = await asyncio.gather(
            self._query(_ALL_TOOL_STATS, tenant=tenant),
            self._query(_ALL_CAPABILITY_STATS, tenant=tenant),
            self._query(_ALL_LINKS, tenant=tenant),
        )
        edges = _edge_columns(links)
        view = TenantGraph(
            tools=_stats_columns(tools),
            capabilities=_stats_columns(caps),
            links=LinkGraph.from_edges(edges),
        )
        log.debug("graph view loaded", tenant=tenant, nodes=len(view.tools), edges=len(edges))
        return view

    async def _refresh_nodes(self, tenant: str, view: TenantGraph, ids: list[str]) -> None:
        tools, caps, links = await asyncio.gather(
            self._query(_TOOL_STATS, tenant=tenant, ids=ids),
            self._query(_CAPABILITY_STATS, tenant=tenant, ids=ids),
            self._query(_LINKS_TOUCHING, tenant=tenant, ids=ids),
        )
        for table, records in ((view.tools, tools), (view.capabilities, caps)):
            for node_id in ids:
                table.pop(node_id, None)
            table.update({r["id"]: _stats_of(r) for r in records})
        view.links.remove_edges_touching(ids)
        for src, dst, weight in _edges_of(links):
            view.links.add_edge(src, dst, weight)
