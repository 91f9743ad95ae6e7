"""The tool/capability graph in Neo4j; the trainer is its only writer.

Model (see docs/architecture.md, "The tool graph"):

    (:Tool {tenant_id, id, server, name, description, executions, successes, success_rate,
            last_used_at})
    (:Capability {tenant_id, id, name, description, source, executions, successes, success_rate})
    (:Capability)-[:CONTAINS {position}]->(:Tool | :Capability)   declared by CapabilityLearned
    (:Tool | :Capability)-[:LINK {type, source, origin, count, factor, weight}]->(:Tool|:Capability)
    (:AppliedEvent {tenant_id, group, event_id, applied_at})

CONTAINS is the declared membership of a capability, replaced whenever it is learned again.
LINK is learned: `contains` LINKs (capability → the nodes its runs executed) are observed and
promoted like any other edge, so they live among the LINKs, not on CONTAINS. Tool → tool LINKs
are what search ranks with.

Every query is a constant string with parameters. Writes that count (executions) run in one
transaction with the `AppliedEvent` record of the event, so a redelivered event changes nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import neo4j

from pml_common.events import CapabilitySpec, ToolSpec, utcnow
from pml_common.first_stage import schema_fields
from pml_common.graph_statistics import (
    EdgeKey,
    EdgeState,
    ExecutionEffect,
    NodeUpdate,
    merge_cold_start,
    observe,
)
from pml_common.input_rules import is_tool_id
from pml_common.stores import create_schema_rule
from pml_trainer.cold_start import CatalogTool, ColdStartEdge

_T = TypeVar("_T")
GROUP = "trainer"
# Large registrations are written in slices so no single transaction grows without bound.
_TOOL_BATCH = 2000
_EDGE_BATCH = 5000

SCHEMA = (
    "CREATE CONSTRAINT pml_tool_key IF NOT EXISTS "
    "FOR (n:Tool) REQUIRE (n.tenant_id, n.id) IS UNIQUE",
    "CREATE CONSTRAINT pml_capability_key IF NOT EXISTS "
    "FOR (n:Capability) REQUIRE (n.tenant_id, n.id) IS UNIQUE",
    "CREATE CONSTRAINT pml_applied_event_key IF NOT EXISTS "
    "FOR (n:AppliedEvent) REQUIRE (n.tenant_id, n.group, n.event_id) IS UNIQUE",
    "CREATE INDEX pml_applied_event_at IF NOT EXISTS FOR (n:AppliedEvent) ON (n.applied_at)",
    "CREATE INDEX pml_link_type IF NOT EXISTS FOR ()-[r:LINK]-() ON (r.type)",
)


@dataclass(frozen=True)
class NodeStats:
    executions: int
    successes: int
    success_rate: float | None  # None: never executed


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    type: str  # dependency | contains | sequence
    source: str  # observed | inferred | template
    origin: str  # execution | template | similarity | same_server
    count: int
    weight: float


# --- queries -------------------------------------------------------------------------------------

_IS_APPLIED = """
MATCH (a:AppliedEvent {tenant_id: $tenant, group: $group, event_id: $event_id})
RETURN count(a) > 0 AS applied
"""

# Claims the event; the uniqueness constraint makes a concurrent second claim fail at commit.
_CLAIM = """
OPTIONAL MATCH (a:AppliedEvent {tenant_id: $tenant, group: $group, event_id: $event_id})
WITH a WHERE a IS NULL
CREATE (:AppliedEvent {tenant_id: $tenant, group: $group, event_id: $event_id, applied_at: $at})
RETURN count(*) AS claimed
"""

_UPSERT_TOOLS = """
UNWIND $tools AS t
MERGE (n:Tool {tenant_id: $tenant, id: t.id})
ON CREATE SET n.executions = 0, n.successes = 0, n.registered_at = $at
SET n.server = t.server, n.name = t.name, n.description = t.description,
    n.input_fields = t.fields
