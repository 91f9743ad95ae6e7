"""Spans of the Cypher sent to the suite's real Neo4j, through every way the services send it."""

from __future__ import annotations

import neo4j
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from pml_common.neo4j_tracing import query_summary
from pml_common.settings import Settings
from pml_common.stores import neo4j_driver
from pml_common.telemetry import setup_telemetry

_WRITE = "MERGE (t:Tool {tenant_id: $tenant, id: $id}) ON CREATE SET t.name = 'made by // test'"
_READ = "MATCH (t:Tool {tenant_id: $tenant}) RETURN t.id AS id ORDER BY id"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    setup_telemetry("neo4j-tracing-test", Settings(), span_exporter=exporter)
    return exporter


def _queries(exporter: InMemorySpanExporter, parent: ReadableSpan) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


def test_query_summaries_name_clauses_and_their_first_target() -> None:
    assert query_summary(_READ) == "MATCH Tool"
    assert query_summary(_WRITE) == "MERGE Tool SET"  # ON CREATE belongs to MERGE
    assert (
        query_summary(
            "MATCH (c:Capability {tenant_id: $t}) OPTIONAL MATCH (c)-[r:CONTAINS]->(m) RETURN c"
        )
        == "MATCH Capability OPTIONAL MATCH CONTAINS"
    )
    assert query_summary("CALL gds.graph.drop($name, false) YIELD graphName") == (
        "CALL gds.graph.drop"
    )
    assert query_summary("UNWIND $rows AS row MATCH (a:Tool) MATCH (b:Tool) RETURN a") == (
        "UNWIND MATCH Tool"
    )
    # Clause words inside literals and comments are not clauses.
    assert query_summary("RETURN 'MATCH (x:Secret)' AS s // CREATE (y:Other)") == "neo4j"
    assert len(query_summary("MATCH (a:A) CREATE (b:B) " * 100)) == 255


async def test_every_way_of_sending_cypher_is_one_child_span_per_query(
    settings: Settings, tenant: str, exporter: InMemorySpanExporter
) -> None:
    driver = neo4j_driver(settings)
    db = settings.neo4j_database
    tracer = trace.get_tracer("test")
    try:
        with tracer.start_as_current_span("request") as request:
            await driver.execute_query(_WRITE, tenant=tenant, id="a", database_=db)
            async with driver.session(database=db) as session:
                await (await session.run(_WRITE, tenant=tenant, id="b")).consume()

                async def work(tx: neo4j.AsyncManagedTransaction) -> list[str]:
                    result = await tx.run(_READ, tenant=tenant)
                    return [r["id"] async for r in result]

                ids = await session.execute_read(work)
                async with await session.begin_transaction() as tx:
                    await (await tx.run(_WRITE, tenant=tenant, id="c")).consume()
    finally:
        await driver.close()
    assert ids == ["a", "b"]
    spans = _queries(exporter, request)  # type: ignore[arg-type]
    assert [s.name for s in spans] == [
        "MERGE Tool SET",
        "MERGE Tool SET",
        "MATCH Tool",
        "MERGE Tool SET",
    ]
    for span in spans:
        assert span.kind is SpanKind.CLIENT
        assert span.context.trace_id == request.get_span_context().trace_id
        attrs = dict(span.attributes or {})
        assert attrs["db.system.name"] == "neo4j"
        assert attrs["db.namespace"] == db
        assert attrs["db.query.text"] in (_WRITE, _READ)
        assert attrs["db.query.summary"] == span.name
    # execute_query's span covers its records, and its own statement is not traced twice.
    assert dict(spans[0].attributes or {})["db.response.returned_rows"] == 0


async def test_a_failing_query_is_an_error_span_with_the_server_code(
    settings: Settings, exporter: InMemorySpanExporter
) -> None:
    driver = neo4j_driver(settings)
    tracer = trace.get_tracer("test")
    try:
        with (
            tracer.start_as_current_span("request") as request,
            pytest.raises(neo4j.exceptions.CypherSyntaxError),
        ):
            await driver.execute_query("MATCH (n:Tool RETURN n", database_="neo4j")
    finally:
        await driver.close()
    (span,) = _queries(exporter, request)  # type: ignore[arg-type]
    assert span.status.status_code is StatusCode.ERROR
    attrs = dict(span.attributes or {})
    assert attrs["error.type"] == "CypherSyntaxError"
    assert attrs["db.response.status_code"] == "Neo.ClientError.Statement.SyntaxError"
    assert any(e.name == "exception" for e in span.events)
