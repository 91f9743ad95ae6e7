"""Search's subscriptions for the knowledge side, in this replica's group
`search-knowledge-<consumer_name>` (created at the streams' end, destroyed on shutdown, as the
cache group of `consumers`).

This replica caches two reads of a tenant's knowledge graph, each dropped when what it holds
changes, and read again on the tenant's next question:

- the GDS projection of its semantic relations (`pml_search.gds.GdsPaths`), written by Pass 3:
  dropped on `Pass3Completed`, `DocumentDeleted` and `TenantDeleted`;
- its concept ↔ section graph for propagation (`pml_search.propagation.Propagation` and its GDS
  projection `GdsPageRank`), which every pass writes into (mentions in Pass 1, topics and
  `COVERS` in Pass 2a, relations in Pass 3): dropped on `Pass1Completed` and `Pass2aCompleted`
  too.

A slow-to-read tenant's propagation graph and names are served from before a pass's change
while they are read again (`pml_search.propagation`); never from before a deletion.
"""

from __future__ import annotations

from typing import Protocol

from pml_common.bus import EventBus
from pml_common.events import (
    DocumentDeleted,
    Event,
    Pass1Completed,
    Pass2aCompleted,
    Pass3Completed,
    TenantDeleted,
)

#: Events that change a tenant's semantic relations.
RELATION_EVENTS: tuple[type[Event], ...] = (Pass3Completed, DocumentDeleted, TenantDeleted)
KNOWLEDGE_CACHE_EVENTS: tuple[type[Event], ...] = (
    Pass1Completed,
    Pass2aCompleted,
    *RELATION_EVENTS,
)


class TenantGraphCache(Protocol):
    def invalidate(self, tenant: str, removed: bool = False) -> None: ...


def knowledge_group(consumer_name: str) -> str:
    return f"search-knowledge-{consumer_name}"


class KnowledgeConsumers:
    def __init__(self, relations: TenantGraphCache, *graphs: TenantGraphCache) -> None:
        self._relations = relations
        self._graphs = graphs

    def subscribe(self, bus: EventBus, consumer_name: str) -> str:
        """Subscribe this replica's group; returns its name."""
        group = knowledge_group(consumer_name)
        for event_type in KNOWLEDGE_CACHE_EVENTS:
            bus.subscribe(event_type, group, self.on_graph_changed, dedupe=False)
        return group

    async def on_graph_changed(self, event: Event) -> None:
        removed = isinstance(event, DocumentDeleted | TenantDeleted)
        if isinstance(event, RELATION_EVENTS):
            self._relations.invalidate(event.tenant_id, removed)
        for graph in self._graphs:
            graph.invalidate(event.tenant_id, removed)
