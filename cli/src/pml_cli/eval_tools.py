"""`pml eval tools`: tool-retrieval metrics of one or several methods, through the running system.

The catalog is registered under a tenant of its own, every query goes through the public gRPC
API, and the tenant is deleted at the end, so the evaluation leaves no data behind. When no
search service answers, a private stack is started on free ports and stopped afterwards.

Single-pass methods (nothing learned from the data set):
- `cosine`: `Search` over tools with the dense retriever, re-sorted by the semantic score (the
  cosine of the embeddings): the name `dense` has today, kept for earlier figures;
- `unified`: `Search` as served (`min(semantic × reliability, 0.95)`);
- `hybrid`: `SearchTools` (semantic and graph, no context here);
- `dense`, `lexical`, `hybrid-fused`: `Search` over tools with that first-stage `retriever`
  (`hybrid-fused` asks for "hybrid", BM25 and dense fused), re-sorted by the semantic score,
  which is that retriever's relevance: the first stage alone.

With `--folds` the methods learn from training folds (`eval_folds`). Every query is fitted to
the service's query limit, failures are reported and scored as misses, and figures are also
given per level prefix of the query ids (`eval_runs`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.progress import Progress

from pml.v1 import search_pb2
from pml_cli import client
from pml_cli.eval_data import EvalError as EvalError
from pml_cli.eval_data import QuerySelection
from pml_cli.eval_data import ToolQuery as ToolQuery
from pml_cli.eval_data import load_queries as load_queries
from pml_cli.eval_data import load_tool_catalog as load_tool_catalog
from pml_cli.eval_runs import (
    Failures,
    Grouped,
    PerQueryLog,
    check_unique_ids,
    describe,
    fit_queries,
    methods_of,
    per_query_log,
    retry_unavailable,
)
from pml_cli.local_stack import running_system
from pml_cli.metrics import ToolMetrics
from pml_cli.phases import phase
from pml_common.events import ToolSpec
from pml_common.settings import Settings

#: Methods that learn nothing from the data set: one pass over every query.
METHODS = ("cosine", "unified", "hybrid", "dense", "lexical", "hybrid-fused")
#: The first-stage retriever each `Search`-based method asks for ("" = the service default).
RETRIEVERS = {
    "cosine": "dense",
    "unified": "",
    "dense": "dense",
    "lexical": "lexical",
    "hybrid-fused": "hybrid",
}
#: Methods whose ranking is the semantic score alone, re-sorted by the client.
BY_SEMANTIC = ("cosine", "dense", "lexical", "hybrid-fused")
TOP_K = 10
#: Methods ranked by the semantic score ask for more than they keep (the unified cap ties).
COSINE_POOL = 20
IN_FLIGHT = 4

Rank = Callable[[ToolQuery], list[str]]


@contextmanager
def eval_tenant(
    settings: Settings, tools: Sequence[ToolSpec], console: Console, label: str = ""
) -> Iterator[str]:
    """A tenant of its own holding the catalog, deleted afterwards: evaluations leave nothing."""
    tenant = f"eval-{uuid.uuid4().hex[:12]}"
    prefix = f"{label}: " if label else ""
    with client.scratch_tenants(settings, console, tenant, timeout=120):
        with phase(console, f"{prefix}registering {len(tools)} tools"):
            # Registering again is harmless: unchanged tools are counted, not stored twice.
            retry_unavailable(lambda: client.register_tools(settings, tenant, tools))
        yield tenant


@dataclass
class ToolRun:
    """One method's figures over the queries it ranked, per group, and its failures."""

    metrics: Grouped[ToolMetrics] = field(default_factory=lambda: Grouped(ToolMetrics))
    failures: Failures = field(default_factory=Failures)

    def add(self, query: ToolQuery, ranked: list[str], error: str | None) -> dict[str, float]:
        if error is not None:
            self.failures.add(query.id, error)
        values: dict[str, float] = {}
        for metrics in self.metrics.of(query.id):
            values = metrics.add(ranked, query.relevant)
        return values

    def result(self) -> dict[str, Any]:
        return {**self.metrics.result(), **self.failures.result()}


