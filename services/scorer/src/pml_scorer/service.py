"""The `ScorerService` servicer (proto/pml/v1/scorer.proto): SHGAT K-head scores (seed 000).

Every RPC takes the tenant's `TenantModel` once (`ModelSnapshots.get`) and computes its whole
answer from it, reporting that model's version: a model swapped in mid-request is used by the
next request, never by half of this one.

- `ScoreCapabilities`: `sigmoid(mean_h(Q_h·K_h)/√d_h)` of every capability (or of one
  hierarchy level), best `top_k` first. The intent is text (embedded as a query) or an
  embedding of the embedder's size.
- `ScoreTools`: the same over tools (`level` -1 in the answer: tools have no level).
- `TopByLevel`: the best `k` capabilities of every level, level 0 first.
- `PredictPathSuccess`: weighted mean of the path's node scores, later steps weighing more
  (1, 1.5, 2, …); 0.5 for unknown nodes and for an empty path.
- `ModelInfo`: the served version, its fencing token, training time and metrics, and the size
  of the hierarchy it scores.

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
from pml_common.request_validation import limit_of, tenant_of, text_of
from pml_common.settings import Settings
from pml_scorer.models import TenantModel
from pml_scorer.snapshots import ModelSnapshots
from pml_scorer.validation import intent_of, level_of, no_level, path_of
from pml_shgat.serving import ScoredNode


class ScorerServicer(scorer_pb2_grpc.ScorerServiceServicer):
    def __init__(self, settings: Settings, snapshots: ModelSnapshots, embedder: Embedder) -> None:
        self._settings = settings
        self._snapshots = snapshots
        self._embedder = embedder

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
        vector = await self._vector(intent, context)
        scored = snapshot.model.score_tools(vector, top_k)
        _annotate(snapshot, snapshot.model.hierarchy.num_tools)
        return scorer_pb2.ScoreResponse(scores=_scored(scored), model_version=snapshot.version)

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
        return scorer_pb2.ModelInfoResponse(
            version=snapshot.version,
            fencing_token=record.fencing_token if record else 0,
            trained_at=record.trained_at.isoformat() if record else "",
            metrics=record.metrics if record else {},
            num_capabilities=model.hierarchy.num_capabilities,
            num_tools=model.hierarchy.num_tools,
            num_heads=model.config.heads,
            num_levels=model.num_levels,
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


def _annotate(snapshot: TenantModel, candidates: int) -> None:
    """Span attributes: which model answered, over how many candidates."""
    span = trace.get_current_span()
    span.set_attribute("pml.model.version", snapshot.version)
    span.set_attribute("pml.scorer.candidates", candidates)


def _scored(nodes: list[ScoredNode]) -> list[scorer_pb2.Scored]:
    return [scorer_pb2.Scored(id=n.id, score=n.score, level=n.level) for n in nodes]
