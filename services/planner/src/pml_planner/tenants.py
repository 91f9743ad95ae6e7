"""Each tenant's `TenantPlanner`, loaded on first use and kept current by `GraphChanged`.

Planning state is per replica and in memory (DR-DSP's kept trees are the point of it); every
replica follows the trainer's graph through its own consumer group. Changes are applied by
diffing a fresh read of the graph, one tenant at a time (a lock per tenant), so DR-DSP repairs
rather than recomputes.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from neo4j import AsyncDriver

from pml_planner.graph_source import read_planner_graph
from pml_planner.planning import TenantPlanner

log = structlog.get_logger(__name__)


class TenantPlanners:
    def __init__(self, driver: AsyncDriver, database: str) -> None:
        self._driver = driver
        self._database = database
        self._planners: dict[str, TenantPlanner] = {}
        self._locks: dict[str, asyncio.Lock] = {}

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
                    self._planners[tenant] = planner
                log.info(
                    "planner.tenant_loaded",
                    tenant=tenant,
                    nodes=len(graph.nodes),
                    ms=round(1000 * (time.perf_counter() - started), 1),
                )
            return planner

    async def refresh(self, tenant: str) -> None:
        if tenant not in self._planners:
            return  # loaded fresh on its first request
        async with self._lock(tenant):
            planner = self._planners.get(tenant)
            if planner is None:
                return
            graph = await read_planner_graph(self._driver, self._database, tenant)
            changed = planner.sync(graph)
            log.info("planner.tenant_synced", tenant=tenant, hyperedges_changed=changed)

    def drop(self, tenant: str) -> None:
        self._planners.pop(tenant, None)
        self._locks.pop(tenant, None)

    def _lock(self, tenant: str) -> asyncio.Lock:
        return self._locks.setdefault(tenant, asyncio.Lock())
