"""Each tenant's `TenantPlanner`, loaded on first use and kept current by `GraphChanged`.

Planning state is per replica and in memory (DR-DSP's kept trees are the point of it); every
replica follows the trainer's graph through its own consumer group. Changes are applied by
diffing a fresh read of the graph, one tenant at a time (a lock per tenant), so DR-DSP repairs
rather than recomputes.

Memory: the planners hold at most `max_nodes` graph nodes over all tenants
(`PML_PLANNER_CACHE_MAX_NODES`); the least recently used tenants are dropped and read again on
their next request. Empty tenants are answered, not kept, and a tenant's lock lives only while
someone holds or waits for it, so requests naming any tenant cannot grow memory.
"""

from __future__ import annotations

import asyncio
import time
import weakref

import structlog
from neo4j import AsyncDriver

from pml_common.settings import Settings
from pml_common.tenant_cache import TenantCache
from pml_planner.graph_source import read_planner_graph
from pml_planner.planning import TenantPlanner

log = structlog.get_logger(__name__)

#: Default of `max_nodes`: the setting's.
MAX_NODES: int = Settings.model_fields["planner_cache_max_nodes"].default


def planner_nodes(planner: TenantPlanner) -> int:
    return len(planner.graph.nodes)


class TenantPlanners:
    def __init__(self, driver: AsyncDriver, database: str, max_nodes: int = MAX_NODES) -> None:
        self._driver = driver
        self._database = database
        self._planners: TenantCache[str, TenantPlanner] = TenantCache(
            "planner.tenants", max_nodes, planner_nodes, busy=self._busy
        )
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def get(self, tenant: str) -> TenantPlanner:
        planner = self._planners.get(tenant)
        if planner is not None:
            return planner
        async with self._lock(tenant):
            planner = self._planners.get(tenant)
            if planner is None:
                started = time.perf_counter()
                graph = await read_planner_graph(self._driver, self._database, tenant)
                planner = TenantPlanner.build(graph)
                if graph.nodes:  # empty tenants are answered, not kept
                    self._planners.put(tenant, planner)
                log.info(
                    "planner.tenant_loaded",
                    tenant=tenant,
                    nodes=len(graph.nodes),
                    ms=round(1000 * (time.perf_counter() - started), 1),
                )
            return planner

    async def refresh(self, tenant: str) -> None:
        # Under the tenant's lock: a load under way (`get`) may have read the graph before this
        # change; it finishes first and is then brought up to date, instead of the change being
        # dropped as "not loaded" and the tenant served stale until its next change.
        async with self._lock(tenant):
            planner = self._planners.peek(tenant)
            if planner is None:
                return  # loaded fresh on its first request
            graph = await read_planner_graph(self._driver, self._database, tenant)
            changed = planner.sync(graph)
            self._planners.shrink()  # the graph may have grown
            log.info("planner.tenant_synced", tenant=tenant, hyperedges_changed=changed)

    def drop(self, tenant: str) -> None:
        self._planners.pop(tenant)

    def _lock(self, tenant: str) -> asyncio.Lock:
        return self._locks.setdefault(tenant, asyncio.Lock())

    def _busy(self, tenant: str) -> bool:
        lock = self._locks.get(tenant)
        return lock is not None and lock.locked()
