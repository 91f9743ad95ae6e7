"""How the scorer ranks a tenant's tools right now, as the trainer sees it: prequential figures
and the held-back comparison that gates every new version (`pml_shgat.gating`).

A `TenantView` is the tenant's hierarchy, its untrained first stage
(`pml_common.tool_first_stage`) and its serving version (parameters, execution memory, query
adapter and the corrections' weights), so `served` computes what `ScoreTools` serves:
`first_stage + w · SHGAT + m · memory + a · (adapted first stage − first stage)`
(`pml_shgat.gating`).
Views are cached per tenant and rebuilt when the registry's version changes or after
`max_age_s` (new tools reach the prequential figures within that delay; a tool the view does
not know yet counts as ranked last).

Memory: the views hold at most `max_nodes` graph nodes over all tenants
(`PML_TRAINER_CACHE_MAX_NODES`, an empty view counting as one); the least recently used tenants
are dropped and read again on their next execution, as an expired view is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import numpy as np
import structlog
from neo4j import AsyncDriver
from numpy.typing import NDArray
from opentelemetry import metrics

from pml_common.embedding import Embedder
from pml_common.model_registry import ModelRecord, ModelRegistry
from pml_common.prequential import PrequentialStore
from pml_common.settings import Settings
from pml_common.tenant_cache import TenantCache
from pml_common.tool_first_stage import FusedFirstStage, Intent, embed_intents
from pml_common.tool_graph import ToolGraph, read_tool_graph
from pml_shgat.adapter import QueryAdapter
from pml_shgat.gating import Judged, Weights, one_figures, served_tool_scores
from pml_shgat.hierarchy import Hierarchy
from pml_shgat.memory import ServedMemory
from pml_shgat.params import read_version
from pml_shgat.serving import ServingModel
from pml_trainer.replay_buffer import Trace

log = structlog.get_logger(__name__)
_meter = metrics.get_meter("pml.trainer")
_recall = _meter.create_histogram(
    "pml.trainer.prequential.recall",
    description="Recall@k of the executed tools under the serving scores, before learning",
)
_first_rank = _meter.create_histogram(
    "pml.trainer.prequential.first_rank",
    description="Rank of the first executed tool under the serving scores, before learning",
)


@dataclass(frozen=True)
class TenantView:
    hierarchy: Hierarchy
    baseline: FusedFirstStage
    #: The published version's SHGAT, None before any version was admitted.
    serving: ServingModel | None
    version: str
    built_at: float
    #: The published version's execution memory over this catalog, and its query adapter.
    memory: ServedMemory | None = None
    adapter: QueryAdapter | None = None
    #: The corrections' weights the gate chose for the published version.
    weights: Weights = Weights(0.0, 0.0, 0.0)  # noqa: RUF009 (an immutable tuple)

    def judged(self, trace: Trace) -> Judged | None:
        """The trace's executed tools as hierarchy indices; None when it used no known tool."""
        known = (self.hierarchy.node_index(node) for node in dict.fromkeys(trace.path))
        relevant = tuple(i for i in known if i is not None and self.hierarchy.is_tool(i))
        return Judged(relevant) if relevant else None

    def first_stage(self, intent: Intent) -> NDArray[np.floating]:
        return self.baseline.scores(intent)

    def served(self, intent: Intent) -> NDArray[np.floating]:
        return self.corrected(self.first_stage(intent), intent)

    def corrected(self, first_stage: NDArray[np.floating], intent: Intent) -> NDArray[np.floating]:
        """The served scores of `intent` from its first-stage scores, already computed."""
        adapt = self.adapter.adapt if self.adapter is not None and self.weights.adapter else None
        adapted = self.baseline.scores_adapted(intent, adapt)[1] if adapt else None
        return served_tool_scores(
            first_stage, intent.vector, self.serving, self.memory, self.weights, adapted
        )


def build_view(
    graph: ToolGraph,
    hierarchy: Hierarchy,
    published: tuple[ModelRecord, bytes] | None,
    baseline: FusedFirstStage | None = None,
) -> TenantView:
    """The view of a tenant's graph (and its hierarchy) served with `published` (the first
    stage alone when None or unusable); `baseline`: the graph's first stage, when built."""
    baseline = baseline if baseline is not None else FusedFirstStage.of_graph(graph)
    untrained = TenantView(hierarchy, baseline, None, "untrained", time.monotonic())
    if published is None:
        return untrained
    record, blob = published
    try:
        version = read_version(blob)
    except Exception as exc:  # the scorer serves the first stage alone then, and so do we
        log.error("evaluation.model_unreadable", version=record.version, error=repr(exc))
        return untrained
    if version.config.dim != hierarchy.dim:
        return untrained
    ranker = version.memory
    return TenantView(
        hierarchy,
        baseline,
        ServingModel(version.config, version.params, hierarchy),
        record.version,
        time.monotonic(),
        ranker.serve(hierarchy.tool_ids, graph.servers_of(hierarchy.tool_ids)) if ranker else None,
        # an adapter fitted for another tool embedder cannot map this one's vectors
        version.adapter if version.adapter and version.adapter.parts == baseline.parts else None,
        Weights.of_metrics(record.metrics),
    )


