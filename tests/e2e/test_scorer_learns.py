"""Executions published on the stream lead to a new SHGAT version served by the scorer, and the
executed capability's score for that intent rises; the version was admitted on held-back
executions, and how the served scores ranked each execution before it was learned (prequential
figures) is reported by `ModelInfo` and exported as OpenTelemetry metrics. Public interfaces
only: gRPC, streams and an OTLP collector that the services export to."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from pml.v1 import common_pb2, scorer_pb2, scorer_pb2_grpc, search_pb2, search_pb2_grpc
from pml_cli.client import publish_events
from pml_cli.local_stack import LocalStack
from pml_common.events import ExecutionCompleted, ExecutionStep
from pml_common.local_runtime import ManagedProcess

pytestmark = pytest.mark.e2e

TOOLS = {
    "fs:read_file": "Read the complete contents of a file.",
    "fs:write_file": "Create or overwrite a file.",
    "s3:upload": "Upload an object to a storage bucket.",
    "s3:list": "List the objects of a bucket.",
    "mail:send": "Send an email message.",
    "cal:create_event": "Create a calendar event.",
    "web:search": "Search the web.",
    "web:fetch": "Fetch a web page.",
}
CAPABILITIES = {
    "backup": ["fs:read_file", "s3:upload"],
    "research": ["web:search", "web:fetch"],
    "invite": ["cal:create_event", "mail:send"],
}
INTENTS = {
    "backup": [
        "keep my notes safe somewhere else",
        "make sure my diary survives a disk crash",
        "put a copy of the thesis out of harm's way",
        "save my photos away from this laptop",
    ],
    "research": [
        "find out what people say about rust",
        "gather material on solar panels",
        "learn about the history of tea",
    ],
    "invite": [
        "get the team together on friday",
        "organise a meeting with alice",
        "set up a catch-up with the designers",
    ],
}
PROBE = "keep my notes safe somewhere else"
#: The trainer holds back every 5th execution of a tenant (pml_trainer.holdout).
HELD_BACK_EVERY = 5


class Collector(
    metrics_service_pb2_grpc.MetricsServiceServicer, trace_service_pb2_grpc.TraceServiceServicer
):
    """An OTLP receiver: keeps every metric data point the services export (spans are taken
    and dropped), as (service, metric name, attributes, value) rows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.points: list[tuple[str, str, dict[str, object], float]] = []

    def Export(self, request, context):  # type: ignore[no-untyped-def]
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            return trace_service_pb2.ExportTraceServiceResponse()
        rows = [
            (_service(rm), m.name, _attributes(p.attributes), _value(p))
            for rm in request.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            for p in _points(m)
        ]
        with self._lock:
            self.points.extend(rows)
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def latest(self, name: str, **attributes: object) -> float | None:
        """The last exported value of a metric's series (cumulative: the running total)."""
        with self._lock:
            values = [
                v
                for _, n, a, v in self.points
                if n == name and all(a.get(k) == want for k, want in attributes.items())
            ]
        return values[-1] if values else None


class _TraceSink(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):  # type: ignore[no-untyped-def]
        return trace_service_pb2.ExportTraceServiceResponse()


def _service(resource_metrics) -> str:  # type: ignore[no-untyped-def]
    for kv in resource_metrics.resource.attributes:
        if kv.key == "service.name":
            return str(kv.value.string_value)
    return ""


def _attributes(kvs) -> dict[str, object]:  # type: ignore[no-untyped-def]
    out: dict[str, object] = {}
    for kv in kvs:
        field = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, field) if field else None
    return out


def _points(metric):  # type: ignore[no-untyped-def]
    kind = metric.WhichOneof("data")
    return list(getattr(metric, kind).data_points) if kind else []


def _value(point) -> float:  # type: ignore[no-untyped-def]
    """A histogram point's count, else the point's value."""
    if hasattr(point, "bucket_counts"):
        return float(point.count)
    return float(point.as_double if point.HasField("as_double") else point.as_int)


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    sink = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(sink, server)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceSink(), server)
    sink.port = server.add_insecure_port("127.0.0.1:0")  # type: ignore[attr-defined]
    server.start()
    yield sink
    server.stop(grace=None)


