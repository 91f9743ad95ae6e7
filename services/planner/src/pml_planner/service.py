"""PlannerService: next-step prediction and whole-DAG suggestion (seed 000 PREDICTION and
SUGGESTION modes), by DR-DSP over the capability hypergraph, the legacy heuristic, strategic
discovery, search order (see `planning` for each method), or for the next step the blend of
search's order, observed transitions and the hyperpath (`blend`). Every
answer passes the adaptive threshold of its context (`<method>:next` / `<method>:dag`); a
rejected one still carries what was computed, with `accepted = false` and the reason.

A request naming no method gets the tenant's best by prequential figures once they are enough,
else DR-DSP (`prequential.choose`); `PlannerInfo` shows the figures and the choice. The methods
themselves are `methods`, shared with the prequential evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc  # type: ignore[import-untyped, unused-ignore]
from opentelemetry import trace

from pml.v1 import planner_pb2, planner_pb2_grpc
from pml_common.grpc_server import invalid_argument
from pml_common.request_validation import context_tools_of, tenant_of, text_of
from pml_common.settings import Settings
from pml_planner import methods
from pml_planner.blend import BLEND, SEARCH_ONLY, VARIANTS, new_work
from pml_planner.methods import METHODS, Needs, dag_needs, next_needs
from pml_planner.outcomes import SuggestionMemory
from pml_planner.prequential import (
    MIN_EVIDENCE,
    Choice,
    Kind,
    MethodFigures,
    PrequentialStore,
    Summary,
    blend_weights,
    choose,
)
from pml_planner.targets import TargetSource
from pml_planner.tenants import TenantPlanners
from pml_planner.thresholds import RedisThresholdStore, context_key

__all__ = ["METHODS", "PlannerServicer"]
MAX_CONTEXT = 100


class PlannerServicer(planner_pb2_grpc.PlannerServiceServicer):
    def __init__(
        self,
        settings: Settings,
        planners: TenantPlanners,
        targets: TargetSource,
        thresholds: RedisThresholdStore,
        memory: SuggestionMemory,
        figures: PrequentialStore,
    ) -> None:
        self._settings = settings
        self._planners = planners
        self._targets = targets
        self._thresholds = thresholds
        self._memory = memory
        self._figures = figures

    async def PredictNext(
        self, request: planner_pb2.PredictNextRequest, context: grpc.aio.ServicerContext
    ) -> planner_pb2.PredictNextResponse:
        tenant, intent = self._common(request.tenant_id, request.intent)
        tools = _context_tools(request.context_tools)
        method, summary = await self._method(tenant, request.method, "next")
        weights = SEARCH_ONLY
        if method == BLEND:
            weights = blend_weights(summary or await self._figures.summary(tenant))
            trace.get_current_span().set_attribute("pml.planner.blend_weights", list(weights))
        planner = await self._planners.get(tenant)
        inputs = await self._fetch(tenant, intent, next_needs(method, tools))
        plan = methods.predict_next(method, planner, inputs, tools, weights=weights)
        decision = await self._thresholds.decide(
            tenant, context_key(method, "next"), plan.confidence
        )
        first = plan.candidates[0].id if plan.candidates else ""
        if decision.accepted and first:
            await self._memory.remember(
                tenant, intent, "next", decision.context, plan.confidence, [first]
            )
        _annotate(method, plan.target, plan.confidence, decision.accepted)
        return planner_pb2.PredictNextResponse(
            next_tool=first if decision.accepted else "",
            target_capability=plan.target,
            path=list(plan.path),
            confidence=plan.confidence,
            accepted=decision.accepted and bool(first),
            reason=decision.reason if first else "no candidate for a next step",
            threshold=decision.threshold,
            method=method,
            candidates=[
                planner_pb2.NextCandidate(tool=c.id, score=c.score) for c in plan.candidates
            ],
        )

    async def SuggestDag(
        self, request: planner_pb2.SuggestDagRequest, context: grpc.aio.ServicerContext
    ) -> planner_pb2.SuggestDagResponse:
        tenant, intent = self._common(request.tenant_id, request.intent)
        method, _ = await self._method(tenant, request.method, "dag")
        planner = await self._planners.get(tenant)
        inputs = await self._fetch(tenant, intent, dag_needs(method))
        plan = methods.suggest_dag(method, planner, inputs)
        decision = await self._thresholds.decide(
            tenant, context_key(method, "dag"), plan.confidence
        )
        if decision.accepted and plan.nodes:
            tools = methods.dag_tools(planner, plan)
            await self._memory.remember(
                tenant, intent, "dag", decision.context, plan.confidence, tools
            )
        _annotate(method, plan.target, plan.confidence, decision.accepted)
        return planner_pb2.SuggestDagResponse(
            target_capability=plan.target,
            nodes=list(plan.nodes),
            edges=[planner_pb2.DagEdge(source=s, target=t, type=k) for s, t, k in plan.edges],
            order=list(plan.order),
            confidence=plan.confidence,
            accepted=decision.accepted and bool(plan.nodes),
            reason=decision.reason if plan.nodes else "nothing to suggest for this intent",
            threshold=decision.threshold,
            method=method,
            composed=list(plan.composed),
        )

    async def PlannerInfo(
        self, request: planner_pb2.PlannerInfoRequest, context: grpc.aio.ServicerContext
    ) -> planner_pb2.PlannerInfoResponse:
        tenant = tenant_of(request.tenant_id, self._settings)
        summary = await self._figures.summary(tenant)
        transitions, hyperpath = blend_weights(summary)
        return planner_pb2.PlannerInfoResponse(
            next_method=choose(summary, "next").method,
            dag_method=choose(summary, "dag").method,
            methods=[_method_figures(m, summary.figures(m)) for m in METHODS],
            new_work_methods=[_method_figures(m, summary.figures(new_work(m))) for m in METHODS],
            executions=summary.executions,
            skipped_executions=summary.skipped,
            unjudged_executions=summary.unjudged,
            min_evidence=MIN_EVIDENCE,
            blend_transitions_weight=transitions,
            blend_hyperpath_weight=hyperpath,
            blend_variants_new_work=[
                _method_figures(v, summary.figures(new_work(v))) for v in VARIANTS
            ],
        )

    async def _fetch(self, tenant: str, intent: str, needs: Needs) -> methods.Inputs:
        inputs = await methods.fetch(self._targets, tenant, intent, needs)
        if needs.capabilities:
            span = trace.get_current_span()
            span.set_attribute("pml.planner.target_source", inputs.targets.source)
        return inputs

    async def _method(self, tenant: str, method: str, kind: Kind) -> tuple[str, Summary | None]:
        """The method asked for, or when none is, the one the tenant's figures choose (with
        those figures, when they were read)."""
        named = method.strip()
        if named and named not in METHODS:
            raise invalid_argument(f"method {method!r} is not one of {', '.join(METHODS)}")
        summary = None if named else await self._figures.summary(tenant)
        chosen = Choice(named, "request") if summary is None else choose(summary, kind)
        trace.get_current_span().set_attribute("pml.planner.method_source", chosen.source)
        return chosen.method, summary

    def _common(self, tenant_id: str, intent: str) -> tuple[str, str]:
        tenant = tenant_of(tenant_id, self._settings)
        return tenant, text_of(intent, self._settings, "intent")


def _context_tools(tools: Sequence[str]) -> list[str]:
    # The rules of SearchTools' context tools: the tools named are looked up in the same graph.
    return context_tools_of(tools, MAX_CONTEXT)


def _method_figures(method: str, figures: MethodFigures) -> planner_pb2.MethodFigures:
    return planner_pb2.MethodFigures(
        method=method,
        predictions=figures.predictions,
        next_hit_at_1=figures.next_hit_at_1,
        next_hit_at_3=figures.next_hit_at_3,
        dags=figures.dags,
        node_f1=figures.mean_node_f1,
    )


def _annotate(method: str, target: str, confidence: float, accepted: bool) -> None:
    span = trace.get_current_span()
    span.set_attribute("pml.planner.method", method)
    span.set_attribute("pml.planner.target", target)
    span.set_attribute("pml.planner.confidence", confidence)
    span.set_attribute("pml.planner.accepted", accepted)
