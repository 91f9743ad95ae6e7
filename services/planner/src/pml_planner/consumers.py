"""Event handlers of the planner.

- Group `planner-<consumer_name>` (one per replica, created at the stream's end, removed on
  shutdown): `GraphChanged` → sync the tenant's hypergraph if this replica has it loaded (DR-DSP
  repairs its trees), once per tenant for the changes of one bus read; `TenantDeleted` →
  forget it, with its learned thresholds and remembered suggestions. Every replica holds its
  own state, so every replica sees these.
- Group `planner` (shared, each event once, deduped): `ExecutionCompleted` → first how each
  method would have predicted it (`prequential`, before anything learns from it), then the
  outcome of the suggestions made for that intent, which adaptive thresholds learn from, and
  last the figures are added with what the run taught the judge's graph (`judged_graph`), in
  one transaction (so a failure before them, redelivered, counts nothing twice).
"""

from __future__ import annotations

from pml_common.bus import EventBus
from pml_common.events import Event, ExecutionCompleted, GraphChanged, TenantDeleted
from pml_planner.outcomes import SuggestionMemory
from pml_planner.prequential import Judge, PrequentialStore
from pml_planner.tenants import TenantPlanners

GROUP = "planner"
REPLICA_EVENTS: tuple[type[Event], ...] = (GraphChanged, TenantDeleted)


def replica_group(consumer_name: str) -> str:
    return f"planner-{consumer_name}"


class PlannerConsumers:
    def __init__(
        self,
        planners: TenantPlanners,
        memory: SuggestionMemory,
        judge: Judge,
        figures: PrequentialStore,
    ) -> None:
        self._planners = planners
        self._memory = memory
        self._judge = judge
        self._figures = figures

    def subscribe(self, bus: EventBus, consumer_name: str) -> str:
        group = replica_group(consumer_name)
        bus.subscribe_batch(GraphChanged, group, self.on_graph_changed, dedupe=False)
        bus.subscribe(TenantDeleted, group, self.on_tenant_deleted, dedupe=False)
        bus.subscribe(ExecutionCompleted, GROUP, self.on_execution_completed)
        return group

    async def on_graph_changed(self, events: list[GraphChanged]) -> None:
        # One read of the graph brings a tenant up to date with every change before it: the
        # trainer announces each batch of executions it learned, and reading a graph of
        # thousands of tools takes a second.
        for tenant in dict.fromkeys(e.tenant_id for e in events):
            await self._planners.refresh(tenant)

    async def on_tenant_deleted(self, event: TenantDeleted) -> None:
        self._planners.drop(event.tenant_id)
        # Every replica does it too; deleting twice deletes nothing the second time.
        await self._memory.forget_tenant(event.tenant_id)
        await self._figures.delete_tenant(event.tenant_id)
        self._judge.drop(event.tenant_id)

    async def on_execution_completed(self, event: ExecutionCompleted) -> None:
        judged = await self._judge.judge(event)
        await self._memory.learn(event)
        # What the run taught enters the judge's graph even when it could not be judged.
        figures, tools = (judged.figures, judged.tools) if judged is not None else (None, ())
        await self._figures.record(event.tenant_id, figures, tools, taught=event)
