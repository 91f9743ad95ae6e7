"""Event handlers of the scorer: keep every replica's in-memory models current.

Each replica holds its own models, so each must see every event: the subscriptions use a
consumer group per replica, `scorer-<consumer_name>`, created at the end of each stream before
the bus starts (a new replica loads tenants fresh on first request and must not replay
history), and destroyed on shutdown. Handlers are idempotent (a rebuild reads the stores as
they are now), so the bus's event-id dedupe is not needed.

- `GraphChanged` → rebuild the tenant if this replica serves it: new tools and capabilities are
  scored without a restart (a change the model does not depend on keeps the current model).
  An execution that touched only nodes the model already has changes statistics and links,
  which the model does not read, so it does not even cost a read of the graph.
- `ModelPublished` → rebuild the tenant if served, with the registry's current version.
- `TenantDeleted` → forget the tenant.
"""

from __future__ import annotations

from pml_common.bus import EventBus
from pml_common.events import Event, GraphChanged, ModelPublished, TenantDeleted
from pml_scorer.snapshots import ModelSnapshots

EVENTS: tuple[type[Event], ...] = (GraphChanged, ModelPublished, TenantDeleted)


def replica_group(consumer_name: str) -> str:
    return f"scorer-{consumer_name}"


class ScorerConsumers:
    def __init__(self, snapshots: ModelSnapshots) -> None:
        self._snapshots = snapshots

    def subscribe(self, bus: EventBus, consumer_name: str) -> str:
        """Subscribe this replica's group; returns its name."""
        group = replica_group(consumer_name)
        bus.subscribe(GraphChanged, group, self.on_graph_changed, dedupe=False)
        bus.subscribe(ModelPublished, group, self.on_model_published, dedupe=False)
        bus.subscribe(TenantDeleted, group, self.on_tenant_deleted, dedupe=False)
        return group

    async def on_graph_changed(self, event: GraphChanged) -> None:
        statistics_only = event.reason == GraphChanged.EXECUTION
        if statistics_only and self._knows_all(event.tenant_id, event.node_ids):
            return
        await self._snapshots.refresh(event.tenant_id)

    def _knows_all(self, tenant: str, node_ids: list[str]) -> bool:
        current = self._snapshots.peek(tenant)
        if current is None:
            return False
        hierarchy = current.model.hierarchy
        return all(hierarchy.node_index(node) is not None for node in node_ids)

    async def on_model_published(self, event: ModelPublished) -> None:
        await self._snapshots.refresh(event.tenant_id)

    async def on_tenant_deleted(self, event: TenantDeleted) -> None:
        self._snapshots.drop(event.tenant_id)
