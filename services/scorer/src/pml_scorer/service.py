"""The `ScorerService` servicer (proto/pml/v1/scorer.proto): SHGAT K-head scores (seed 000).

Every RPC takes the tenant's `TenantModel` once (`ModelSnapshots.get`) and computes its whole
answer from it, reporting that model's version: a model swapped in mid-request is used by the
next request, never by half of this one.

- `ScoreCapabilities`: `sigmoid(mean_h(Q_h·K_h)/√d_h)` of every capability (or of one
  hierarchy level), best `top_k` first. The intent is text (embedded as a query) or an
  embedding of the embedder's size.
- `ScoreTools`: the served tool score, the untrained first stage (search's hybrid relevance,
  `pml_common.tool_first_stage`) plus the learned corrections,
  `first_stage + w · SHGAT score + m · execution memory's score + a · (first stage of the
  adapted request − first_stage)` (`pml_shgat.gating`), with the published version's weights
  w, m and a (reported; 0 before any version was admitted: the first stage alone).
  `level` is -1: tools have no level.
- `TopByLevel`: the best `k` capabilities of every level, level 0 first.
- `PredictPathSuccess`: weighted mean of the path's node scores, later steps weighing more
  (1, 1.5, 2, …); 0.5 for unknown nodes and for an empty path.
- `ModelInfo`: the served version, its fencing token, training time and metrics, the size
  of the hierarchy it scores, its corrections' weights and remembered executions, the
  tenant's prequential figures (how the served scores ranked executions before they were
  learned) and the figures of the last admitted and last rejected candidates (read from the
  trainer's records in Redis).

A tenant without tools or capabilities gets empty scores from the untrained model, not an error.

Scoring runs on the event loop: with keys precomputed it is one float32 matrix-vector product
(under a millisecond at 10k nodes), cheaper than a hop to a worker thread. Only rebuilds, which
propagate through the whole hierarchy, go to a thread (see `models`).
"""

from __future__ import annotations

from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]
import numpy as np
from numpy.typing import NDArray
from opentelemetry import trace

from pml.v1 import scorer_pb2, scorer_pb2_grpc
from pml_common.embedding import Embedder
from pml_common.grpc_server import check_deadline
from pml_common.model_registry import ModelRecord, ModelRegistry
from pml_common.prequential import PrequentialStore, PrequentialSummary, RankingFigures
from pml_common.request_validation import limit_of, tenant_of, text_of
from pml_common.settings import Settings
from pml_common.tool_first_stage import Intent, embed_intents
from pml_scorer.models import TenantModel
from pml_scorer.snapshots import ModelSnapshots
from pml_scorer.validation import intent_of, level_of, no_level, path_of
from pml_shgat.gating import Weights
from pml_shgat.serving import ScoredNode


