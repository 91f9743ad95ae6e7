"""OpenTelemetry spans for the Cypher the services send to Neo4j.

No OpenTelemetry instrumentation of the Python Neo4j driver is published, so this module is the
one place that adds it: `instrument_neo4j` wraps the async driver's three ways of sending a
query, once per process (`stores.neo4j_driver` calls it, so every driver the services build is
traced). Each query becomes a CLIENT span, child of the span current when it was sent (the gRPC
request or the event being handled), following the database semantic conventions:

- `AsyncDriver.execute_query`: one span for the query and its records;
- `AsyncSession.run` (auto-commit) and `run` of explicit and managed transactions
  (`execute_read`/`execute_write` work): one span per statement, ending when the server has
  accepted it (records are streamed afterwards). A retried transaction shows one span per try.
  Statements `execute_query` sends for itself are not traced twice.

The span is named after a summary of the query (`db.query.summary`): its clauses in order, each
with the first label or relationship type it names (`MATCH Capability OPTIONAL MATCH
CONTAINS`), or the procedure it calls. Queries are constants (parameters carry the values), so
names stay few and the query text (`db.query.text`) holds no data.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import neo4j
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

_tracer = trace.get_tracer("pml_common.neo4j_tracing")

#: `db.system.name` of Neo4j in the semantic conventions.
DB_SYSTEM = "neo4j"
#: Longest summary kept (the semantic conventions' limit for `db.query.summary`).
MAX_SUMMARY = 255

_CLAUSE = re.compile(
    r"\b(ON\s+CREATE|ON\s+MATCH|OPTIONAL\s+MATCH|DETACH\s+DELETE|LOAD\s+CSV|MATCH|MERGE|CREATE|"
    r"DELETE|SET|REMOVE|UNWIND|FOREACH|CALL)\b",
    re.IGNORECASE,
)
_LABEL = re.compile(r":\s*`?([A-Za-z_][A-Za-z0-9_]*)")
_PROCEDURE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
_LITERALS_AND_COMMENTS = re.compile(
    r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|//[^\n]*|/\*.*?\*/", re.S
)
_WITH_TARGET = {"MATCH", "OPTIONAL MATCH", "MERGE", "CREATE"}

#: Set while `execute_query` runs: its own statement is already inside its span.
_inside_execute_query: ContextVar[bool] = ContextVar(
    "pml_neo4j_inside_execute_query", default=False
)
_state: dict[str, Any] = {"instrumented": False, "database": None}

T = TypeVar("T")


def query_summary(query: str) -> str:
    """A low-cardinality name for `query`: its clauses in order, with their first target."""
    text = _LITERALS_AND_COMMENTS.sub(" ", query)
    matches = list(_CLAUSE.finditer(text))
    parts: list[str] = []
    for i, match in enumerate(matches):
        clause = " ".join(match.group(1).upper().split())
        if clause.startswith("ON "):  # MERGE's ON CREATE / ON MATCH: part of the MERGE
            continue
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[match.end() : end]
        part = clause
        if clause in _WITH_TARGET and (label := _LABEL.search(body)):
            part = f"{clause} {label.group(1)}"
        elif clause == "CALL" and (procedure := _PROCEDURE.match(body)):
            part = f"CALL {procedure.group(1)}"
        if not parts or parts[-1] != part:
            parts.append(part)
    summary = " ".join(parts) or DB_SYSTEM
    return summary[:MAX_SUMMARY]


def _query_text(query: Any) -> str:
    return str(query.text if isinstance(query, neo4j.Query) else query)


@contextmanager
def _query_span(query: Any, database: str | None) -> Iterator[Span]:
    text = _query_text(query)
    summary = query_summary(text)
    attributes = {
        "db.system.name": DB_SYSTEM,
        "db.query.text": text,
        "db.query.summary": summary,
    }
    namespace = database or _state["database"]
    if namespace:
        attributes |= {"db.namespace": namespace}
    with _tracer.start_as_current_span(
        summary,
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            span.set_attribute("error.type", type(exc).__qualname__)
            code = getattr(exc, "code", None)
            if isinstance(code, str) and code:
                span.set_attribute("db.response.status_code", code)
            raise


def _traced_execute_query(
    original: Callable[..., Awaitable[T]],
) -> Callable[..., Awaitable[T]]:
    @functools.wraps(original)
    async def execute_query(self: Any, *args: Any, **kwargs: Any) -> T:
        query = args[0] if args else kwargs.get("query_", "")
        database = kwargs.get("database_")
        with _query_span(query, database if isinstance(database, str) else None) as span:
            token = _inside_execute_query.set(True)
            try:
                result = await original(self, *args, **kwargs)
            finally:
                _inside_execute_query.reset(token)
            records = getattr(result, "records", None)
            if isinstance(records, list):
                span.set_attribute("db.response.returned_rows", len(records))
            return result

    return execute_query


def _traced_run(original: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    @functools.wraps(original)
    async def run(self: Any, *args: Any, **kwargs: Any) -> T:
        if _inside_execute_query.get():
            return await original(self, *args, **kwargs)
        query = args[0] if args else kwargs.get("query", "")
        with _query_span(query, None):
            return await original(self, *args, **kwargs)

    return run


def instrument_neo4j(database: str | None = None) -> None:
    """Trace every query of the async Neo4j driver in this process (idempotent).

    `database` is recorded as `db.namespace` of statements whose call does not name one (the
    services open every session on the settings' database); `execute_query` records its own
    `database_`.
    """
    if database:
        _state["database"] = database
    if _state["instrumented"]:
        return
    _state["instrumented"] = True
    driver_cls = neo4j.AsyncDriver
    driver_cls.execute_query = _traced_execute_query(driver_cls.execute_query)  # type: ignore[method-assign, assignment]
    # The two transaction classes inherit `run` from a private base: wrapping it on each
    # public class keeps to the public API and leaves the base untouched.
    for cls in (neo4j.AsyncSession, neo4j.AsyncTransaction, neo4j.AsyncManagedTransaction):
        cls.run = _traced_run(cls.run)  # type: ignore[method-assign, assignment]
