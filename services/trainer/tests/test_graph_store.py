"""The graph store on a real Neo4j: statistics, idempotence, promotion, isolation, deletion."""

from __future__ import annotations

import asyncio
import uuid
from itertools import pairwise
from typing import Any

import neo4j
import pytest

from pml_common.events import (
    CapabilitySpec,
    ExecutionCompleted,
    ExecutionStep,
    ToolSpec,
    utcnow,
)
from pml_common.graph_statistics import EdgeKey, EdgeState, execution_effect
from pml_common.settings import Settings
from pml_trainer.cold_start import load_templates, template_edges
from pml_trainer.graph_store import Edge, GraphStore, NodeStats

from .test_cold_start import SEED_004


def spec(tool_id: str, description: str = "") -> ToolSpec:
    server, _, name = tool_id.partition(":")
    return ToolSpec(id=tool_id, server=server, name=name, description=description)


def run(tenant: str, *nodes: str | tuple[str, bool], **kw: Any) -> ExecutionCompleted:
    steps = [
        ExecutionStep(node_id=n, success=True)
        if isinstance(n, str)
        else ExecutionStep(node_id=n[0], success=n[1])
        for n in nodes
    ]
    kw.setdefault("outcome", "success")
    return ExecutionCompleted.create(tenant_id=tenant, intent="x", steps=steps, **kw)


async def apply(store: GraphStore, event: ExecutionCompleted) -> bool:
    return await store.apply_execution(event.tenant_id, event.event_id, execution_effect(event))


async def register(store: GraphStore, tenant: str, *ids: str) -> None:
    assert await store.register_tools(tenant, uuid.uuid4().hex, [spec(i) for i in ids])


async def snapshot(driver: neo4j.AsyncDriver, tenant: str) -> dict[str, Any]:
    """Every property of every node and LINK of the tenant, for before/after comparisons."""
    nodes, _, _ = await driver.execute_query(
        "MATCH (n {tenant_id: $t}) WHERE n:Tool OR n:Capability "
        "RETURN n.id AS id, properties(n) AS p ORDER BY id",
        t=tenant,
    )
    links, _, _ = await driver.execute_query(
        "MATCH (a {tenant_id: $t})-[r:LINK]->(b) "
        "RETURN a.id AS a, b.id AS b, r.type AS type, properties(r) AS p ORDER BY a, b, type",
        t=tenant,
    )
    return {
        "nodes": {r["id"]: r["p"] for r in nodes},
        "links": {(r["a"], r["b"], r["type"]): r["p"] for r in links},
    }


def link(edges: list[Edge], src: str, dst: str, edge_type: str = "sequence") -> Edge:
    found = [e for e in edges if (e.src, e.dst, e.type) == (src, dst, edge_type)]
    assert len(found) == 1, (src, dst, edge_type, edges)
    return found[0]


async def test_executions_update_success_rates(store: GraphStore, tenant: str) -> None:
    await register(store, tenant, "fs:read", "fs:write")
    assert (await store.success_stats(tenant, ["fs:read"]))["fs:read"] == NodeStats(0, 0, None)
    await apply(store, run(tenant, "fs:read", ("fs:write", False), capability_id="cap"))
    await apply(store, run(tenant, "fs:read", "fs:write", capability_id="cap"))
    await apply(store, run(tenant, ("fs:read", False), outcome="failure", capability_id="cap"))
    stats = await store.success_stats(tenant, ["fs:read", "fs:write", "cap", "nope:x"])
    assert stats["fs:read"] == NodeStats(3, 2, pytest.approx(2 / 3))
    assert stats["fs:write"] == NodeStats(2, 1, 0.5)
    assert stats["cap"] == NodeStats(3, 2, pytest.approx(2 / 3))
    assert "nope:x" not in stats


async def test_unregistered_tools_and_capabilities_are_created_on_first_execution(
    store: GraphStore, driver: neo4j.AsyncDriver, tenant: str
) -> None:
    await apply(store, run(tenant, "git:git_add", "my-nested-cap", capability_id="outer"))
    state = await snapshot(driver, tenant)
    assert state["nodes"]["git:git_add"]["server"] == "git"
    assert state["nodes"]["git:git_add"]["name"] == "git_add"
    records, _, _ = await driver.execute_query(
        "MATCH (c:Capability {tenant_id: $t}) RETURN c.id AS id ORDER BY id", t=tenant
    )
    assert [r["id"] for r in records] == ["my-nested-cap", "outer"]
    edges = await store.edges(tenant)
    assert link(edges, "outer", "git:git_add", "contains").weight == pytest.approx(0.56)
    assert link(edges, "git:git_add", "my-nested-cap").source == "inferred"


async def test_redelivered_execution_changes_nothing(
    store: GraphStore, driver: neo4j.AsyncDriver, tenant: str
) -> None:
    await register(store, tenant, "a:x", "a:y")
    event = run(tenant, "a:x", ("a:y", False), capability_id="cap")
    assert await apply(store, event) is True
    before = await snapshot(driver, tenant)
    assert await apply(store, event) is False
    assert await snapshot(driver, tenant) == before
    assert before["nodes"]["a:x"]["executions"] == 1
    assert before["links"][("a:x", "a:y", "sequence")]["count"] == 1


