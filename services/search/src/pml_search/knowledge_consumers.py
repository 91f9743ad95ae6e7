"""Search's subscriptions for the knowledge side, in this replica's group
`search-knowledge-<consumer_name>` (created at the streams' end, destroyed on shutdown, as the
cache group of `consumers`).

The GDS projection of a tenant's semantic graph (`pml_search.gds`) is this replica's cache of
the relations Pass 3 writes: `Pass3Completed`, `DocumentDeleted` and `TenantDeleted` make it
project the tenant again on its next question.
"""

from __future__ import annotations

from pml_common.bus import EventBus
from pml_common.events import DocumentDeleted, Event, Pass3Completed, TenantDeleted
from pml_search.gds import GdsPaths

KNOWLEDGE_CACHE_EVENTS: tuple[type[Event], ...] = (Pass3Completed, DocumentDeleted, TenantDeleted)


def knowledge_group(consumer_name: str) -> str:
    return f"search-knowledge-{consumer_name}"


class KnowledgeConsumers:
    def __init__(self, gds: GdsPaths) -> None:
        self._gds = gds

    def subscribe(self, bus: EventBus, consumer_name: str) -> str:
        """Subscribe this replica's group; returns its name."""
        group = knowledge_group(consumer_name)
        for event_type in KNOWLEDGE_CACHE_EVENTS:
            bus.subscribe(event_type, group, self.on_relations_changed, dedupe=False)
        return group

    async def on_relations_changed(self, event: Event) -> None:
        self._gds.invalidate(event.tenant_id)