@pytest.fixture(scope="module")
def stack(
    redis_server: ManagedProcess,
    neo4j_server: ManagedProcess,
    tmp_path_factory: pytest.TempPathFactory,
    collector: Collector,
) -> Iterator[LocalStack]:
    """The e2e system (as in conftest), exporting spans and metrics to `collector` each second."""
    state = tmp_path_factory.mktemp("e2e-learns")
    stack = LocalStack.on_free_ports(state, reclaim_idle_ms=1000, log_format="console")
    stack.settings = stack.settings.model_copy(
        update={
            "redis_url": redis_server.url,
            "neo4j_uri": neo4j_server.url,
            "otel_exporter_otlp_endpoint": f"http://127.0.0.1:{collector.port}",  # type: ignore[attr-defined]
        }
    )
    # The SDK's export interval, read by the child processes' metric readers.
    previous = os.environ.get("OTEL_METRIC_EXPORT_INTERVAL")
    os.environ["OTEL_METRIC_EXPORT_INTERVAL"] = "1000"
    try:
        stack.start_services(["search", "trainer"])
        yield stack
    finally:
        stack.stop()
        if previous is None:
            os.environ.pop("OTEL_METRIC_EXPORT_INTERVAL", None)
        else:
            os.environ["OTEL_METRIC_EXPORT_INTERVAL"] = previous


@pytest.fixture(scope="module")
def scorer(stack: LocalStack) -> Iterator[scorer_pb2_grpc.ScorerServiceStub]:
    stack.start_services(["scorer"])
    with grpc.insecure_channel(stack.settings.scorer_addr) as channel:
        yield scorer_pb2_grpc.ScorerServiceStub(channel)


def _backup_score(scorer: scorer_pb2_grpc.ScorerServiceStub, tenant: str) -> tuple[float, str]:
    # generous: a tenant's first request builds its model, slow on a loaded 2-core machine
    reply = scorer.ScoreCapabilities(
        scorer_pb2.ScoreRequest(tenant_id=tenant, text=PROBE, top_k=10), timeout=120
    )
    scores = {s.id: s.score for s in reply.scores}
    return scores.get("backup", -1.0), reply.model_version


