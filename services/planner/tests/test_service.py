"""PlannerService on the suite's real Redis and Neo4j: a request naming no method is answered by
the tenant's best method by prequential figures once they are enough, else by DR-DSP; and
PlannerInfo shows the figures and the choice."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import grpc
import neo4j
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span
from redis.asyncio import Redis

from pml.v1 import planner_pb2
from pml_common.grpc_server import RequestError
from pml_common.settings import Settings
from pml_planner.blend import BLEND, VARIANTS, new_work, variant
from pml_planner.methods import METHODS
from pml_planner.outcomes import SuggestionMemory
from pml_planner.prequential import MIN_EVIDENCE, MethodFigures, PrequentialStore
from pml_planner.service import PlannerServicer
from pml_planner.tenants import TenantPlanners
from pml_planner.thresholds import RedisThresholdStore

from .helpers import StandIns, write_graph

INTENT = "ship the release"
#: The handlers do not use their gRPC context.
NO_CONTEXT: Any = None


class Spans:
    """Each call runs in a span of its own (the gRPC server's, in service), kept for reading."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self._tracer = provider.get_tracer(__name__)

    def span(self) -> AbstractContextManager[Span]:
        return self._tracer.start_as_current_span("rpc")

    def last(self) -> dict[str, object]:
        """The attributes of the span that ended last."""
        return dict(self.exporter.get_finished_spans()[-1].attributes or {})


def _servicer(
    redis: Redis, graph_db: neo4j.AsyncDriver, settings: Settings, stand_ins: StandIns
) -> tuple[PlannerServicer, PrequentialStore]:
    thresholds = RedisThresholdStore(redis)
    figures = PrequentialStore(redis)
    servicer = PlannerServicer(
        settings,
        TenantPlanners(graph_db, settings.neo4j_database),
        stand_ins.targets,
        thresholds,
        SuggestionMemory(redis, thresholds),
        figures,
    )
    return servicer, figures


def _one_run(best_next: str, best_dag: str, n: int, new: bool = True) -> dict[str, MethodFigures]:
    """`n` predictions and DAGs per method: `best_next` hit every one, the others half (DR-DSP)
    or none, the blend as search (its weights at 0); `best_dag`'s DAGs were exact, DR-DSP's
    half right; all of it new work if `new`."""
    figures = {}
    for m in METHODS:
        predicts_as = "search" if m == BLEND else m
        hits = n if predicts_as == best_next else n // 2 if m == "drdsp" else 0
        f1 = 1.0 if m == best_dag else 0.5 if m == "drdsp" else 0.0
        figures[m] = MethodFigures(n, hits, hits, n, f1 * n)
    if new:
        figures |= {new_work(m): f for m, f in figures.items()}
    return figures


async def test_a_request_naming_no_method_gets_the_best_by_evidence(
    redis: Redis,
    graph_db: neo4j.AsyncDriver,
    settings: Settings,
    tenant: str,
    stand_ins: StandIns,
) -> None:
    await write_graph(graph_db, tenant, {"release": ["s:build", "s:test", "s:ship"]})
    stand_ins.rank(["s:build", "s:test", "s:ship"], ["release"])
    servicer, figures = _servicer(redis, graph_db, settings, stand_ins)
    spans = Spans()

    async def next_by(method: str = "") -> planner_pb2.PredictNextResponse:
        with spans.span():
            return await servicer.PredictNext(
                planner_pb2.PredictNextRequest(
                    tenant_id=tenant, intent=INTENT, context_tools=["s:build"], method=method
                ),
                NO_CONTEXT,
            )

    async def dag_by(method: str = "") -> planner_pb2.SuggestDagResponse:
        with spans.span():
            return await servicer.SuggestDag(
                planner_pb2.SuggestDagRequest(tenant_id=tenant, intent=INTENT, method=method),
                NO_CONTEXT,
            )

    # Legacy and search are better, but one execution short of the evidence needed.
    await figures.record(tenant, _one_run("legacy", "search", MIN_EVIDENCE - 1))
    reply = await next_by()
    assert reply.method == "drdsp"
    assert {c.tool for c in reply.candidates} == {"s:test", "s:ship"}  # DR-DSP's plan
    assert spans.last()["pml.planner.method_source"] == "default"
    assert (await dag_by()).method == "drdsp"

    # Enough evidence on all runs, one short on new work: the zero-shot methods answer.
    await figures.record(tenant, _one_run("legacy", "search", 1, new=False))
    reply = await next_by()
    assert (reply.method, spans.last()["pml.planner.method_source"]) == ("blend", "prequential")
    assert (await dag_by()).method == "search"

    await figures.record(tenant, _one_run("legacy", "search", 1))
    reply = await next_by()
    assert reply.method == "legacy"
    assert spans.last()["pml.planner.method"] == "legacy"
    assert spans.last()["pml.planner.method_source"] == "prequential"
    dag = await dag_by()
    assert dag.method == "search" and list(dag.nodes) == ["s:build", "s:test", "s:ship"]

    # A method named is the one that answers.
    assert (await next_by("discovery")).method == "discovery"
    assert spans.last()["pml.planner.method_source"] == "request"

    # Another tenant has no evidence of its own.
    other = await servicer.PredictNext(
        planner_pb2.PredictNextRequest(tenant_id=f"{tenant}-other", intent=INTENT),
        NO_CONTEXT,
    )
    assert other.method == "drdsp"


async def test_the_blend_follows_the_weights_the_tenant_figures_earned(
    redis: Redis,
    graph_db: neo4j.AsyncDriver,
    settings: Settings,
    tenant: str,
    stand_ins: StandIns,
) -> None:
    await write_graph(graph_db, tenant, {"release": ["s:build", "s:test", "s:ship"]})
    stand_ins.rank(["s:ship", "s:test", "s:build"], ["release"])  # search puts s:ship first
    servicer, figures = _servicer(redis, graph_db, settings, stand_ins)
    spans = Spans()

    async def blend_next() -> planner_pb2.PredictNextResponse:
        with spans.span():
            return await servicer.PredictNext(
                planner_pb2.PredictNextRequest(
                    tenant_id=tenant, intent=INTENT, context_tools=["s:build"], method="blend"
                ),
                NO_CONTEXT,
            )

    first = await blend_next()
    assert (first.method, first.next_tool) == ("blend", "s:ship")  # search's order, no figures
    assert spans.last()["pml.planner.blend_weights"] == (0.0, 0.0)

    # On new work the hyperpath predicted every judged step, search's order none of them.
    n = MIN_EVIDENCE
    run = {new_work(v): MethodFigures(n, 0) for v in VARIANTS}
    run[new_work(variant((0.0, 2.0)))] = MethodFigures(n, n)
    await figures.record(tenant, run)
    followed = await blend_next()
    assert followed.next_tool == "s:test" and followed.target_capability == "release"
    assert spans.last()["pml.planner.blend_weights"] == (0.0, 2.0)
    info = await servicer.PlannerInfo(planner_pb2.PlannerInfoRequest(tenant_id=tenant), NO_CONTEXT)
    assert (info.blend_transitions_weight, info.blend_hyperpath_weight) == (0.0, 2.0)
    # and the figures the pair was chosen on are shown, every pair of the grid
    variants = {v.method: v for v in info.blend_variants_new_work}
    assert list(variants) == list(VARIANTS)
    assert variants[variant((0.0, 2.0))].next_hit_at_1 == 1.0
    assert variants[variant((0.0, 0.0))].next_hit_at_1 == 0.0


async def test_planner_info_shows_the_figures_and_the_choice(
    redis: Redis,
    graph_db: neo4j.AsyncDriver,
    settings: Settings,
    tenant: str,
    stand_ins: StandIns,
) -> None:
    servicer, figures = _servicer(redis, graph_db, settings, stand_ins)
    await figures.record(tenant, _one_run("search", "legacy", MIN_EVIDENCE))
    await figures.record(tenant, _one_run("legacy", "legacy", 3 * MIN_EVIDENCE, new=False))
    await figures.record(tenant, {})

    info = await servicer.PlannerInfo(
        planner_pb2.PlannerInfoRequest(tenant_id=tenant),
        NO_CONTEXT,
    )
    # Legacy's next steps are best on all runs but missed every step of new work, where the
    # blend (search's order) hit them all; its DAGs were exact on both.
    assert (info.next_method, info.dag_method) == ("blend", "legacy")
    assert (info.executions, info.skipped_executions) == (2, 1)
    assert info.min_evidence == MIN_EVIDENCE
    assert (info.blend_transitions_weight, info.blend_hyperpath_weight) == (0.0, 0.0)
    by_method = {m.method: m for m in info.methods}
    assert list(by_method) == list(METHODS)
    assert by_method["legacy"].predictions == 4 * MIN_EVIDENCE
    assert by_method["legacy"].next_hit_at_1 == pytest.approx(0.75)
    assert by_method["search"].next_hit_at_1 == pytest.approx(0.25)
    assert by_method["drdsp"].next_hit_at_1 == pytest.approx(0.5)
    assert by_method["legacy"].node_f1 == pytest.approx(1.0)
    assert by_method["legacy"].dags == 4 * MIN_EVIDENCE
    on_new_work = {m.method: m for m in info.new_work_methods}
    assert list(on_new_work) == list(METHODS)
    assert on_new_work["search"].predictions == MIN_EVIDENCE
    assert on_new_work["search"].next_hit_at_1 == 1.0
    assert on_new_work["legacy"].next_hit_at_1 == 0.0
    assert on_new_work["legacy"].node_f1 == pytest.approx(1.0)

    with pytest.raises(RequestError) as refused:
        await servicer.PlannerInfo(
            planner_pb2.PlannerInfoRequest(tenant_id="bad\x00tenant"),
            NO_CONTEXT,
        )
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
