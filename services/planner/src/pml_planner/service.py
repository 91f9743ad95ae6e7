"""PlannerService: next-step prediction and whole-DAG suggestion (seed 000 PREDICTION and
SUGGESTION modes), by DR-DSP over the capability hypergraph, or for comparison by the legacy
heuristic, strategic discovery or search order (see `planning` for each method). Every
answer passes the adaptive threshold of its context (`<method>:next` / `<method>:dag`); a
rejected one still carries what was computed, with `accepted = false` and the reason.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc  # type: ignore[import-untyped, unused-ignore]
from opentelemetry import trace

from pml.v1 import planner_pb2, planner_pb2_grpc
from pml_common.grpc_server import invalid_argument
from pml_common.request_validation import context_tools_of, tenant_of, text_of
from pml_common.settings import Settings
from pml_planner.outcomes import SuggestionMemory
from pml_planner.planning import (
    Candidate,
    DagPlan,
    NextPlan,
    Target,
    TenantPlanner,
    chain_plan,
)
from pml_planner.targets import TargetSource
from pml_planner.tenants import TenantPlanners
from pml_planner.thresholds import RedisThresholdStore, context_key

METHODS = ("drdsp", "legacy", "discovery", "search")
#: Runners-up returned with a next step (for next_hit@k and for the caller's own choice).
NEXT_CANDIDATES = 5
MAX_CONTEXT = 100


class PlannerServicer(planner_pb2_grpc.PlannerServiceServicer):
    def __init__(
        self,
        settings: Settings,
        planners: TenantPlanners,
        targets: TargetSource,
        thresholds: RedisThresholdStore,
        memory: SuggestionMemory,
    ) -> None:
        self._settings = settings
        self._planners = planners
        self._targets = targets
        self._thresholds = thresholds
        self._memory = memory

    async def PredictNext(
        self, request: planner_pb2.PredictNextRequest, context: grpc.aio.ServicerContext
    ) -> planner_pb2.PredictNextResponse:
        tenant, intent, method = self._common(request.tenant_id, request.intent, request.method)
        tools = _context_tools(request.context_tools)
        planner = await self._planners.get(tenant)
        if method == "drdsp":
            plan = await self._drdsp_next(tenant, intent, tools, planner)
        elif method == "legacy":
            plan = await self._legacy_next(tenant, intent, tools, planner)
        elif method == "discovery":
            plan = await self._discovery_next(tenant, intent, tools, planner)
        else:
            plan = await self._search_next(tenant, intent, tools)
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
        tenant, intent, method = self._common(request.tenant_id, request.intent, request.method)
        planner = await self._planners.get(tenant)
        if method == "drdsp":
            plan = await self._drdsp_dag(tenant, intent, planner)
        elif method == "legacy":
            first = await self._targets.tools(tenant, intent, 1)
            chain = planner.legacy_chain(first[0].id) if first else []
            plan = chain_plan(chain, first[0].score if first else 0.0)
        elif method == "discovery":
            plan = await self._discovery_dag(tenant, intent, planner)
        else:
            ranked = await self._targets.tools(tenant, intent, 3)
            plan = chain_plan([t.id for t in ranked], ranked[0].score if ranked else 0.0)
        decision = await self._thresholds.decide(
            tenant, context_key(method, "dag"), plan.confidence
        )
        tools = [n for n in plan.order if planner.is_tool(n)] or list(plan.order)
        if decision.accepted and plan.nodes:
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
        )

    # --- methods ----------------------------------------------------------------------------

    async def _target(
        self, tenant: str, intent: str, planner: TenantPlanner, context: Sequence[str] = ()
    ) -> Target | None:
        targets = await self._targets.capabilities(tenant, intent)
        trace.get_current_span().set_attribute("pml.planner.target_source", targets.source)
        return planner.choose_target(targets.candidates, context)

    async def _drdsp_next(
        self, tenant: str, intent: str, tools: list[str], planner: TenantPlanner
    ) -> NextPlan:
        target = await self._target(tenant, intent, planner, tools)
        if target is None:
            return NextPlan((), "", (), 0.0)
        return planner.predict_next(target, tools, NEXT_CANDIDATES)

    async def _drdsp_dag(self, tenant: str, intent: str, planner: TenantPlanner) -> DagPlan:
        target = await self._target(tenant, intent, planner)
        if target is None:
            return chain_plan([], 0.0)
        return planner.suggest_dag(target)

    async def _legacy_next(
        self, tenant: str, intent: str, tools: list[str], planner: TenantPlanner
    ) -> NextPlan:
        if not tools:  # the heuristic needs a current tool: start where search would
            return await self._search_next(tenant, intent, tools)
        ranked = planner.legacy_next(tools, NEXT_CANDIDATES)
        return NextPlan(tuple(ranked), "", (), ranked[0].score if ranked else 0.0)

    async def _intent_scores(self, tenant: str, intent: str) -> dict[str, float]:
        targets = await self._targets.capabilities(tenant, intent)
        return {c.id: c.score for c in targets.candidates}

    async def _discovery_next(
        self, tenant: str, intent: str, tools: list[str], planner: TenantPlanner
    ) -> NextPlan:
        if not tools:  # discovery is passive: with nothing run yet, start where search would
            return await self._search_next(tenant, intent, tools)
        scores = await self._intent_scores(tenant, intent)
        return planner.discovery_next(tools, scores, NEXT_CANDIDATES)

    async def _discovery_dag(self, tenant: str, intent: str, planner: TenantPlanner) -> DagPlan:
        """The DAG of the capability discovered from the intent's first search tool."""
        first = await self._targets.tools(tenant, intent, 1)
        scores = await self._intent_scores(tenant, intent)
        found = planner.discover([first[0].id], scores, 1) if first else []
        if not found:
            return chain_plan([first[0].id] if first else [], first[0].score if first else 0.0)
        return planner.suggest_dag(planner.target(found[0]))

    async def _search_next(self, tenant: str, intent: str, tools: list[str]) -> NextPlan:
        done = set(tools)
        ranked = await self._targets.tools(tenant, intent, NEXT_CANDIDATES + len(done))
        picked = tuple(Candidate(t.id, t.score) for t in ranked if t.id not in done)
        picked = picked[:NEXT_CANDIDATES]
        return NextPlan(picked, "", (), picked[0].score if picked else 0.0)

    def _common(self, tenant_id: str, intent: str, method: str) -> tuple[str, str, str]:
        tenant = tenant_of(tenant_id, self._settings)
        text = text_of(intent, self._settings, "intent")
        chosen = method.strip() or "drdsp"
        if chosen not in METHODS:
            raise invalid_argument(f"method {method!r} is not one of {', '.join(METHODS)}")
        return tenant, text, chosen


def _context_tools(tools: Sequence[str]) -> list[str]:
    # The rules of SearchTools' context tools: the tools named are looked up in the same graph.
    return context_tools_of(tools, MAX_CONTEXT)


def _annotate(method: str, target: str, confidence: float, accepted: bool) -> None:
    span = trace.get_current_span()
    span.set_attribute("pml.planner.method", method)
    span.set_attribute("pml.planner.target", target)
    span.set_attribute("pml.planner.confidence", confidence)
    span.set_attribute("pml.planner.accepted", accepted)