def hierarchy_of(graph: ToolGraph, dim: int) -> Hierarchy:
    return Hierarchy.build(graph.tool_vectors, graph.capabilities, dim=dim)


def without_workflows(
    view: TenantView,
    graph: ToolGraph,
    published: tuple[ModelRecord, bytes] | None,
    tool_sets: Collection[frozenset[str]],
) -> TenantView:
    """`view` as if the capabilities running exactly one of `tool_sets` were not registered:
    how the tenant's scores treat such work when it is new (no capability stands for it yet).
    The tools and the first stage are the same, so score vectors compare index for index."""
    kept = tuple(c for c in graph.capabilities if frozenset(c.tools) not in tool_sets)
    if len(kept) == len(graph.capabilities):
        return view
    blind = replace(graph, capabilities=kept)
    hierarchy = hierarchy_of(blind, view.hierarchy.dim)
    return build_view(blind, hierarchy, published, view.baseline)


#: Default of `max_nodes`: the setting's.
MAX_NODES: int = Settings.model_fields["trainer_cache_max_nodes"].default


def _nodes(view: TenantView) -> int:
    """Graph nodes, plus one per remembered execution (an intent vector each, like a node) and
    one per row of the query adapter's maps (an embedding-sized vector each)."""
    remembered = len(view.memory.memory) if view.memory is not None else 0
    adapter = view.adapter.rows if view.adapter is not None else 0
    return max(1, view.hierarchy.num_nodes + remembered + adapter)


class TenantViews:
    """Cached `TenantView`s of the tenants the trainer receives executions for."""

    def __init__(
        self,
        driver: AsyncDriver,
        database: str,
        embedder: Embedder,
        registry: ModelRegistry,
        max_age_s: float = 10.0,
        tool_embedder: Embedder | None = None,
        max_nodes: int = MAX_NODES,
    ) -> None:
        self._driver = driver
        self._database = database
        self._embedder = embedder
        self._tool_embedder = tool_embedder
        self._registry = registry
        self._max_age_s = max_age_s
        # Views are replaced whole, never updated in place: none is ever busy.
        self._views: TenantCache[str, TenantView] = TenantCache("trainer.views", max_nodes, _nodes)

    async def get(self, tenant: str) -> TenantView:
        cached = self._views.get(tenant)
        if cached is not None and time.monotonic() - cached.built_at < self._max_age_s:
            record = await self._registry.current_record(tenant)
            if (record.version if record else "untrained") == cached.version:
                return cached
        graph = await read_tool_graph(
            self._driver, self._database, tenant, self._embedder, self._tool_embedder
        )
        published = await self._registry.current(tenant)
        hierarchy = hierarchy_of(graph, self._embedder.dim)
        view = await asyncio.to_thread(build_view, graph, hierarchy, published)
        self._views.put(tenant, view)
        return view

    def forget(self, tenant: str) -> None:
        self._views.pop(tenant)


class Prequential:
    """Records how the serving scores rank each execution's tools, before it is learned."""

    def __init__(
        self,
        views: TenantViews,
        store: PrequentialStore,
        embedder: Embedder,
        tool_embedder: Embedder | None = None,
    ) -> None:
        self._views = views
        self._store = store
        self._embedder = embedder
        self._tool_embedder = tool_embedder

    async def observe(self, tenant: str, trace: Trace) -> tuple[float, ...] | None:
        """Record the trace's figures (recall@1, @5, @10, first rank); None if it used no tool
        the tenant has."""
        [figures] = await self.observe_all([(tenant, trace)])
        return figures

    async def observe_all(
        self, executions: Sequence[tuple[str, Trace]]
    ) -> list[tuple[float, ...] | None]:
        """`observe` for each (tenant, trace), the intents embedded in one batch."""
        judged = []
        for tenant, trace in executions:
            view = await self._views.get(tenant)
            judged.append((view, view.judged(trace)))
        texts = [
            trace.intent
            for (_, trace), (_, one) in zip(executions, judged, strict=True)
            if one is not None
        ]
        intents = iter(await embed_intents(texts, self._embedder, self._tool_embedder))
        results: list[tuple[float, ...] | None] = []
        for (tenant, trace), (view, one) in zip(executions, judged, strict=True):
            if one is None:
                results.append(None)
                continue
            figures = one_figures(view.served(next(intents)), one.relevant)
            if await self._store.record(tenant, trace.trace_id, *figures):
                _export(tenant, figures)
            results.append(figures)
        return results

    async def delete_tenant(self, tenant: str) -> None:
        self._views.forget(tenant)
        await self._store.delete_tenant(tenant)


def _export(tenant: str, figures: Sequence[float]) -> None:
    for k, value in zip((1, 5, 10), figures[:3], strict=True):
        _recall.record(value, {"pml.tenant_id": tenant, "k": k})
    _first_rank.record(figures[3], {"pml.tenant_id": tenant})