class ScorerServicer(scorer_pb2_grpc.ScorerServiceServicer):
    def __init__(
        self,
        settings: Settings,
        snapshots: ModelSnapshots,
        embedder: Embedder,
        registry: ModelRegistry | None = None,
        prequential: PrequentialStore | None = None,
        tool_embedder: Embedder | None = None,
    ) -> None:
        self._settings = settings
        self._snapshots = snapshots
        self._embedder = embedder
        #: The first stage's dense side (`PML_TOOL_EMBEDDER`), for `ScoreTools`.
        self._tool_embedder = tool_embedder
        self._registry = registry
        self._prequential = prequential

    async def ScoreCapabilities(
        self, request: scorer_pb2.ScoreRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scorer_pb2.ScoreResponse:
        tenant = tenant_of(request.tenant_id, self._settings)
        intent = intent_of(request, self._settings, self._embedder.dim)
        top_k = limit_of(request.top_k, self._settings, "top_k")
        level = level_of(request)
        snapshot = await self._model(tenant)
        vector = await self._vector(intent, context)
        scored = snapshot.model.score_capabilities(vector, top_k, level)
        _annotate(snapshot, snapshot.model.hierarchy.num_capabilities)
        return scorer_pb2.ScoreResponse(scores=_scored(scored), model_version=snapshot.version)

    async def ScoreTools(
        self, request: scorer_pb2.ScoreRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scorer_pb2.ScoreResponse:
        tenant = tenant_of(request.tenant_id, self._settings)
        intent = intent_of(request, self._settings, self._embedder.dim)
        top_k = limit_of(request.top_k, self._settings, "top_k")
        no_level(request)
        snapshot = await self._model(tenant)
        scored = snapshot.score_tools(await self._tool_intent(intent, context), top_k)
        _annotate(snapshot, snapshot.model.hierarchy.num_tools)
        return scorer_pb2.ScoreResponse(
            scores=_scored(scored),
            model_version=snapshot.version,
            correction_weight=snapshot.weights.shgat,
            memory_weight=snapshot.weights.memory,
            adapter_weight=snapshot.weights.adapter,
        )

    async def TopByLevel(
        self, request: scorer_pb2.TopByLevelRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scorer_pb2.TopByLevelResponse:
        tenant = tenant_of(request.tenant_id, self._settings)
        text = text_of(request.intent, self._settings, "intent")
        k = limit_of(request.k, self._settings, "k")
        snapshot = await self._model(tenant)
        vector = await self._vector(text, context)
        by_level = snapshot.model.top_by_level(vector, k)
        _annotate(snapshot, snapshot.model.hierarchy.num_capabilities)
        return scorer_pb2.TopByLevelResponse(
            levels=[
                scorer_pb2.LevelScores(level=level, scores=_scored(scored))
                for level, scored in sorted(by_level.items())
            ],
            model_version=snapshot.version,
        )

    async def PredictPathSuccess(
        self,
        request: scorer_pb2.PredictPathSuccessRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> scorer_pb2.PredictPathSuccessResponse:
        tenant = tenant_of(request.tenant_id, self._settings)
        text = text_of(request.intent, self._settings, "intent")
        path = path_of(request.path)
        snapshot = await self._model(tenant)
        vector = await self._vector(text, context)
        probability = snapshot.model.predict_path_success(vector, path)
        _annotate(snapshot, len(path))
        return scorer_pb2.PredictPathSuccessResponse(
            probability=probability, model_version=snapshot.version
        )

    async def ModelInfo(
        self, request: scorer_pb2.ModelInfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scorer_pb2.ModelInfoResponse:
        tenant = tenant_of(request.tenant_id, self._settings)
        snapshot = await self._model(tenant)
        _annotate(snapshot, 0)
        record, model = snapshot.record, snapshot.model
        summary = await self._prequential.summary(tenant) if self._prequential else None
        rejected = await self._registry.last_rejected(tenant) if self._registry else None
        return scorer_pb2.ModelInfoResponse(
            version=snapshot.version,
            fencing_token=record.fencing_token if record else 0,
            trained_at=record.trained_at.isoformat() if record else "",
            metrics=record.metrics if record else {},
            num_capabilities=model.hierarchy.num_capabilities,
            num_tools=model.hierarchy.num_tools,
            num_heads=model.config.heads,
            num_levels=model.num_levels,
            correction_weight=snapshot.weights.shgat,
            prequential=_prequential(summary),
            last_accepted=_candidate(record) if record else None,
            last_rejected=_candidate(rejected[0]) if rejected else None,
            memory_weight=snapshot.weights.memory,
            adapter_weight=snapshot.weights.adapter,
            memory_executions=len(snapshot.memory.memory) if snapshot.memory else 0,
        )

    # --- helpers ------------------------------------------------------------------------------

    async def _model(self, tenant: str) -> TenantModel:
        return await self._snapshots.get(tenant)

    async def _vector(
        self, intent: str | NDArray[np.float32], context: grpc.aio.ServicerContext[Any, Any]
    ) -> NDArray[np.float32]:
        """The intent embedding; text is embedded as a query (through the shared cache)."""
        check_deadline(context)
        if isinstance(intent, str):
            intent = np.asarray((await self._embedder.embed_queries([intent]))[0], np.float32)
            check_deadline(context)
        return intent

    async def _tool_intent(
        self, intent: str | NDArray[np.float32], context: grpc.aio.ServicerContext[Any, Any]
    ) -> Intent:
        """What the served tool score reads of the intent: text is embedded by both embedders
        (the request and its sub-goals by the tool embedder), an embedding is taken as it is."""
        if not isinstance(intent, str):
            return Intent(intent)
        check_deadline(context)
        [embedded] = await embed_intents([intent], self._embedder, self._tool_embedder)
        check_deadline(context)
        return embedded


def _annotate(snapshot: TenantModel, candidates: int) -> None:
    """Span attributes: which model answered, over how many candidates."""
    span = trace.get_current_span()
    span.set_attribute("pml.model.version", snapshot.version)
    span.set_attribute("pml.scorer.candidates", candidates)


def _prequential(summary: PrequentialSummary | None) -> scorer_pb2.Prequential | None:
    if summary is None:
        return None
    return scorer_pb2.Prequential(
        window=_figures(summary.window), cumulative=_figures(summary.cumulative)
    )


def _figures(figures: RankingFigures) -> scorer_pb2.RankingFigures:
    return scorer_pb2.RankingFigures(**figures.model_dump())


def _candidate(record: ModelRecord) -> scorer_pb2.CandidateFigures:
    """The gate's figures of a version, from its record's metrics (0 where it has none: a
    version published before the gate existed)."""
    m = record.metrics
    weights = Weights.of_metrics(m)
    return scorer_pb2.CandidateFigures(
        version=record.version,
        accepted=bool(m.get("accepted", 1.0)),
        trained_at=record.trained_at.isoformat(),
        holdout_size=int(m.get("holdout_size", 0)),
        candidate_recall_at_5=m.get("holdout_candidate_recall_at_5", 0.0),
        serving_recall_at_5=m.get("holdout_serving_recall_at_5", 0.0),
        first_stage_recall_at_5=m.get("holdout_first_stage_recall_at_5", 0.0),
        correction_weight=weights.shgat,
        candidate_mrr=m.get("holdout_candidate_mrr", 0.0),
        serving_mrr=m.get("holdout_serving_mrr", 0.0),
        first_stage_mrr=m.get("holdout_first_stage_mrr", 0.0),
        memory_weight=weights.memory,
        adapter_weight=weights.adapter,
        cross_fitted_recall_at_5=m.get("holdout_cross_fitted_recall_at_5", 0.0),
        cross_fitted_mrr=m.get("holdout_cross_fitted_mrr", 0.0),
        traces_seen=int(m.get("traces_seen", 0)),
        holdout_novel_size=int(m.get("holdout_novel_size", 0)),
        cross_fitted_first_stage_recall_at_5=m.get(
            "holdout_cross_fitted_first_stage_recall_at_5", 0.0
        ),
        cross_fitted_first_stage_mrr=m.get("holdout_cross_fitted_first_stage_mrr", 0.0),
        out_of_fold_size=int(m.get("out_of_fold_size", 0)),
    )


def _scored(nodes: list[ScoredNode]) -> list[scorer_pb2.Scored]:
    return [scorer_pb2.Scored(id=n.id, score=n.score, level=n.level) for n in nodes]