"""

_UPSERT_CAPABILITY = """
MERGE (c:Capability {tenant_id: $tenant, id: $id})
ON CREATE SET c.executions = 0, c.successes = 0
SET c.name = $name, c.description = $description, c.source = $source
WITH c
OPTIONAL MATCH (c)-[old:CONTAINS]->()
DELETE old
"""

_CONTAIN_TOOLS = """
MATCH (c:Capability {tenant_id: $tenant, id: $id})
UNWIND $children AS t
MERGE (n:Tool {tenant_id: $tenant, id: t.id})
ON CREATE SET n.server = t.server, n.name = t.name, n.description = '',
              n.executions = 0, n.successes = 0
MERGE (c)-[r:CONTAINS]->(n)
SET r.position = t.position
"""

_CONTAIN_CAPABILITIES = """
MATCH (c:Capability {tenant_id: $tenant, id: $id})
UNWIND $children AS k
MERGE (n:Capability {tenant_id: $tenant, id: k.id})
ON CREATE SET n.name = k.id, n.description = '', n.executions = 0, n.successes = 0
MERGE (c)-[r:CONTAINS]->(n)
SET r.position = k.position
"""

_KNOWN_CAPABILITIES = """
MATCH (c:Capability {tenant_id: $tenant}) WHERE c.id IN $ids RETURN c.id AS id
"""

# success_rate = successes / executions, as statistics.success_rate defines it.
_COUNT_TOOLS = """
UNWIND $updates AS u
MERGE (n:Tool {tenant_id: $tenant, id: u.id})
ON CREATE SET n.server = u.server, n.name = u.name, n.description = ''
SET n.executions = coalesce(n.executions, 0) + u.executions,
    n.successes = coalesce(n.successes, 0) + u.successes,
    // Events may arrive out of order: last_used_at only moves forward.
    n.last_used_at = CASE WHEN n.last_used_at > $at THEN n.last_used_at ELSE $at END
SET n.success_rate = toFloat(n.successes) / n.executions
"""

_COUNT_CAPABILITIES = """
UNWIND $updates AS u
MERGE (n:Capability {tenant_id: $tenant, id: u.id})
ON CREATE SET n.name = u.id, n.description = ''
SET n.executions = coalesce(n.executions, 0) + u.executions,
    n.successes = coalesce(n.successes, 0) + u.successes,
    // Events may arrive out of order: last_used_at only moves forward.
    n.last_used_at = CASE WHEN n.last_used_at > $at THEN n.last_used_at ELSE $at END
SET n.success_rate = toFloat(n.successes) / n.executions
"""

# Ends are matched by their kind, so a Tool and a Capability sharing an id are never confused.
_ENDS = """
CALL (e) {
  MATCH (a:Tool {tenant_id: $tenant, id: e.src}) WHERE e.src_kind = 'tool' RETURN a
  UNION
  MATCH (a:Capability {tenant_id: $tenant, id: e.src}) WHERE e.src_kind = 'capability' RETURN a
}
CALL (e) {
  MATCH (b:Tool {tenant_id: $tenant, id: e.dst}) WHERE e.dst_kind = 'tool' RETURN b
  UNION
  MATCH (b:Capability {tenant_id: $tenant, id: e.dst}) WHERE e.dst_kind = 'capability' RETURN b
}
"""

# `SET r.count = coalesce(r.count, 0)` reads r.count in its own right-hand side, so Neo4j takes
# the write lock *before* reading: concurrent writers of one edge serialise here, and the state
# returned is the one the next state is computed from (no lost observation).
_LOCK_EDGES = (
    "UNWIND $edges AS e\n"
    + _ENDS
    + """
MERGE (a)-[r:LINK {type: e.type}]->(b)
SET r.count = coalesce(r.count, 0)
RETURN e.src AS src, e.dst AS dst, e.type AS type, elementId(r) AS rid,
       r.source AS source, r.origin AS origin, r.count AS count, r.factor AS factor
"""
)

_WRITE_EDGES = """
UNWIND $edges AS e
MATCH ()-[r:LINK]->() WHERE elementId(r) = e.rid
SET r.source = e.source, r.origin = e.origin, r.count = e.count, r.factor = e.factor,
    r.weight = e.weight, r.updated_at = $at
