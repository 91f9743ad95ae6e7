"""The `KnowledgeService` servicer (proto/pml/v1/knowledge.proto): `Ask`.

Validates the request (INVALID_ARGUMENT naming the field: empty or over-long question, `k`
outside 1..50, unknown method, malformed tenant), answers it with `KnowledgeEngine` and turns
the answer into the proto: mode, seeds, selected paths with each edge's evidence, the evidence
plan, ranked chunks and per-stage timings.
"""

from __future__ import annotations

from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]
import structlog

from pml.v1 import common_pb2, knowledge_pb2, knowledge_pb2_grpc
from pml_common.grpc_server import check_deadline
from pml_common.settings import Settings
from pml_search.knowledge import Answer, KnowledgeEngine, RankedChunk, invariant_violations
from pml_search.paths import Mode, Path
from pml_search.validation import ask_k_of, ask_method_of, question_of, tenant_of

log = structlog.get_logger(__name__)

MODE_ENUM = {
    Mode.REASONED: knowledge_pb2.ANSWER_MODE_REASONED,
    Mode.ANCHORED: knowledge_pb2.ANSWER_MODE_ANCHORED,
    Mode.TEXT_ONLY: knowledge_pb2.ANSWER_MODE_TEXT_ONLY,
}


class KnowledgeServicer(knowledge_pb2_grpc.KnowledgeServiceServicer):
    def __init__(self, settings: Settings, engine: KnowledgeEngine) -> None:
        self._settings = settings
        self._engine = engine

    async def Ask(
        self, request: knowledge_pb2.AskRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> knowledge_pb2.AskResponse:
        tenant = tenant_of(request.tenant_id, self._settings)
        question = question_of(request.question, self._settings)
        k = ask_k_of(request.k)
        method = ask_method_of(request.method)
        check_deadline(context)
        answer = await self._engine.ask(tenant, question, k, method)
        broken = invariant_violations(answer)
        if broken:  # never expected: the engine is built to hold them; say so loudly
            log.error("knowledge.invariant_broken", tenant=tenant, violations=broken)
        log.info(
            "knowledge.answered",
            tenant=tenant,
            method=method,
            mode=answer.mode.value,
            seeds=len(answer.seeds),
            paths=len(answer.paths),
            chunks=len(answer.chunks),
            topped_up=answer.topped_up,
        )
        return answer_proto(answer)


def answer_proto(answer: Answer) -> knowledge_pb2.AskResponse:
    return knowledge_pb2.AskResponse(
        mode=MODE_ENUM[answer.mode],
        seed_concepts=[s.key for s in answer.seeds],
        seeds=[
            knowledge_pb2.SeedConcept(
                key=s.key,
                name=s.name,
                weight=s.weight,
                sections=s.sections,
                topic=s.topic,
                subsumed=s.subsumed,
                link=s.link,
                link_score=s.link_score,
                span=s.span,
                entity_type=s.entity_type,
                inside_entity=s.inside_entity,
                common_word=s.common_word,
            )
            for s in answer.seeds
        ],
        paths=[_path_proto(p) for p in answer.paths],
        chunks=[_chunk_proto(c) for c in answer.chunks],
        timings=[common_pb2.StageTiming(stage=s, ms=ms) for s, ms in answer.stages.timings],
        path_finder=answer.path_finder,
        plan_context_ids=answer.plan.ordered(),
        topped_up_chunks=answer.topped_up,
        method=answer.method,
    )


def _path_proto(path: Path) -> knowledge_pb2.ConceptPath:
    return knowledge_pb2.ConceptPath(
        concepts=list(path.nodes),
        edges=[
            knowledge_pb2.PathEdge(
                source=e.source,
                relation=e.relation,
                target=e.target,
                confidence=e.confidence,
                evidence=[
                    knowledge_pb2.EdgeEvidence(
                        context_id=v.context_id, quote=v.quote, document_id=v.document_id
                    )
                    for v in e.evidence
                ],
            )
            for e in path.edges
        ],
        score=path.score,
        evidence_coverage=path.evidence_coverage,
    )


def _chunk_proto(chunk: RankedChunk) -> knowledge_pb2.EvidenceChunk:
    hit = chunk.hit
    return knowledge_pb2.EvidenceChunk(
        document_id=hit.document_id,
        context_id=hit.context_id,
        section_path=hit.section_path,
        text=hit.text,
        score=chunk.score,
        semantic_score=chunk.semantic,
        plan_weight=chunk.plan_weight,
        chunk_id=hit.chunk_id,
        named_by=chunk.named_by,
    )
