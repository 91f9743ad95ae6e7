"""Event handlers of the search service (consumer group `search`).

- `ToolsRegistered` / `CapabilityLearned` → index the entries (content-hash idempotent: work the
  RegisterTools/RegisterCapabilities RPC already did is skipped, redeliveries change nothing).
- `TenantDeleted` → delete the tenant's points and forget its cached graph view.
- `GraphChanged` → refresh the cached graph view (only the named nodes when the event names any).
"""

from __future__ import annotations

from pml_common.bus import EventBus
from pml_common.events import CapabilityLearned, GraphChanged, TenantDeleted, ToolsRegistered
from pml_search.catalog_index import CAPABILITY, TOOL, CatalogIndex
from pml_search.graph_view import GraphView
from pml_search.validation import capability_entry, tool_entry

GROUP = "search"


class SearchConsumers:
    def __init__(self, catalog: CatalogIndex, graph: GraphView) -> None:
        self._catalog = catalog
        self._graph = graph

    def subscribe(self, bus: EventBus, group: str = GROUP) -> None:
        bus.subscribe(ToolsRegistered, group, self.on_tools_registered)
        bus.subscribe(CapabilityLearned, group, self.on_capability_learned)
        bus.subscribe(TenantDeleted, group, self.on_tenant_deleted)
        bus.subscribe(GraphChanged, group, self.on_graph_changed)

    async def on_tools_registered(self, event: ToolsRegistered) -> None:
        entries = [tool_entry(event.tenant_id, spec) for spec in event.tools]
        await self._catalog.index(event.tenant_id, TOOL, entries)

    async def on_capability_learned(self, event: CapabilityLearned) -> None:
        entry = capability_entry(event.tenant_id, event.capability)
        await self._catalog.index(event.tenant_id, CAPABILITY, [entry])

    async def on_tenant_deleted(self, event: TenantDeleted) -> None:
        await self._catalog.delete_tenant(event.tenant_id)
        self._graph.forget(event.tenant_id)

    async def on_graph_changed(self, event: GraphChanged) -> None:
        await self._graph.refresh(event.tenant_id, event.node_ids)