"""

# One record of rows: the async driver's cost per record made a 100,000-tool catalog take
# seconds to read, and cold start reads it for every registration.
_CATALOG = """
MATCH (n:Tool {tenant_id: $tenant})
RETURN collect([n.id, n.server, n.name, coalesce(n.description, '')]) AS rows
"""

_STATS = """
CALL () {
  MATCH (n:Tool {tenant_id: $tenant}) WHERE n.id IN $ids RETURN n
  UNION
  MATCH (n:Capability {tenant_id: $tenant}) WHERE n.id IN $ids RETURN n
}
RETURN n.id AS id, coalesce(n.executions, 0) AS executions,
       coalesce(n.successes, 0) AS successes, n.success_rate AS success_rate
"""

_EDGE_FIELDS = """
RETURN a.id AS src, b.id AS dst, r.type AS type, r.source AS source, r.origin AS origin,
       r.count AS count, r.weight AS weight
"""

_EDGES = (
    """
CALL () {
  MATCH (a:Tool {tenant_id: $tenant})-[r:LINK]->(b) RETURN a, r, b
  UNION
  MATCH (a:Capability {tenant_id: $tenant})-[r:LINK]->(b) RETURN a, r, b
}
"""
    + _EDGE_FIELDS
    + "ORDER BY src, dst, type"
)

_NEIGHBOURS = (
    """