def test_executions_lead_to_a_served_model_that_prefers_the_executed_capability(
    stack: LocalStack,
    scorer: scorer_pb2_grpc.ScorerServiceStub,
    search_stub: search_pb2_grpc.SearchServiceStub,
    collector: Collector,
    e2e_tenant: str,
    eventually: Callable[..., object],
) -> None:
    _register(search_stub, e2e_tenant)
    # The trainer writes the graph, GraphChanged reaches the scorer: three capabilities served.
    eventually(lambda: _backup_score(scorer, e2e_tenant), lambda r: r[0] >= 0, timeout=60)
    before, version = _backup_score(scorer, e2e_tenant)
    assert version == "untrained"

    runs = [
        (cap, intent) for _ in range(2) for cap, intents in INTENTS.items() for intent in intents
    ]
    # One execution in five is held back to judge new versions; the rest are learned from. The
    # held-back ones are backups: the first stage ranks reading the file, their first step, below
    # writing or uploading, so what these executions teach shows there (research and invitation
    # steps are the first stage's top tools already, and a version that only ties it is not
    # published).
    held = [("backup", intent) for intent in INTENTS["backup"]]
    trained = list(runs)
    for run in held:
        trained.remove(run)
    ordered = [
        held.pop(0) if (i + 1) % HELD_BACK_EVERY == 0 else trained.pop(0) for i in range(len(runs))
    ]
    events = [
        ExecutionCompleted.create(
            tenant_id=e2e_tenant,
            intent=intent,
            steps=[ExecutionStep(node_id=t, success=True) for t in CAPABILITIES[cap]],
            outcome="success",
            capability_id=cap,
        )
        for cap, intent in ordered
    ]
    learned = len(events) - len(events) // HELD_BACK_EVERY
    assert learned >= stack.settings.replay_min_traces
    asyncio.run(publish_events(stack.settings, events))

    info = eventually(
        lambda: scorer.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=e2e_tenant), timeout=30),
        lambda i: i.version != "untrained" and i.metrics.get("traces_seen", 0) >= learned,
        timeout=240,
    )
    assert info.fencing_token > 0 and info.num_capabilities == 3  # type: ignore[attr-defined]
    after, served = _backup_score(scorer, e2e_tenant)
    assert served != "untrained"
    assert after > before + 0.05, (before, after)

    # Admitted on the held-back executions: better than the first stage, which served before.
    admitted = info.last_accepted  # type: ignore[attr-defined]
    assert admitted.version == info.version and admitted.accepted  # type: ignore[attr-defined]
    assert admitted.holdout_size == len(events) // HELD_BACK_EVERY
    assert (admitted.candidate_recall_at_5, admitted.candidate_mrr) > (
        admitted.first_stage_recall_at_5,
        admitted.first_stage_mrr,
    )
    # ... with weights chosen on other held-back executions too (what the gate decides on)
    assert (admitted.cross_fitted_recall_at_5, admitted.cross_fitted_mrr) > (
        admitted.first_stage_recall_at_5,
        admitted.first_stage_mrr,
    )
    assert admitted.traces_seen == info.metrics["traces_seen"]  # type: ignore[attr-defined]
    # served with the weights it was admitted with: SHGAT's, the execution memory's, or both
    weights = (admitted.correction_weight, admitted.memory_weight)
    assert (info.correction_weight, info.memory_weight) == weights  # type: ignore[attr-defined]
    assert sum(weights) > 0
    tools = scorer.ScoreTools(
        scorer_pb2.ScoreRequest(tenant_id=e2e_tenant, text=PROBE, top_k=3), timeout=30
    )
    assert tools.model_version == info.version  # type: ignore[attr-defined]
    assert (tools.correction_weight, tools.memory_weight) == weights
    # and the decision was exported
    eventually(
        lambda: collector.latest(
            "pml.trainer.gate.decisions", **{"pml.tenant_id": e2e_tenant, "decision": "accepted"}
        ),
        lambda n: n is not None and n >= 1,
        timeout=60,
    )
    eventually(
        lambda: collector.latest(
            "pml.trainer.gate.holdout_recall_at_5",
            **{"pml.tenant_id": e2e_tenant, "ranker": "cross_fitted"},
        ),
        lambda r: r is not None and r > 0,
        timeout=60,
    )


def test_prequential_figures_in_model_info_and_metrics(
    stack: LocalStack,
    scorer: scorer_pb2_grpc.ScorerServiceStub,
    search_stub: search_pb2_grpc.SearchServiceStub,
    collector: Collector,
    e2e_tenant: str,
    eventually: Callable[..., object],
) -> None:
    _register(search_stub, e2e_tenant)
    eventually(lambda: _backup_score(scorer, e2e_tenant), lambda r: r[0] >= 0, timeout=60)
    events = [
        ExecutionCompleted.create(
            tenant_id=e2e_tenant,
            intent=intent,
            steps=[ExecutionStep(node_id=t, success=True) for t in CAPABILITIES["backup"]],
            outcome="success",
            capability_id="backup",
        )
        for intent in INTENTS["backup"]
    ]
    asyncio.run(publish_events(stack.settings, events))
    asyncio.run(publish_events(stack.settings, events[:1]))  # a redelivery counts once

    info = eventually(
        lambda: scorer.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=e2e_tenant), timeout=30),
        lambda i: i.prequential.cumulative.count >= len(events),
        timeout=120,
    )
    window, total = info.prequential.window, info.prequential.cumulative  # type: ignore[attr-defined]
    assert window.count == total.count == len(events)
    for figures in (window, total):
        assert 0 <= figures.recall_at_1 <= figures.recall_at_5 <= figures.recall_at_10 <= 1
        assert 1 <= figures.first_rank <= len(TOOLS)
    # Too few executions to train on: what was measured is the first stage (8 tools, so every
    # executed tool is in the top 10).
    assert info.version == "untrained" and total.recall_at_10 == 1.0  # type: ignore[attr-defined]

    # The trainer exports the same figures: one recall@k and one first-tool rank per execution.
    tenant = {"pml.tenant_id": e2e_tenant}

    def exported() -> tuple[float | None, ...]:
        return (
            collector.latest("pml.trainer.prequential.recall", **tenant, k=5),
            collector.latest("pml.trainer.prequential.recall", **tenant, k=1),
            collector.latest("pml.trainer.prequential.first_rank", **tenant),
        )

    eventually(exported, lambda counts: counts == (len(events),) * 3, timeout=60)