def load_eval_queries(
    settings: Settings, data: Path, selection: QuerySelection
) -> tuple[list[ToolQuery], int]:
    """The set's queries `selection` keeps, fitted; and how many were cut."""
    queries = selection.apply(load_queries(data / "queries.jsonl"))
    if not queries:
        raise EvalError(f"{data / 'queries.jsonl'}: no query with {selection.describe()}")
    check_unique_ids(queries)
    return fit_queries(queries, settings.max_query_chars)


def evaluate_tools(
    settings: Settings,
    data: Path,
    method: str,
    selection: QuerySelection,
    console: Console,
    per_query: Path | None = None,
) -> dict[str, Any]:
    methods = methods_of(method, METHODS, "without --folds")
    tools = load_tool_catalog(data)
    queries, truncated = load_eval_queries(settings, data, selection)
    runs = {m: ToolRun() for m in methods}
    started = time.perf_counter()
    with (
        per_query_log(per_query) as log,
        running_system(settings, console, ("search",)) as live,
        eval_tenant(live, tools, console) as tenant,
    ):
        for m in methods:
            rank_queries(ranker(live, tenant, m), queries, runs[m], console, m, log)
    return {
        "data": data.name,
        "split": None,
        "queries": len(queries),
        "truncated": truncated,
        "methods": {m: runs[m].result() for m in methods},
        "seconds": round(time.perf_counter() - started, 1),
    }


def rank_queries(
    rank: Rank,
    queries: Sequence[ToolQuery],
    run: ToolRun,
    console: Console,
    method: str,
    log: PerQueryLog,
    fold: int | None = None,
) -> ToolRun:
    """Rank every query (4 in flight) into `run`; a failed call is reported, not raised."""

    def attempt(query: ToolQuery) -> tuple[list[str], str | None]:
        try:
            return rank(query)[:TOP_K], None
        except grpc.RpcError as exc:
            return [], describe(exc)

    label = method if fold is None else f"fold {fold + 1}: {method}"
    with (
        Progress(console=console, transient=True) as progress,
        ThreadPoolExecutor(IN_FLIGHT) as pool,
    ):
        task = progress.add_task(label, total=len(queries))
        for query, (ranked, error) in zip(queries, pool.map(attempt, queries), strict=True):
            values = run.add(query, ranked, error)
            log.write(
                method,
                query,
                fold,
                relevant=query.relevant,
                ranked=ranked,
                metrics=values,
                error=error,
            )
            progress.advance(task)
    return run


def ranker(settings: Settings, tenant: str, method: str) -> Rank:
    """The `Rank` of a single-pass method over `tenant`, through the gRPC API."""
    stub = client.search_stub(settings)
    tool_kind = [search_pb2.NODE_KIND_TOOL]

    def search(query: ToolQuery) -> list[str]:
        pool = COSINE_POOL if method in BY_SEMANTIC else TOP_K
        request = search_pb2.SearchRequest(
            tenant_id=tenant,
            query=query.query,
            limit=pool,
            kinds=tool_kind,
            retriever=RETRIEVERS[method],
        )
        results = list(stub.Search(request, timeout=60).results)
        if method in BY_SEMANTIC:
            results.sort(key=lambda r: -r.semantic_score)
        return [r.id for r in results[:TOP_K]]

    def hybrid(query: ToolQuery) -> list[str]:
        reply = stub.SearchTools(
            search_pb2.SearchToolsRequest(tenant_id=tenant, query=query.query, limit=TOP_K),
            timeout=60,
        )
        return [t.tool_id for t in reply.tools]

    return retrying(hybrid if method == "hybrid" else search)


def retrying(rank: Rank) -> Rank:
    """`rank`, once more on UNAVAILABLE (`retry_unavailable`)."""
    return lambda query: retry_unavailable(lambda: rank(query))
