"""Event handlers of the search service.

Two kinds of subscriptions, because each replica keeps in-memory caches (catalog matrix, graph
view) that only its own handlers can update:

- Group `search` (shared by all replicas, each event handled once): the writes to the vector
  store. `ToolsRegistered` / `CapabilityLearned` → index the entries (content-hash idempotent:
  work the RegisterTools/RegisterCapabilities RPC already did is skipped, redeliveries change
  nothing); `TenantDeleted` → delete the tenant's points.
- Group `search-cache-<consumer_name>` (one per replica, created at the stream's end, so only
  events published while the replica runs are read — its caches are loaded fresh at start; it is
  destroyed on shutdown): `GraphChanged` → refresh the graph view (only the named nodes when the
  event names any); catalog events for a tenant this replica has cached → `index()` again, a
  hash no-op when the shared handler already ran here, otherwise it brings this replica's matrix
  up to date (the embedding comes from the shared cache); `TenantDeleted` → delete again (a
  no-op once done) and drop the caches, so no request can reload them from not-yet-deleted
  points.
"""

from __future__ import annotations

from pml_common.bus import EventBus
from pml_common.events import (
    CapabilityLearned,
    Event,
    GraphChanged,
    TenantDeleted,
    ToolsRegistered,
)
from pml_search.catalog_index import CAPABILITY, TOOL, CatalogIndex
from pml_search.graph_view import GraphView
from pml_search.validation import capability_entry, tool_entry

GROUP = "search"
CACHE_EVENTS: tuple[type[Event], ...] = (
    ToolsRegistered,
    CapabilityLearned,
    TenantDeleted,
    GraphChanged,
)


def cache_group(consumer_name: str) -> str:
    return f"search-cache-{consumer_name}"


class SearchConsumers:
    def __init__(self, catalog: CatalogIndex, graph: GraphView) -> None:
        self._catalog = catalog
        self._graph = graph

    def subscribe(self, bus: EventBus, consumer_name: str) -> str:
        """Subscribe both groups; returns the name of this replica's cache group."""
        bus.subscribe(ToolsRegistered, GROUP, self.on_tools_registered)
        bus.subscribe(CapabilityLearned, GROUP, self.on_capability_learned)
        bus.subscribe(TenantDeleted, GROUP, self.on_tenant_deleted)
        group = cache_group(consumer_name)
        bus.subscribe(ToolsRegistered, group, self.on_tools_registered_cached, dedupe=False)
        bus.subscribe(CapabilityLearned, group, self.on_capability_learned_cached, dedupe=False)
        bus.subscribe(TenantDeleted, group, self.on_tenant_deleted, dedupe=False)
        bus.subscribe(GraphChanged, group, self.on_graph_changed, dedupe=False)
        return group

    # --- shared group: the store ----------------------------------------------------------------

    async def on_tools_registered(self, event: ToolsRegistered) -> None:
        entries = [tool_entry(event.tenant_id, spec) for spec in event.tools]
        await self._catalog.index(event.tenant_id, TOOL, entries)

    async def on_capability_learned(self, event: CapabilityLearned) -> None:
        entry = capability_entry(event.tenant_id, event.capability)
        await self._catalog.index(event.tenant_id, CAPABILITY, [entry])

    async def on_tenant_deleted(self, event: TenantDeleted) -> None:
        await self._catalog.delete_tenant(event.tenant_id)
        self._graph.forget(event.tenant_id)

    # --- replica group: the caches --------------------------------------------------------------

    async def on_tools_registered_cached(self, event: ToolsRegistered) -> None:
        if self._catalog.is_cached(event.tenant_id, TOOL):
            await self.on_tools_registered(event)

    async def on_capability_learned_cached(self, event: CapabilityLearned) -> None:
        if self._catalog.is_cached(event.tenant_id, CAPABILITY):
            await self.on_capability_learned(event)

    async def on_graph_changed(self, event: GraphChanged) -> None:
        await self._graph.refresh(event.tenant_id, event.node_ids)