def _register(search_stub: search_pb2_grpc.SearchServiceStub, tenant: str) -> None:
    search_stub.RegisterTools(
        search_pb2.RegisterToolsRequest(
            tenant_id=tenant,
            tools=[
                common_pb2.Tool(id=t, server=t.split(":")[0], name=t.split(":")[1], description=d)
                for t, d in TOOLS.items()
            ],
        ),
        timeout=60,
    )
    search_stub.RegisterCapabilities(
        search_pb2.RegisterCapabilitiesRequest(
            tenant_id=tenant,
            capabilities=[
                common_pb2.Capability(id=c, name=c, tools=tools)
                for c, tools in CAPABILITIES.items()
            ],
        ),
        timeout=60,
    )


#: Tools whose input-schema field names matter to the lexical side, for a chained request.
WALLET = {
    "wallet:get_balance": ("Show how much a wallet holds.", ["address", "token"]),
    "wallet:send_payment": ("Move funds to someone.", ["recipient", "amount"]),
    "wallet:list_history": ("Past movements of a wallet.", ["address", "since"]),
    "fs:read_file": ("Read a file from disk.", ["path"]),
    "mail:send_message": ("Send an email.", ["to", "subject", "body"]),
    # In another script than the request: judged in part by USE alone, the same on both sides.
    "fx:quote": ("查询两种货币之间的实时汇率。", ["base", "target"]),
}
CHAINED = "check the token balance of this address, then send the amount to the recipient"


def test_untrained_tool_scores_are_search_hybrid_relevance(
    scorer: scorer_pb2_grpc.ScorerServiceStub,
    search_stub: search_pb2_grpc.SearchServiceStub,
    e2e_tenant: str,
    eventually: Callable[..., object],
) -> None:
    """Before any learning, the scorer serves exactly search's first stage: the same BM25 over
    names, servers, descriptions and schema fields, the same tool embedder, the same
    sub-goals."""
    search_stub.RegisterTools(
        search_pb2.RegisterToolsRequest(
            tenant_id=e2e_tenant,
            tools=[
                common_pb2.Tool(
                    id=t,
                    server=t.split(":")[0],
                    name=t.split(":")[1],
                    description=description,
                    input_schema_json=json.dumps(
                        {"type": "object", "properties": {f: {"type": "string"} for f in fields}}
                    ),
                )
                for t, (description, fields) in WALLET.items()
            ],
        ),
        timeout=60,
    )

    def searched(text: str) -> dict[str, float]:
        request = search_pb2.SearchRequest(
            tenant_id=e2e_tenant,
            query=text,
            limit=len(WALLET),
            kinds=[search_pb2.NODE_KIND_TOOL],
            retriever="hybrid",
        )
        return {r.id: r.semantic_score for r in search_stub.Search(request, timeout=60).results}

    def scored(text: str) -> scorer_pb2.ScoreResponse:
        request = scorer_pb2.ScoreRequest(tenant_id=e2e_tenant, text=text, top_k=len(WALLET))
        return scorer.ScoreTools(request, timeout=120)

    want = searched(CHAINED)
    reply = eventually(lambda: scored(CHAINED), lambda r: len(r.scores) == len(WALLET), timeout=60)
    assert reply.model_version == "untrained" and reply.correction_weight == 0.0
    assert {s.id: s.score for s in reply.scores} == pytest.approx(want, abs=1e-4)
    # both steps of the chain are on top, which neither side alone would guarantee
    assert {s.id for s in reply.scores[:2]} == {"wallet:get_balance", "wallet:send_payment"}

    # A Chinese chained request: split into its two steps, and every tool judged as foreign
    # (the one Chinese tool too), the same on both sides.
    chinese = "查一下这个地址的代币余额，然后把这笔金额转给收款人"
    got = {s.id: s.score for s in scored(chinese).scores}
    assert got == pytest.approx(searched(chinese), abs=1e-4)
