"""`pml bench search`: Search latency over gRPC with concurrent clients, and in-process.

A synthetic catalog of N tools (verbs × objects × places, so queries have real answers) is
registered under a tenant of its own and deleted at the end. Every query is run once first, so
the measured runs find their embeddings in the shared Redis cache (the "warm cache" of the
goal). The in-process figure calls the same servicer code without gRPC, on its own copy of the
index, so `p50_ms / inproc_p50_ms` is the cost of the service boundary.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console

from pml.v1 import search_pb2
from pml_cli import client
from pml_cli.local_stack import running_system
from pml_cli.phases import counted_phase, phase, step
from pml_common.events import ToolSpec
from pml_common.settings import Settings

VERBS = [
    "read",
    "write",
    "list",
    "delete",
    "search",
    "create",
    "update",
    "download",
    "upload",
    "convert",
    "summarize",
    "translate",
    "archive",
    "share",
    "rename",
    "validate",
    "export",
    "import",
    "schedule",
    "monitor",
]
OBJECTS = [
    "file",
    "email",
    "calendar event",
    "issue",
    "pull request",
    "database row",
    "image",
    "invoice",
    "support ticket",
    "chat message",
    "spreadsheet",
    "contact",
    "video",
    "log entry",
    "web page",
    "pdf report",
    "customer record",
    "payment",
    "shipment",
    "container",
    "secret",
    "dns record",
    "backup",
    "metric",
    "user account",
]
PLACES = [
    "in a cloud bucket",
    "on the local disk",
    "in the CRM",
    "in the data warehouse",
    "on GitHub",
    "in Slack",
    "in Google Drive",
    "in the ticketing system",
    "over SFTP",
    "in the team wiki",
    "in the ERP",
    "in Kubernetes",
    "in the mail server",
    "in S3",
    "in the analytics store",
    "in the billing system",
    "in Jira",
    "in Notion",
    "in the message queue",
    "in the vault",
]
QUERIES = 200


def synthetic_catalog(n: int) -> list[ToolSpec]:
    combos = itertools.islice(itertools.product(PLACES, OBJECTS, VERBS), n)
    tools = []
    for i, (place, obj, verb) in enumerate(combos):
        server = f"srv{i // 50}"
        name = f"{verb}_{obj.replace(' ', '_')}_{i}"
        description = f"{verb.capitalize()} a {obj} {place}. Returns the result as JSON."
        tools.append(
            ToolSpec(id=f"{server}:{name}", server=server, name=name, description=description)
        )
    if len(tools) < n:
        raise ValueError(f"the synthetic catalog has at most {len(tools)} tools")
    return tools


def synthetic_queries(count: int) -> list[str]:
    combos = itertools.product(VERBS, OBJECTS, PLACES)
    picked = itertools.islice(combos, 0, None, 97)  # spread over the space
    return [f"please {v} the {o} {p}" for v, o, p in itertools.islice(picked, count)]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def bench_search(
    settings: Settings, tools: int, requests: int, clients: int, console: Console
) -> dict[str, Any]:
    catalog = synthetic_catalog(tools)
    queries = synthetic_queries(QUERIES)
    step(console, "search: the running system, or a private one")
    with running_system(settings, console) as live:
        tenant = f"bench-{uuid.uuid4().hex[:10]}"
        stub = client.search_stub(live)
        try:
            _register(live, tenant, catalog, console)
            call = _search_call(stub, tenant)
            what = f"warm-up: {len(queries)} queries fill the embedding cache"
            with counted_phase(console, what, len(queries)) as bar:
                for query in queries:
                    call(query)
                    bar.advance()
            latencies, wall = _measure_grpc(call, queries, requests, clients, console)
            inproc = asyncio.run(_measure_inproc(live, tenant, catalog, queries, console))
        finally:
            with phase(console, f"deleting {tenant}"):
                stub.DeleteTenant(search_pb2.DeleteTenantRequest(tenant_id=tenant), timeout=300)
    p50 = statistics.median(latencies)
    inproc_p50 = statistics.median(inproc)
    return {
        "tools": tools,
        "clients": clients,
        "requests": len(latencies),
        "p50_ms": round(p50, 3),
        "p99_ms": round(_percentile(latencies, 0.99), 3),
        "qps": round(len(latencies) / wall, 1),
        "inproc_p50_ms": round(inproc_p50, 3),
        "inproc_p99_ms": round(_percentile(inproc, 0.99), 3),
        "grpc_over_inproc_p50": round(p50 / inproc_p50, 2) if inproc_p50 else None,
    }


def _register(settings: Settings, tenant: str, catalog: list[ToolSpec], console: Console) -> None:
    what = f"registering {len(catalog)} synthetic tools under {tenant}"
    with counted_phase(console, what, len(catalog)) as bar:
        for start in range(0, len(catalog), client.REGISTER_BATCH):
            batch = catalog[start : start + client.REGISTER_BATCH]
            client.register_tools(settings, tenant, batch)
            bar.advance(len(batch))


def _search_call(stub: Any, tenant: str) -> Any:
    def call(query: str) -> float:
        start = time.perf_counter()
        stub.Search(search_pb2.SearchRequest(tenant_id=tenant, query=query, limit=10), timeout=10)
        return (time.perf_counter() - start) * 1000

    return call


def _measure_grpc(
    call: Any, queries: list[str], requests: int, clients: int, console: Console
) -> tuple[list[float], float]:
    work = [queries[i % len(queries)] for i in range(requests)]
    what = f"measured: {requests} gRPC searches from {clients} clients"
    with counted_phase(console, what, requests) as bar:
        start = time.perf_counter()
        latencies = []
        with ThreadPoolExecutor(clients) as pool:
            for ms in pool.map(call, work):
                latencies.append(ms)
                bar.advance()
        wall = time.perf_counter() - start
    return latencies, wall


class _LocalContext:
    """What the servicer asks of a gRPC context, for calls made without gRPC."""

    def time_remaining(self) -> float | None:
        return None


async def _measure_inproc(
    settings: Settings, tenant: str, catalog: list[ToolSpec], queries: list[str], console: Console
) -> list[float]:
    from pml_common.bus import EventBus
    from pml_common.embedding import build_embedder
    from pml_common.stores import neo4j_driver, redis_client
    from pml_search.blas import limit_blas_threads
    from pml_search.catalog_index import TOOL, CatalogIndex
    from pml_search.graph_view import GraphView
    from pml_search.service import SearchServicer
    from pml_search.validation import tool_entry
    from pml_search.vector_store import QdrantVectorStore

    limit_blas_threads(1)  # as the search service does (pml_search.blas)
    with tempfile.TemporaryDirectory(prefix="pml-bench-") as tmp:
        local = settings.model_copy(update={"qdrant_path": str(Path(tmp) / "qdrant")})
        redis = redis_client(local)
        store = QdrantVectorStore.from_settings(local)
        driver = neo4j_driver(local)
        try:
            with phase(console, f"in-process: indexing the same {len(catalog)} tools"):
                catalog_index = CatalogIndex(store, build_embedder(local, redis))
                await catalog_index.start()
                await catalog_index.index(tenant, TOOL, [tool_entry(tenant, t) for t in catalog])
            servicer = SearchServicer(
                local,
                catalog_index,
                GraphView(driver, local.neo4j_database),
                EventBus(local, "bench", redis=redis),
            )
            context: Any = _LocalContext()
            latencies = []
            what = f"in-process: {3 * len(queries)} searches, the first {len(queries)} not counted"
            with counted_phase(console, what, 3 * len(queries)) as bar:
                for query in queries * 3:
                    request = search_pb2.SearchRequest(tenant_id=tenant, query=query, limit=10)
                    start = time.perf_counter()
                    await servicer.Search(request, context)
                    latencies.append((time.perf_counter() - start) * 1000)
                    bar.advance()
            return latencies[len(queries) :]  # the first pass loads the matrix and the graph
        finally:
            await driver.close()
            await store.close()
            await redis.aclose()