MATCH (t:Tool {tenant_id: $tenant, id: $id})
CALL (t) {
  MATCH (t)-[r:LINK]->(other) RETURN t AS a, r, other AS b
  UNION
  MATCH (other)-[r:LINK]->(t) RETURN other AS a, r, t AS b
}
"""
    + _EDGE_FIELDS
    + "ORDER BY weight DESC, src, dst"
)

_PRUNE_APPLIED = """
MATCH (a:AppliedEvent) WHERE a.applied_at < $before AND a.group = $group
CALL (a) { DELETE a } IN TRANSACTIONS OF 5000 ROWS
"""

_DELETE_TENANT = (
    "MATCH (n:Tool {tenant_id: $tenant}) CALL (n) { DETACH DELETE n } IN TRANSACTIONS OF 1000 ROWS",
    "MATCH (n:Capability {tenant_id: $tenant}) "
    "CALL (n) { DETACH DELETE n } IN TRANSACTIONS OF 1000 ROWS",
    "MATCH (n:AppliedEvent {tenant_id: $tenant, group: $group}) "
    "CALL (n) { DELETE n } IN TRANSACTIONS OF 1000 ROWS",
)


# --- the store ----------------------------------------------------------------------------------


class GraphStore:
    """Reads and writes of the tool graph, per tenant."""

    def __init__(
        self,
        driver: neo4j.AsyncDriver,
        database: str,
        group: str = GROUP,
        tool_batch: int = _TOOL_BATCH,
        edge_batch: int = _EDGE_BATCH,
    ) -> None:
        self._driver = driver
        self._database = database
        self._group = group
        self._tool_batch = tool_batch
        self._edge_batch = edge_batch

    async def ensure_schema(self) -> None:
        """Constraints and indexes (idempotent; run at start-up)."""
        for statement in SCHEMA:
            await create_schema_rule(self._driver, statement, self._database)

    # --- event writes: each returns False when the event had already been applied ----------

    async def is_applied(self, tenant: str, event_id: str) -> bool:
        records = await self._read(_IS_APPLIED, tenant=tenant, event_id=event_id, group=self._group)
        return bool(records[0]["applied"])

    async def register_tools(
        self,
        tenant: str,
        event_id: str,
        tools: Sequence[ToolSpec],
        cold_start: Sequence[ColdStartEdge] = (),
    ) -> bool:
        """Upsert tools (statistics kept) and merge their cold-start edges.

        A registration of ordinary size is one transaction with its AppliedEvent. A larger one
        is written in slices, the event claimed last: both writes are idempotent (MERGE; cold
        start never overrides evidence), so a crash midway makes the redelivery redo the same
        writes and never double anything, while no transaction grows without bound.
        """
        at = utcnow()
        rows = [_tool_row(t) for t in tools]
        edges = list(cold_start)
        if len(rows) <= self._tool_batch and len(edges) <= self._edge_batch:
            return await self._write(self._register_at_once, tenant, event_id, rows, edges, at)
        if await self.is_applied(tenant, event_id):
            return False
        for chunk in _chunks(rows, self._tool_batch):
            await self._write(self._upsert_tools, tenant, chunk, at)
        for chunk_edges in _chunks(edges, self._edge_batch):
            await self._write(self._merge_cold_start, tenant, chunk_edges, at)
        return await self._write(self._claim, tenant, event_id, at)

    async def learn_capability(self, tenant: str, event_id: str, spec: CapabilitySpec) -> bool:
        """Upsert a capability (statistics kept) and replace its CONTAINS children."""
        return await self._write(self._learn_capability, tenant, event_id, spec, utcnow())

    async def apply_execution(
        self, tenant: str, event_id: str, effect: ExecutionEffect, at: datetime | None = None
    ) -> bool:
        """Count one execution: node outcomes and observed edges, in one transaction."""
        [applied] = await self.apply_executions([(tenant, event_id, effect, at or utcnow())])
        return applied

    async def apply_executions(
        self, executions: Sequence[tuple[str, str, ExecutionEffect, datetime]]
    ) -> list[bool]:
        """Count executions (tenant, event id, effect, time) in one transaction, in order: one
        commit for a read batch instead of one per execution. False for an event already
        applied."""
        return await self._write(self._apply_executions, executions)

    async def _apply_executions(
        self,
        tx: neo4j.AsyncManagedTransaction,
        executions: Sequence[tuple[str, str, ExecutionEffect, datetime]],
    ) -> list[bool]:
        return [await self._apply_execution(tx, *execution) for execution in executions]

    async def add_cold_start_edges(self, tenant: str, edges: Sequence[ColdStartEdge]) -> None:
        """Merge cold-start guesses outside any event (idempotent, e.g. after new templates)."""
        at = utcnow()
        for chunk in _chunks(list(edges), self._edge_batch):
            await self._write(self._merge_cold_start, tenant, chunk, at)

    async def delete_tenant(self, tenant: str) -> int:
        """Delete the tenant's tools, capabilities, edges and applied-event records.

        Deleting is idempotent on its own, and leaving no record of the tenant is the point, so
        no AppliedEvent is kept for it. Batched (auto-commit transactions) for large tenants.
        """
        deleted = 0
        async with self._driver.session(database=self._database) as session:
            for statement in _DELETE_TENANT:
                result = await session.run(statement, tenant=tenant, group=self._group)
                summary = await result.consume()
                deleted += summary.counters.nodes_deleted
        return deleted

    async def prune_applied(self, before: datetime) -> int:
        """Forget events applied before `before`; returns how many records were deleted.

        The records only guard against redeliveries, which come within minutes; keeping them
        as long as the bus remembers event ids (`dedupe_ttl_s`) keeps both guards in step.
        """
        async with self._driver.session(database=self._database) as session:
            result = await session.run(_PRUNE_APPLIED, before=before, group=self._group)
            summary = await result.consume()
        return summary.counters.nodes_deleted

    # --- reads --------------------------------------------------------------------------------

    async def catalog(self, tenant: str) -> list[CatalogTool]:
        (record,) = await self._read(_CATALOG, tenant=tenant)
        return [CatalogTool(*row) for row in record["rows"]]

    async def success_stats(self, tenant: str, ids: Sequence[str]) -> dict[str, NodeStats]:
        """Statistics of the named tools and capabilities; unknown ids are absent."""
        records = await self._read(_STATS, tenant=tenant, ids=list(ids))
        return {
            r["id"]: NodeStats(int(r["executions"]), int(r["successes"]), r["success_rate"])
            for r in records
        }

    async def edges(self, tenant: str) -> list[Edge]:
        """Every LINK of the tenant (tool→tool, and capability→node for `contains`)."""
        return [_edge(r) for r in await self._read(_EDGES, tenant=tenant)]

    async def neighbours(self, tenant: str, tool_id: str) -> list[Edge]:
        """LINKs into and out of `tool_id`, heaviest first.

        `edge.dst == tool_id`: the other end often comes before; `edge.src == tool_id`: after.
        """
        return [_edge(r) for r in await self._read(_NEIGHBOURS, tenant=tenant, id=tool_id)]

    # --- transaction functions ----------------------------------------------------------------

    async def _claim(
        self, tx: neo4j.AsyncManagedTransaction, tenant: str, event_id: str, at: datetime
    ) -> bool:
        result = await tx.run(_CLAIM, tenant=tenant, group=self._group, event_id=event_id, at=at)
        record = await result.single(strict=True)
        return bool(record["claimed"])

    async def _upsert_tools(
        self,
        tx: neo4j.AsyncManagedTransaction,
        tenant: str,
        rows: list[dict[str, Any]],
        at: datetime,
    ) -> None:
        await _run(tx, _UPSERT_TOOLS, tenant=tenant, tools=rows, at=at)

    async def _register_at_once(
        self,
        tx: neo4j.AsyncManagedTransaction,
        tenant: str,
        event_id: str,
        rows: list[dict[str, Any]],
        edges: list[ColdStartEdge],
        at: datetime,
    ) -> bool:
        if not await self._claim(tx, tenant, event_id, at):
            return False
        await self._upsert_tools(tx, tenant, rows, at)
        await self._merge_cold_start(tx, tenant, edges, at)
        return True

    async def _learn_capability(
        self,
        tx: neo4j.AsyncManagedTransaction,
        tenant: str,
        event_id: str,
        spec: CapabilitySpec,
        at: datetime,
    ) -> bool:
        if not await self._claim(tx, tenant, event_id, at):
            return False
        await _run(
            tx,
            _UPSERT_CAPABILITY,
            tenant=tenant,
            id=spec.id,
            name=spec.name,
            description=spec.description,
            source=spec.source,
        )
        tools = [{**_tool_stub(t), "position": i} for i, t in enumerate(spec.tools)]
        await _run(tx, _CONTAIN_TOOLS, tenant=tenant, id=spec.id, children=tools)
        children = [
            {"id": k, "position": i} for i, k in enumerate(spec.capabilities) if k != spec.id
        ]
        await _run(tx, _CONTAIN_CAPABILITIES, tenant=tenant, id=spec.id, children=children)
        return True

    async def _apply_execution(
        self,
        tx: neo4j.AsyncManagedTransaction,
        tenant: str,
        event_id: str,
        effect: ExecutionEffect,
        at: datetime,
    ) -> bool:
        if not await self._claim(tx, tenant, event_id, at):
            return False
        kinds = await self._kinds(tx, tenant, effect)
        tools = [u for u in effect.step_updates if kinds[u.node_id] == "tool"]
        capabilities = [u for u in effect.step_updates if kinds[u.node_id] == "capability"]
        if effect.capability_update is not None:
            capabilities.append(effect.capability_update)
        await _run(
            tx,
            _COUNT_TOOLS,
            tenant=tenant,
            at=at,
            updates=[{**_tool_stub(u.node_id), **_counts(u)} for u in tools],
        )
        await _run(
            tx,
            _COUNT_CAPABILITIES,
            tenant=tenant,
            at=at,
            updates=[{"id": u.node_id, **_counts(u)} for u in capabilities],
        )
        await self._update_edges(
            tx, tenant, [(k, None) for k in effect.edges], kinds, lambda cur, _: observe(cur), at
        )
        return True

    async def _merge_cold_start(
        self,
        tx: neo4j.AsyncManagedTransaction,
        tenant: str,
        edges: list[ColdStartEdge],
        at: datetime,
    ) -> None:
        # Cold-start edges join tools only (templates, similarity and servers are tool facts).
        ids = {k.src for k, _ in edges} | {k.dst for k, _ in edges}
        kinds = dict.fromkeys(ids, "tool")
        await self._update_edges(
            tx, tenant, list(edges), kinds, lambda cur, cand: merge_cold_start(cur, cand), at
        )

    async def _kinds(
        self, tx: neo4j.AsyncManagedTransaction, tenant: str, effect: ExecutionEffect
    ) -> dict[str, str]:
        """Whether each node of an execution is a Tool or a Capability.

        A known capability id is a capability; an unknown id shaped like a tool id
        (`server:tool`) is a tool (created if never registered); anything else is a capability.
        """
        ids = effect.node_ids
        result = await tx.run(_KNOWN_CAPABILITIES, tenant=tenant, ids=ids)
        known = {r["id"] async for r in result}
        kinds = {i: "capability" if i in known or not _is_tool_id(i) else "tool" for i in ids}
        if effect.capability_update is not None:
            kinds[effect.capability_update.node_id] = "capability"
        return kinds

    async def _update_edges(
        self,
        tx: neo4j.AsyncManagedTransaction,
        tenant: str,
        edges: Sequence[tuple[EdgeKey, Any]],
        kinds: dict[str, str],
        step: Callable[[EdgeState | None, Any], EdgeState | None],
        at: datetime,
    ) -> None:
        """Lock the edges, compute each next state with `step`, write the ones that change."""
        if not edges:
            return
        rows = [
            {
                "src": k.src,
                "dst": k.dst,
                "type": k.type,
                "src_kind": kinds[k.src],
                "dst_kind": kinds[k.dst],
            }
            for k, _ in edges
        ]
        arg = dict(edges)
        result = await tx.run(_LOCK_EDGES, tenant=tenant, edges=rows)
        writes = []
        async for r in result:
            key = EdgeKey(r["src"], r["dst"], r["type"])
            nxt = step(_state(r), arg[key])
            if nxt is not None:
                writes.append(
                    {
                        "rid": r["rid"],
                        "source": nxt.source,
                        "origin": nxt.origin,
                        "count": nxt.count,
                        "factor": nxt.factor,
                        "weight": nxt.weight(key.type),
                    }
                )
        await _run(tx, _WRITE_EDGES, edges=writes, at=at)

    # --- plumbing -----------------------------------------------------------------------------

    async def _write(self, work: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        async with self._driver.session(database=self._database) as session:
            return await session.execute_write(work, *args)

    async def _read(self, query: str, **params: Any) -> list[neo4j.Record]:
        async with self._driver.session(
            database=self._database, default_access_mode=neo4j.READ_ACCESS
        ) as session:
            return await session.execute_read(_fetch, query, params)


def _state(record: neo4j.Record) -> EdgeState | None:
    if record["source"] is None:  # created by the MERGE that locked it
        return None
    return EdgeState(
        source=record["source"],
        origin=record["origin"],
        count=int(record["count"]),
        factor=float(record["factor"] if record["factor"] is not None else 1.0),
    )


def _edge(r: neo4j.Record) -> Edge:
    return Edge(
        r["src"],
        r["dst"],
        r["type"],
        r["source"],
        r["origin"] or "execution",
        int(r["count"] or 0),
        float(r["weight"] or 0.0),
    )


def _counts(u: NodeUpdate) -> dict[str, int]:
    return {"executions": u.executions, "successes": u.successes}


def _tool_row(tool: ToolSpec) -> dict[str, Any]:
    """A tool's node properties; the input schema is kept as its field names, which the first
    stage's lexical index reads (`first_stage.schema_fields`)."""
    return {
        "id": tool.id,
        "server": tool.server,
        "name": tool.name,
        "description": tool.description,
        "fields": list(schema_fields(tool.input_schema)),
    }


def _tool_stub(tool_id: str) -> dict[str, str]:
    """Server and name of a tool known only by its id (`server:name`)."""
    server, _, name = tool_id.partition(":")
    return {"id": tool_id, "server": server, "name": name}


def _is_tool_id(node_id: str) -> bool:
    return is_tool_id(node_id)


async def _fetch(
    tx: neo4j.AsyncManagedTransaction, query: str, params: dict[str, Any]
) -> list[neo4j.Record]:
    result = await tx.run(query, params)
    return [record async for record in result]


async def _run(tx: neo4j.AsyncManagedTransaction, query: str, **params: Any) -> None:
    result = await tx.run(query, params)
    await result.consume()


def _chunks(items: list[_T], size: int) -> Iterator[list[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
