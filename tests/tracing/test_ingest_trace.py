"""One ingested document is one trace: `IngestService.Submit`, then every pass worker and search's
chunk indexing, each continuing the trace carried by the event it consumes."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from pml.v1 import ingest_pb2, ingest_pb2_grpc
from pml_common.events import STREAM_OF
from pml_common.grpc_client import channel
from pml_common.local_runtime import free_port
from pml_common.settings import Settings
from pml_common.testing import eventually
from pml_ingest.main import serve as serve_ingest
from pml_ingest.worker import serve as serve_worker
from pml_search.main import serve as serve_search

from .traces import Serve, Trace, assert_local_child, assert_remote_child, serving

SUBMIT = "/pml.v1.IngestService/Submit"
DOCUMENT = ingest_pb2.Document(
    id="sales",
    title="Sales Process",
    format="markdown",
    text="""# Sales Process

## Quotations

Solution Quotation Management prepares every offer for the customer.
Service Contract Execution requires Solution Quotation Management.

## Contracts

Service Contract Execution requires Solution Quotation Management to have approved the offer.
""",
)
#: pass → (event it consumes, event it publishes when done)
CHAIN = {
    "chunking": ("DocumentSubmitted", "ChunkingCompleted"),
    "pass1": ("ChunkingCompleted", "Pass1Completed"),
    "pass2a": ("Pass1Completed", "Pass2aCompleted"),
    "pass2b": ("Pass2aCompleted", "Pass2bCompleted"),
    "pass3": ("Pass2bCompleted", "Pass3Completed"),
}


def _services(settings: Settings) -> list[tuple[str, Serve, str]]:
    """Search (chunk indexing), the ingest API and one worker per pass, each on its own port."""
    services: list[tuple[str, Serve, str]] = [
        ("search", lambda: serve_search(settings), settings.search_addr),
        ("ingest", lambda: serve_ingest(settings), settings.ingest_addr),
    ]
    for name in CHAIN:
        worker = settings.model_copy(update={"ingest_worker_port": free_port()})
        address = f"127.0.0.1:{worker.ingest_worker_port}"
        services.append((f"ingest-{name}", lambda w=worker, n=name: serve_worker(w, n), address))
    return services


def _on_free_ports(settings: Settings) -> Settings:
    search, ingest = free_port(), free_port()
    return settings.model_copy(
        update={
            "search_port": search,
            "search_addr": f"127.0.0.1:{search}",
            "ingest_port": ingest,
            "ingest_addr": f"127.0.0.1:{ingest}",
        }
    )


def _consumed(trace: Trace, event_type: str, group: str) -> ReadableSpan:
    (span,) = [
        s
        for s in trace.named(f"consume {event_type}", SpanKind.CONSUMER)
        if dict(s.attributes or {}).get("messaging.consumer.group.name") == group
    ]
    return span


def _published(trace: Trace, event_type: str) -> ReadableSpan:
    return trace.one(f"publish {event_type}", SpanKind.PRODUCER)


def _complete(trace: Trace) -> bool:
    groups = {
        dict(s.attributes or {}).get("messaging.consumer.group.name")
        for s in trace.spans
        if s.kind is SpanKind.CONSUMER
    }
    return {"ingest-pass3", "search-chunks"} <= groups and "publish Pass3Completed" in trace.names()


async def test_one_document_is_one_trace_across_every_pass_and_chunk_indexing(
    settings: Settings, tenant: str, exporter: InMemorySpanExporter
) -> None:
    settings = _on_free_ports(settings)
    async with serving(_services(settings)):
        exporter.clear()
        async with channel(settings.ingest_addr, settings) as ingest_channel:
            reply = await ingest_pb2_grpc.IngestServiceStub(ingest_channel).Submit(
                ingest_pb2.SubmitRequest(tenant_id=tenant, documents=[DOCUMENT]), timeout=30
            )
        assert list(reply.document_ids) == [DOCUMENT.id]
        client = next(
            s
            for s in exporter.get_finished_spans()
            if s.name == SUBMIT and s.kind is SpanKind.CLIENT
        )

        async def so_far() -> Trace:
            return Trace.of(exporter, client.context.trace_id)

        trace = await eventually(so_far, _complete, within_s=90)

    assert trace.assert_one_tree() is client
    submit = trace.one(SUBMIT, SpanKind.SERVER)
    assert_remote_child(trace, submit, client)
    assert dict(submit.attributes or {})["pml.tenant_id"] == tenant

    # Each pass consumes the event the one before published, through the event's trace field.
    assert_local_child(trace, _published(trace, "DocumentSubmitted"), submit)
    for name, (consumes, publishes) in CHAIN.items():
        published = _published(trace, consumes)
        assert (
            dict(published.attributes or {})["messaging.destination.name"] == (STREAM_OF[consumes])
        )
        consumed = _consumed(trace, consumes, f"ingest-{name}")
        assert_remote_child(trace, consumed, published)
        for span, operation in ((published, "send"), (consumed, "process")):
            assert dict(span.attributes or {})["messaging.operation.type"] == operation
        work = trace.one(f"ingest.{name}", SpanKind.INTERNAL)
        assert_local_child(trace, work, consumed)
        attrs = dict(work.attributes or {})
        assert (attrs["pml.tenant_id"], attrs["pml.document_id"]) == (tenant, DOCUMENT.id)
        queries = [s for s in trace.children(work) if s.kind is SpanKind.CLIENT]
        assert queries, f"no Neo4j query under ingest.{name}"
        assert all(dict(q.attributes or {})["db.system.name"] == "neo4j" for q in queries)
        assert_local_child(trace, _published(trace, publishes), consumed)

    # Search indexed the chunks the chunking pass published, in the same trace.
    chunks = _published(trace, "ChunksExtracted")
    assert_local_child(trace, chunks, trace.one("ingest.chunking"))
    indexed = _consumed(trace, "ChunksExtracted", "search-chunks")
    assert_remote_child(trace, indexed, chunks)
    assert dict(indexed.attributes or {})["pml.tenant_id"] == tenant
    assert indexed.status.is_ok