async def test_edge_promoted_to_observed_at_third_observation(
    store: GraphStore, tenant: str
) -> None:
    await register(store, tenant, "a:x", "a:y")
    seen = []
    for _ in range(4):
        await apply(store, run(tenant, "a:x", "a:y"))
        e = link(await store.edges(tenant), "a:x", "a:y")
        seen.append((e.count, e.source, round(e.weight, 6)))
    assert seen == [
        (1, "inferred", 0.35),
        (2, "inferred", 0.35),
        (3, "observed", 0.5),
        (4, "observed", 0.5),
    ]


async def test_dependency_edges_from_depends_on(store: GraphStore, tenant: str) -> None:
    steps = [
        ExecutionStep(node_id="a:x", success=True),
        ExecutionStep(node_id="b:y", success=True),
        ExecutionStep(node_id="c:z", success=True, depends_on=["a:x"]),
    ]
    event = ExecutionCompleted.create(tenant_id=tenant, intent="i", steps=steps, outcome="success")
    await apply(store, event)
    edges = await store.edges(tenant)
    assert link(edges, "a:x", "c:z", "dependency").weight == pytest.approx(0.7)
    assert {(e.src, e.dst, e.type) for e in edges} == {
        ("a:x", "b:y", "sequence"),
        ("b:y", "c:z", "sequence"),
        ("a:x", "c:z", "dependency"),
    }


async def test_template_edges_for_a_catalog_with_the_seed_004_tools(
    store: GraphStore, tenant: str
) -> None:
    seed_edges = {e for edges in SEED_004.values() for e in edges}
    tools = sorted({t for e in seed_edges for t in e})
    planned, skipped = template_edges(load_templates(), set(tools), set(tools))
    assert await store.register_tools(tenant, uuid.uuid4().hex, [spec(t) for t in tools], planned)
    edges = await store.edges(tenant)
    assert {(e.src, e.dst) for e in edges} == seed_edges
    for e in edges:
        assert (e.type, e.source, e.origin, e.count) == ("sequence", "template", "template", 0)
        assert e.weight == pytest.approx(0.25)
    # The bundled templates beyond seed 004 name tools this catalog lacks: skipped, not invented.
    assert skipped > 0


async def test_cold_start_never_downgrades_an_observed_edge(store: GraphStore, tenant: str) -> None:
    await register(store, tenant, "a:x", "a:y")
    for _ in range(3):
        await apply(store, run(tenant, "a:x", "a:y"))
    guess = (EdgeKey("a:x", "a:y", "sequence"), EdgeState("template", "template", 0))
    await store.add_cold_start_edges(tenant, [guess])
    e = link(await store.edges(tenant), "a:x", "a:y")
    assert (e.source, e.count, e.weight) == ("observed", 3, pytest.approx(0.5))


async def test_template_edge_is_promoted_by_executions(store: GraphStore, tenant: str) -> None:
    guess = (EdgeKey("a:x", "a:y", "sequence"), EdgeState("template", "template", 0))
    assert await store.register_tools(tenant, "ev-1", [spec("a:x"), spec("a:y")], [guess])
    states = []
    for _ in range(3):
        await apply(store, run(tenant, "a:x", "a:y"))
        e = link(await store.edges(tenant), "a:x", "a:y")
        states.append((e.source, e.origin, e.count))
    assert states == [
        ("template", "template", 1),
        ("template", "template", 2),
        ("observed", "template", 3),
    ]


async def test_reregistering_tools_keeps_statistics(store: GraphStore, tenant: str) -> None:
    await register(store, tenant, "a:x")
    await apply(store, run(tenant, ("a:x", False)))
    new = ToolSpec(id="a:x", server="a", name="x", description="now described")
    assert await store.register_tools(tenant, uuid.uuid4().hex, [new])
    assert (await store.success_stats(tenant, ["a:x"]))["a:x"] == NodeStats(1, 0, 0.0)
    assert [t.description for t in await store.catalog(tenant)] == ["now described"]


async def test_capability_learned_replaces_children_and_keeps_statistics(
    store: GraphStore, driver: neo4j.AsyncDriver, tenant: str
) -> None:
    first = CapabilitySpec(id="cap", name="Cap", tools=["a:x", "a:y"], capabilities=["sub"])
    assert await store.learn_capability(tenant, "e1", first)
    assert not await store.learn_capability(tenant, "e1", first)
    await apply(store, run(tenant, "a:x", capability_id="cap"))
    second = CapabilitySpec(id="cap", name="Cap v2", tools=["a:z"], description="d")
    assert await store.learn_capability(tenant, "e2", second)
    records, _, _ = await driver.execute_query(
        "MATCH (c:Capability {tenant_id: $t, id: 'cap'})-[r:CONTAINS]->(n) "
        "RETURN c.name AS name, n.id AS child, r.position AS pos ORDER BY pos",
        t=tenant,
    )
    assert [(r["name"], r["child"], r["pos"]) for r in records] == [("Cap v2", "a:z", 0)]
    assert (await store.success_stats(tenant, ["cap"]))["cap"] == NodeStats(1, 1, 1.0)


