"""`pml eval tools`: tool-retrieval metrics of one method, through the running system.

The catalog is registered under a tenant of its own, every query goes through the public gRPC
API, and the tenant is deleted at the end, so the evaluation leaves no data behind. When no
search service answers, a private stack is started on free ports and stopped afterwards.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from pydantic import BaseModel, Field, ValidationError
from rich.console import Console
from rich.progress import Progress

from pml.v1 import search_pb2
from pml_cli import client
from pml_cli.catalog_files import CatalogFileError, load_catalog
from pml_cli.local_stack import running_system
from pml_cli.metrics import ToolMetrics
from pml_common.events import ToolSpec
from pml_common.settings import Settings

METHODS = ("cosine", "unified", "hybrid")
TOP_K = 10
#: cosine re-sorts by semantic score, so it asks for more than it keeps.
COSINE_POOL = 20


class EvalError(ValueError):
    """The evaluation cannot run; the message says why."""


class ToolQuery(BaseModel):
    id: str
    query: str = Field(min_length=1)
    relevant: list[str] = Field(min_length=1)
    sequence: list[str] | None = None


def load_queries(path: Path, limit: int | None = None) -> list[ToolQuery]:
    queries = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EvalError(f"{path}: cannot read: {exc.strerror}") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            queries.append(ToolQuery.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise EvalError(f"{path}:{number}: not a query of the exchange format: {exc}") from exc
        if limit is not None and len(queries) >= limit:
            break
    return queries


def load_tool_catalog(data: Path) -> list[ToolSpec]:
    """The set's `catalog.jsonl`, or an `EvalError` saying what is wrong with it."""
    try:
        return load_catalog(data / "catalog.jsonl")
    except CatalogFileError as exc:
        raise EvalError(str(exc)) from exc


@contextmanager
def eval_tenant(
    settings: Settings, tools: Sequence[ToolSpec], console: Console, label: str = ""
) -> Iterator[str]:
    """A tenant of its own holding the catalog, deleted afterwards: evaluations leave nothing."""
    tenant = f"eval-{uuid.uuid4().hex[:12]}"
    prefix = f"{label}: " if label else ""
    try:
        with console.status(f"{prefix}registering {len(tools)} tools…"):
            client.register_tools(settings, tenant, tools)
        yield tenant
    finally:
        client.search_stub(settings).DeleteTenant(
            search_pb2.DeleteTenantRequest(tenant_id=tenant), timeout=120
        )


def evaluate_tools(
    settings: Settings, data: Path, method: str, max_queries: int | None, console: Console
) -> dict[str, Any]:
    if method not in METHODS:
        raise EvalError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    tools = load_tool_catalog(data)
    queries = load_queries(data / "queries.jsonl", max_queries)
    if not queries:
        raise EvalError(f"{data / 'queries.jsonl'}: no queries")
    with running_system(settings, console) as live, eval_tenant(live, tools, console) as tenant:
        rank = ranker(live, tenant, method)
        metrics = rank_queries(rank, queries, ToolMetrics(), console, f"{method}: queries")
    return {"method": method, **metrics.result()}


def rank_queries(
    rank: Callable[[str], list[str]],
    queries: Sequence[ToolQuery],
    metrics: ToolMetrics,
    console: Console,
    label: str,
) -> ToolMetrics:
    """Rank every query (4 in flight) and add its result to `metrics`."""
    with Progress(console=console, transient=True) as progress, ThreadPoolExecutor(4) as pool:
        task = progress.add_task(label, total=len(queries))
        for query, ranked in zip(queries, pool.map(lambda q: rank(q.query), queries), strict=True):
            metrics.add(ranked, query.relevant)
            progress.advance(task)
    return metrics


def ranker(settings: Settings, tenant: str, method: str) -> Callable[[str], list[str]]:
    stub = client.search_stub(settings)
    tool_kind = [search_pb2.NODE_KIND_TOOL]

    def cosine(query: str) -> list[str]:
        reply = stub.Search(
            search_pb2.SearchRequest(
                tenant_id=tenant, query=query, limit=COSINE_POOL, kinds=tool_kind
            ),
            timeout=60,
        )
        ordered = sorted(reply.results, key=lambda r: -r.semantic_score)
        return [r.id for r in ordered[:TOP_K]]

    def unified(query: str) -> list[str]:
        reply = stub.Search(
            search_pb2.SearchRequest(tenant_id=tenant, query=query, limit=TOP_K, kinds=tool_kind),
            timeout=60,
        )
        return [r.id for r in reply.results]

    def hybrid(query: str) -> list[str]:
        reply = stub.SearchTools(
            search_pb2.SearchToolsRequest(tenant_id=tenant, query=query, limit=TOP_K),
            timeout=60,
        )
        return [t.tool_id for t in reply.tools]

    rankers = {"cosine": cosine, "unified": unified, "hybrid": hybrid}
    return _retrying(rankers[method])


def _retrying(rank: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    """One retry on UNAVAILABLE, so a blip on a shared machine does not void a long run."""

    def call(query: str) -> list[str]:
        try:
            return rank(query)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                raise
            return rank(query)

    return call
