"""Event handlers of the trainer: each applies one event to the graph, then says so.

Every handler publishes `GraphChanged` after a change it made, and nothing when the event had
already been applied (a redelivery): consumers refresh what the trainer actually changed.
A handler that raises leaves the event to the bus, which retries and finally dead-letters it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import structlog

from pml_common.bus import EventBus
from pml_common.events import (
    CapabilityLearned,
    Event,
    ExecutionCompleted,
    GraphChanged,
    TenantDeleted,
    ToolsRegistered,
)
from pml_common.graph_statistics import execution_effect
from pml_common.model_registry import ModelRegistry
from pml_trainer.cold_start import (
    CatalogTool,
    ColdStartConfig,
    PassageEmbedder,
    Template,
    plan_cold_start,
)
from pml_trainer.evaluation import Prequential
from pml_trainer.graph_store import GROUP, GraphStore
from pml_trainer.holdout import HoldOut
from pml_trainer.replay_buffer import ReplayBuffer, Trace

log = structlog.get_logger(__name__)


class Publisher(Protocol):
    async def publish(self, event: Event) -> str: ...


#: Outcome of a run as the learning target of its path.
OUTCOME_VALUE = {"success": 1.0, "partial": 0.5, "failure": 0.0}


def trace_of(event: ExecutionCompleted) -> Trace:
    return Trace(
        trace_id=event.event_id,
        intent=event.intent,
        path=[step.node_id for step in event.steps],
        outcome=OUTCOME_VALUE[event.outcome],
        capability_id=event.capability_id,
    )


class TrainerHandlers:
    """The trainer's reactions to events, in consumer group `GROUP`."""

    def __init__(
        self,
        store: GraphStore,
        publisher: Publisher,
        embedder: PassageEmbedder,
        templates: Sequence[Template],
        cold_start: ColdStartConfig | None = None,
        replay: ReplayBuffer | None = None,
        registry: ModelRegistry | None = None,
        holdout: HoldOut | None = None,
        prequential: Prequential | None = None,
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._embedder = embedder
        self._templates = list(templates)
        self._cold_start = cold_start or ColdStartConfig()
        self._replay = replay
        self._registry = registry
        self._holdout = holdout
        self._prequential = prequential

    def subscribe(self, bus: EventBus) -> None:
        bus.subscribe(ToolsRegistered, GROUP, self.on_tools_registered)
        bus.subscribe(CapabilityLearned, GROUP, self.on_capability_learned)
        bus.subscribe_batch(ExecutionCompleted, GROUP, self.on_executions_completed)
        bus.subscribe(TenantDeleted, GROUP, self.on_tenant_deleted)

    async def on_tools_registered(self, event: ToolsRegistered) -> None:
        tenant = event.tenant_id
        # Skips the embedding work of a redelivery; the store checks again when claiming.
        if await self._store.is_applied(tenant, event.event_id):
            return self._duplicate(event)
        new = [CatalogTool(t.id, t.server, t.name, t.description) for t in event.tools]
        catalog = await self._store.catalog(tenant)
        plan = await plan_cold_start(
            new, catalog, self._embedder, self._templates, self._cold_start
        )
        if not await self._store.register_tools(tenant, event.event_id, event.tools, plan.edges):
            return self._duplicate(event)
        log.info(
            "trainer.tools_registered",
            tenant=tenant,
            tools=len(new),
            template_edges=plan.template_edges,
            template_edges_skipped=plan.templates_skipped,
            similarity_edges=plan.similarity_edges,
            same_server_edges=plan.same_server_edges,
        )
        ends = (node for key, _ in plan.edges for node in (key.src, key.dst))
        await self._changed(event, "tools_registered", [t.id for t in new], ends)

    async def on_capability_learned(self, event: CapabilityLearned) -> None:
        spec = event.capability
        if not await self._store.learn_capability(event.tenant_id, event.event_id, spec):
            return self._duplicate(event)
        await self._changed(
            event, "capability_learned", [spec.id], [*spec.tools, *spec.capabilities]
        )

    async def on_execution_completed(self, event: ExecutionCompleted) -> None:
        await self.on_executions_completed([event])

    async def on_executions_completed(self, events: list[ExecutionCompleted]) -> None:
        """A read batch of executions, in stream order: their intents embedded together and
        their counts written in one transaction, since one execution at a time (a commit and
        an embedding call each) held the trainer to about 20 a second, for every tenant behind
        one tenant's burst. When the batch fails, the bus hands each event to this alone."""
        traces = [trace_of(event) for event in events]
        if self._prequential is not None:
            # Test, then train: how the serving scores rank each execution, before any
            # version can learn from it (idempotent on the event id).
            await self._prequential.observe_all(
                [(e.tenant_id, t) for e, t in zip(events, traces, strict=True)]
            )
        # Idempotent on the event id, and done first: a crash after the graph update
        # must not lose the trace on redelivery.
        for event, trace in zip(events, traces, strict=True):
            await self._keep(event.tenant_id, trace)
        effects = [execution_effect(event) for event in events]
        applied = await self._store.apply_executions(
            [
                (e.tenant_id, e.event_id, effect, e.occurred_at)
                for e, effect in zip(events, effects, strict=True)
            ]
        )
        for event, effect, done in zip(events, effects, applied, strict=True):
            if done:
                await self._changed(event, GraphChanged.EXECUTION, effect.node_ids)
            else:
                self._duplicate(event)

    async def _keep(self, tenant: str, trace: Trace) -> None:
        """Into the replay buffer, unless held back to judge new versions (`holdout`)."""
        if self._replay is None:
            return
        if self._holdout is None:
            await self._replay.add(tenant, trace)
            return
        held, released = await self._holdout.route(tenant, trace)
        for old in [*released, *([] if held else [trace])]:
            await self._replay.add(tenant, old)

    async def on_tenant_deleted(self, event: TenantDeleted) -> None:
        deleted = await self._store.delete_tenant(event.tenant_id)
        # What the trainer learned for the tenant goes with it: traces and model versions.
        if self._replay is not None:
            await self._replay.delete_tenant(event.tenant_id)
        if self._registry is not None:
            await self._registry.delete_tenant(event.tenant_id)
        if self._holdout is not None:
            await self._holdout.delete_tenant(event.tenant_id)
        if self._prequential is not None:
            await self._prequential.delete_tenant(event.tenant_id)
        log.info("trainer.tenant_deleted", tenant=event.tenant_id, nodes=deleted)
        # Deleting twice deletes nothing the second time: only a real deletion is announced.
        if deleted:
            await self._changed(event, "tenant_deleted", [])

    async def _changed(
        self, cause: Event, reason: str, node_ids: Iterable[str], more: Iterable[str] = ()
    ) -> None:
        ids = list(dict.fromkeys([*node_ids, *more]))
        await self._publisher.publish(
            GraphChanged.create(tenant_id=cause.tenant_id, reason=reason, node_ids=ids)
        )

    def _duplicate(self, event: Event) -> None:
        log.info(
            "trainer.event_already_applied",
            tenant=event.tenant_id,
            event_id=event.event_id,
            type=event.type,
        )