async def test_tenants_are_isolated(
    store: GraphStore, driver: neo4j.AsyncDriver, tenant: str
) -> None:
    other = f"{tenant}-b"
    await register(store, tenant, "a:x", "a:y")
    await register(store, other, "a:x", "a:y")
    before = await snapshot(driver, other)
    for _ in range(3):
        await apply(store, run(tenant, "a:x", "a:y", capability_id="cap"))
    await store.learn_capability(tenant, "e", CapabilitySpec(id="cap2", name="c", tools=["a:x"]))
    assert await snapshot(driver, other) == before
    assert await store.edges(other) == []
    assert (await store.success_stats(other, ["a:x"]))["a:x"].executions == 0
    # The same event id in another tenant is another event.
    event = run(tenant, "a:x")
    assert await apply(store, event)
    assert await apply(store, event.model_copy(update={"tenant_id": other}))


async def test_delete_tenant_removes_all_of_it_only(
    store: GraphStore, driver: neo4j.AsyncDriver, tenant: str
) -> None:
    other = f"{tenant}-b"
    for t in (tenant, other):
        await register(store, t, "a:x", "a:y")
        await apply(store, run(t, "a:x", "a:y", capability_id="cap"))
        await store.learn_capability(t, "e", CapabilitySpec(id="cap", name="c", tools=["a:x"]))
    assert await store.delete_tenant(tenant) > 0
    records, _, _ = await driver.execute_query(
        "MATCH (n {tenant_id: $t}) RETURN count(n) AS n", t=tenant
    )
    assert records[0]["n"] == 0
    assert await store.delete_tenant(tenant) == 0
    assert len((await snapshot(driver, other))["nodes"]) == 3
    assert len(await store.edges(other)) == 3  # sequence + 2 contains


async def test_neighbours_in_both_directions_heaviest_first(store: GraphStore, tenant: str) -> None:
    await register(store, tenant, "a:x", "a:y", "a:z")
    for _ in range(3):
        await apply(store, run(tenant, "a:x", "a:y"))
    await apply(store, run(tenant, "a:y", "a:z"))
    around = await store.neighbours(tenant, "a:y")
    assert [(e.src, e.dst, e.source) for e in around] == [
        ("a:x", "a:y", "observed"),
        ("a:y", "a:z", "inferred"),
    ]
    assert await store.neighbours(tenant, "a:nope") == []


async def test_concurrent_executions_lose_no_observation(store: GraphStore, tenant: str) -> None:
    await register(store, tenant, "a:x", "a:y")
    events = [run(tenant, "a:x", ("a:y", i % 2 == 0)) for i in range(12)]
    assert all(await asyncio.gather(*(apply(store, e) for e in events)))
    e = link(await store.edges(tenant), "a:x", "a:y")
    assert (e.count, e.source) == (12, "observed")
    stats = await store.success_stats(tenant, ["a:x", "a:y"])
    assert stats["a:x"] == NodeStats(12, 12, 1.0)
    assert stats["a:y"] == NodeStats(12, 6, 0.5)


async def test_prune_forgets_only_old_applied_events(
    store: GraphStore, driver: neo4j.AsyncDriver, tenant: str
) -> None:
    old, new = run(tenant, "a:x"), run(tenant, "a:x")
    assert await apply(store, old)
    cutoff = utcnow()
    assert await apply(store, new)
    assert await store.prune_applied(cutoff) >= 1
    assert not await store.is_applied(tenant, old.event_id)
    assert await store.is_applied(tenant, new.event_id)


async def test_large_registration_in_slices_is_applied_once(
    driver: neo4j.AsyncDriver, settings: Settings, tenant: str
) -> None:
    sliced = GraphStore(driver, settings.neo4j_database, tool_batch=2, edge_batch=2)
    ids = [f"s:t{i}" for i in range(5)]
    guesses = [
        (EdgeKey(a, b, "sequence"), EdgeState("template", "template", 0)) for a, b in pairwise(ids)
    ]
    assert await sliced.register_tools(tenant, "big", [spec(i) for i in ids], guesses)
    assert not await sliced.register_tools(tenant, "big", [spec(i) for i in ids], guesses)
    assert sorted(t.id for t in await sliced.catalog(tenant)) == ids
    assert len(await sliced.edges(tenant)) == 4


async def test_replicas_starting_together_all_ensure_the_schema(
    store: GraphStore, driver: neo4j.AsyncDriver
) -> None:
    """Several trainers creating the same index at once: the ones that lose the race are told
    it exists already, and none of them fails to start."""
    await driver.execute_query("DROP INDEX pml_link_type IF EXISTS")
    await asyncio.gather(*(store.ensure_schema() for _ in range(6)))
    records, _, _ = await driver.execute_query(
        "SHOW INDEXES YIELD name WHERE name = 'pml_link_type' RETURN count(*) AS n"
    )
    assert records[0]["n"] == 1
