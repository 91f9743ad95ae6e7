"""GraphView against a real Neo4j: loads a tenant once, refreshes named nodes or everything."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import neo4j
import pytest

from pml_common.settings import Settings
from pml_common.stores import neo4j_driver
from pml_search.graph_view import GraphView

_WRITE_TOOL = """
MERGE (t:Tool {tenant_id: $tenant, id: $id})
SET t.executions = $executions, t.successes = $successes,
    t.success_rate = CASE WHEN $executions > 0 THEN toFloat($successes) / $executions END
"""
_WRITE_LINK = """
MATCH (a:Tool {tenant_id: $tenant, id: $src}), (b:Tool {tenant_id: $tenant, id: $dst})
MERGE (a)-[l:LINK {type: $type}]->(b)
SET l.weight = $weight, l.source = 'observed', l.count = 3
"""


@pytest.fixture
async def driver(settings: Settings) -> AsyncIterator[neo4j.AsyncDriver]:
    drv = neo4j_driver(settings)
    yield drv
    await drv.close()


async def _tool(drv: neo4j.AsyncDriver, tenant: str, tid: str, execs: int, ok: int) -> None:
    await drv.execute_query(
        _WRITE_TOOL, {"tenant": tenant, "id": tid, "executions": execs, "successes": ok}
    )


async def _link(
    drv: neo4j.AsyncDriver, tenant: str, src: str, dst: str, weight: float, kind: str = "sequence"
) -> None:
    await drv.execute_query(
        _WRITE_LINK, {"tenant": tenant, "src": src, "dst": dst, "weight": weight, "type": kind}
    )


async def test_load_refresh_named_nodes_and_full(
    driver: neo4j.AsyncDriver, settings: Settings, tenant: str
) -> None:
    await _tool(driver, tenant, "fs:read", 10, 9)
    await _tool(driver, tenant, "fs:write", 0, 0)
    await _tool(driver, tenant, "fs:list", 4, 1)
    await _link(driver, tenant, "fs:read", "fs:write", 0.5)
    await _link(driver, tenant, "fs:read", "fs:write", 1.0, kind="dependency")
    # another tenant's facts never leak in
    await _tool(driver, tenant + "-other", "fs:read", 10, 0)

    view = GraphView(driver, settings.neo4j_database)
    graph = await view.get(tenant)
    assert graph.tools["fs:read"].success_rate == pytest.approx(0.9)
    assert graph.tools["fs:write"].success_rate is None  # never executed
    assert graph.tools["fs:list"].success_rate == pytest.approx(0.25)
    assert graph.links.out == {"fs:read": {"fs:write": 1.0}}  # best LINK of the pair

    # The trainer changes fs:list and adds an edge; the cache does not see it until refreshed.
    await _tool(driver, tenant, "fs:list", 5, 5)
    await _link(driver, tenant, "fs:list", "fs:read", 0.35)
    await _tool(driver, tenant, "fs:write", 2, 0)
    assert (await view.get(tenant)).tools["fs:list"].success_rate == pytest.approx(0.25)

    await view.refresh(tenant, ["fs:list"])
    graph = await view.get(tenant)
    assert graph.tools["fs:list"].success_rate == 1.0
    assert graph.links.inc["fs:read"] == {"fs:list": 0.35}
    assert graph.tools["fs:write"].success_rate is None  # not named: still the cached value

    await view.refresh(tenant)
    graph = await view.get(tenant)
    assert graph.tools["fs:write"].success_rate == 0.0
    assert graph.links.edge_count() == 2


async def test_refresh_of_uncached_tenant_is_a_no_op_and_forget_drops(
    driver: neo4j.AsyncDriver, settings: Settings, tenant: str
) -> None:
    view = GraphView(driver, settings.neo4j_database)
    await view.refresh(tenant, ["x:y"])
    assert view.cached(tenant) is None
    await _tool(driver, tenant, "x:y", 1, 1)
    assert (await view.get(tenant)).tools["x:y"].executions == 1
    view.forget(tenant)
    assert view.cached(tenant) is None


async def test_a_change_announced_while_the_tenant_loads_is_not_lost(
    driver: neo4j.AsyncDriver, settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first request reads the tenant; the trainer commits and announces a change before
    that read is stored: the view must end up with the new facts, not the read's."""
    await _tool(driver, tenant, "git:commit", 0, 0)
    view = GraphView(driver, settings.neo4j_database)
    read_done, release = asyncio.Event(), asyncio.Event()
    load = view._load

    async def slow_load(name: str) -> Any:
        loaded = await load(name)
        read_done.set()
        await release.wait()
        return loaded

    monkeypatch.setattr(view, "_load", slow_load)
    first_request = asyncio.create_task(view.get(tenant))
    await read_done.wait()  # the read saw no execution
    await _tool(driver, tenant, "git:commit", 3, 3)  # the trainer commits, then announces
    announced = asyncio.create_task(view.refresh(tenant, ["git:commit"]))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first_request, announced)
    assert (await view.get(tenant)).tools["git:commit"].executions == 3


async def test_views_keep_their_node_budget_empty_ones_counting_as_one(
    driver: neo4j.AsyncDriver, settings: Settings, tenant: str
) -> None:
    first, second = f"{tenant}-a", f"{tenant}-b"
    for name in (first, second):
        await _tool(driver, name, "x:one", 1, 1)
        await _tool(driver, name, "x:two", 2, 1)
    view = GraphView(driver, settings.neo4j_database, max_entries=3)
    assert (await view.get(first)).tools["x:one"].executions == 1
    assert (await view.get(second)).tools["x:two"].executions == 2
    assert view.cached(first) is None  # 4 nodes > 3: the least recently used went
    assert view.cached(second) is not None
    assert (await view.get(first)).tools["x:two"].successes == 1  # read again
    for i in range(20):  # requests naming tenants that have nothing
        assert (await view.get(f"{tenant}-none-{i}")).size() == 0
    assert view._tenants.weight() == 3 and view.cached(f"{tenant}-none-19") is not None
    assert len(view._locks) == 0  # locks live while a read holds them only
