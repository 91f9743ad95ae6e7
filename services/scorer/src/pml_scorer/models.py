"""One tenant's serving model, and how it is built from the tool graph and the model registry.

A `TenantModel` is immutable: the scorer replaces a tenant's model as a whole (see
`snapshots`), so a request that took one reference scores with one version from start to end.

Building: the tenant's tools and capabilities are read from Neo4j (`read_tool_graph`, embeddings
from the shared cache), turned into a `Hierarchy`, and frozen into a `ServingModel` with the
registry's current parameters. Before any model was published, or when the published one cannot
be used (another embedding size, unreadable bytes), the initial parameters are served: they
rank like cosine similarity, so the scorer answers sensibly before any training.

Tools are served as the untrained first stage (`pml_common.tool_first_stage`: the same hybrid
relevance as search's, BM25 and the tool embedder's cosines fused) plus the learned corrections,
`first_stage + w · SHGAT score + m · execution memory's score + a · (adapted first stage −
first_stage)` (`pml_shgat.gating`, `pml_shgat.memory`, `pml_shgat.adapter`), with the weights
the trainer's gate chose for the published version on held-back executions (0, the first stage
alone, before any version was admitted and for a version published without them).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import structlog
from neo4j import AsyncDriver
from numpy.typing import NDArray

from pml_common.embedding import Embedder
from pml_common.model_registry import ModelRecord, ModelRegistry
from pml_common.tool_first_stage import FusedFirstStage, Intent
from pml_common.tool_graph import ToolGraph, read_tool_graph
from pml_shgat.adapter import QueryAdapter
from pml_shgat.gating import Weights, served_tool_scores
from pml_shgat.hierarchy import Hierarchy
from pml_shgat.memory import ServedMemory
from pml_shgat.params import Version, init_params, make_config, read_version
from pml_shgat.serving import ScoredNode, ServingModel

#: Version reported while a tenant has no usable published model.
UNTRAINED = "untrained"

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class TenantModel:
    tenant_id: str
    model: ServingModel
    #: The published model being served; None while the initial parameters are served.
    record: ModelRecord | None
    built_at: datetime
    #: Digest of the graph it was built from, and the registry's version at that time (even
    #: one that could not be used): with both unchanged a rebuild would give the same model.
    graph_digest: bytes
    registry_version: str | None
    #: The untrained first stage of the tenant's tools.
    baseline: FusedFirstStage
    #: The corrections' weights in the served tool score (all 0: the first stage alone).
    weights: Weights = Weights(0.0, 0.0, 0.0)  # noqa: RUF009 (an immutable tuple)
    #: The published version's execution memory over this catalog, and its query adapter
    #: (kept only when fitted for this tool embedder).
    memory: ServedMemory | None = None
    adapter: QueryAdapter | None = None

    @property
    def version(self) -> str:
        return self.record.version if self.record is not None else UNTRAINED

    def tool_scores(self, intent: Intent) -> NDArray[np.floating]:
        """Served score of every tool, in hierarchy order (see the module docstring)."""
        adapt = self.adapter.adapt if self.adapter is not None and self.weights.adapter else None
        first, adapted = self.baseline.scores_adapted(intent, adapt)
        return served_tool_scores(
            first,
            intent.vector,
            self.model,
            self.memory,
            self.weights,
            adapted,
        )

    def score_tools(self, intent: Intent, top_k: int) -> list[ScoredNode]:
        """The `top_k` tools by served score, best first (ties keep hierarchy order)."""
        scores = self.tool_scores(intent)
        order = np.argsort(-scores, kind="stable")[: max(top_k, 0)]
        ids = self.model.hierarchy.tool_ids
        return [ScoredNode(id=ids[i], score=float(scores[i]), level=-1) for i in order]

    @property
    def is_empty(self) -> bool:
        return self.model.hierarchy.num_nodes == 0


class ModelBuilder:
    """Builds `TenantModel`s from Neo4j (read only), the embedders and the model registry."""

    def __init__(
        self,
        driver: AsyncDriver,
        database: str,
        embedder: Embedder,
        registry: ModelRegistry,
        key_dim: int,
        tool_embedder: Embedder | None = None,
    ) -> None:
        self._driver = driver
        self._database = database
        self._embedder = embedder
        #: The first stage's dense side (`PML_TOOL_EMBEDDER`); without it, SHGAT's embedder.
        self._tool_embedder = tool_embedder
        self._registry = registry
        self._key_dim = key_dim

    @property
    def dim(self) -> int:
        return self._embedder.dim

    async def build(self, tenant: str, current: TenantModel | None = None) -> TenantModel:
        """The tenant's model as the stores say now; `current` itself when nothing changed.

        What the model depends on (nodes, texts, memberships) is often as it was: a model is
        published for an unchanged graph, or an event changed nothing the model reads. An
        unchanged graph keeps `current`'s hierarchy; with the registry's version unchanged too,
        `current` is kept whole (two graph queries and one small registry read, no propagation).
        """
        graph = await read_tool_graph(
            self._driver, self._database, tenant, self._embedder, self._tool_embedder
        )
        digest = graph_digest(graph)
        reusable = current if current is not None and current.graph_digest == digest else None
        if reusable is not None:
            record = await self._registry.current_record(tenant)
            if _version_of(record) == reusable.registry_version:
                return reusable
        published = await self._registry.current(tenant)
        hierarchy = reusable.model.hierarchy if reusable is not None else None
        baseline = reusable.baseline if reusable is not None else None
        # Hierarchy, initial parameters (an SVD) and propagation are numpy work that would
        # stall every request on the event loop for a large tenant.
        return await asyncio.to_thread(
            self._assemble, tenant, graph, digest, published, hierarchy, baseline
        )

    def _assemble(
        self,
        tenant: str,
        graph: ToolGraph,
        digest: bytes,
        published: tuple[ModelRecord, bytes] | None,
        hierarchy: Hierarchy | None,
        baseline: FusedFirstStage | None,
    ) -> TenantModel:
        """The model of `graph` (whose `hierarchy` and `baseline`, when built, are reused)."""
        if hierarchy is None:
            hierarchy = Hierarchy.build(graph.tool_vectors, graph.capabilities, dim=self.dim)
        if baseline is None:
            baseline = FusedFirstStage.of_graph(graph)
        usable = self._usable(tenant, published)
        weights, memory, adapter = Weights(), None, None
        if usable is None:
            config = make_config(self.dim, self._key_dim, hierarchy.num_nodes)
            params = init_params(config, hierarchy.features, hierarchy.num_levels)
            model, record = ServingModel(config, params, hierarchy), None
        else:
            record, version = usable
            model = ServingModel(version.config, version.params, hierarchy)
            weights = Weights.of_metrics(record.metrics)
            if version.memory is not None:
                memory = version.memory.serve(
                    hierarchy.tool_ids, graph.servers_of(hierarchy.tool_ids)
                )
            if version.adapter is not None and version.adapter.parts == baseline.parts:
                adapter = version.adapter
        return TenantModel(
            tenant_id=tenant,
            model=model,
            record=record,
            built_at=datetime.now(UTC),
            graph_digest=digest,
            registry_version=published[0].version if published else None,
            baseline=baseline,
            weights=weights,
            memory=memory,
            adapter=adapter,
        )

    def _usable(
        self, tenant: str, published: tuple[ModelRecord, bytes] | None
    ) -> tuple[ModelRecord, Version] | None:
        """The published version, or None (logged) when it cannot be served."""
        if published is None:
            return None
        record, blob = published
        try:
            version = read_version(blob)
        except Exception as exc:  # any unreadable blob: the tenant must still be served
            log.error(
                "scorer.model_unreadable",
                tenant=tenant,
                version=record.version,
                error=f"{type(exc).__name__}: {exc}",
                serving=UNTRAINED,
            )
            return None
        if version.config.dim != self.dim:
            log.error(
                "scorer.model_dim_mismatch",
                tenant=tenant,
                version=record.version,
                model_dim=version.config.dim,
                embedder_dim=self.dim,
                serving=UNTRAINED,
            )
            return None
        return record, version


def graph_digest(graph: ToolGraph) -> bytes:
    """What of the graph the model depends on: nodes, their texts and memberships."""
    rows = (
        tuple((t.id, t.server, t.name, t.description, t.fields) for t in graph.tools),
        tuple((c.id, c.name, c.description, c.tools, c.capabilities) for c in graph.capabilities),
    )
    # repr of tuples of strings is unambiguous (quoted, escaped), so equal digests mean equal rows.
    return hashlib.blake2b(repr(rows).encode(), digest_size=16).digest()


def _version_of(record: ModelRecord | None) -> str | None:
    return record.version if record is not None else None
