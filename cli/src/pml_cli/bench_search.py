"""`pml bench search`: Search latency over gRPC with concurrent clients, and in-process.

A synthetic catalog of N tools (verbs × objects × places, so queries have real answers) is
registered under a tenant of its own and deleted at the end. The measurement starts once every
consumer group of the registration's events has caught up (`consumers_caught_up_s`, at most
`CATCH_UP_S`), so it measures searches, not searches beside the trainer's cold start. Every
query is run once first, so
the measured runs find their embeddings in the shared Redis cache (the "warm cache" of the
goal). The in-process figure calls the same servicer code without gRPC, on its own copy of the
index, so `p50_ms / inproc_p50_ms` is the cost of the service boundary.

With `neighbour_tools` (`bench_search_beside_registration`), the question is another: does one
tenant's large registration slow down the others? The same searches are measured first alone,
then while a neighbour tenant registers that many new tools in one RegisterTools request (names
no earlier run used, so every one is embedded), then until every consumer group of its
`ToolsRegistered` has caught up (at most `CATCH_UP_S`): p50/p99 and errors of each phase side by
side, with the registration's outcome and time.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]
from rich.console import Console

from pml.v1 import search_pb2
from pml_cli import client
from pml_cli.local_stack import running_system
from pml_cli.phases import counted_phase, phase, step
from pml_common.events import ToolSpec, ToolsRegistered
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
#: Deadline of a measured `Search`, and of the tenant's first one (which reads its catalog
#: and graph view from the stores: minutes for 100,000 tools with the embedded vector store).
SEARCH_TIMEOUT_S = 10.0
FIRST_SEARCH_TIMEOUT_S = 900.0
#: How long searches beside a registration go on, once it returned, for its event's consumers.
CATCH_UP_S = 600.0
#: Deadline of the neighbour's one RegisterTools request.
REGISTER_TIMEOUT_S = 3600.0
DURING, AFTER = "during_registration", "until_consumers_caught_up"

SearchCall = Callable[[str], float]
#: The key of the client's milliseconds among a request's recorded stage timings.
CLIENT = "client"


def synthetic_catalog(n: int, prefix: str = "") -> list[ToolSpec]:
    """`n` tools; past 10,000 the descriptions come round again, the numbered names never do."""
    combos = itertools.islice(itertools.cycle(itertools.product(PLACES, OBJECTS, VERBS)), n)
    tools = []
    for i, (place, obj, verb) in enumerate(combos):
        server = f"srv{i // 50}"
        name = f"{prefix}{verb}_{obj.replace(' ', '_')}_{i}"
        description = f"{verb.capitalize()} a {obj} {place}. Returns the result as JSON."
        tools.append(
            ToolSpec(id=f"{server}:{name}", server=server, name=name, description=description)
        )
    return tools


def synthetic_queries(count: int) -> list[str]:
    """`count` distinct requests (at most one per combination), spread evenly over the space."""
    space = len(VERBS) * len(OBJECTS) * len(PLACES)
    picked = itertools.islice(
        itertools.product(VERBS, OBJECTS, PLACES), 0, None, max(1, space // count)
    )
    return [f"please {v} the {o} {p}" for v, o, p in itertools.islice(picked, count)]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def bench_search(
    settings: Settings,
    tools: int,
    requests: int,
    clients: int,
    console: Console,
    repeats: int = 1,
) -> dict[str, Any]:
    """The figures of one run; with `repeats`, the gRPC measurement is made that many times on
    the same registered tenant and its top-level figures are the medians of the repeats (each
    repeat's are listed): on a shared machine two measurements differ by more than the change
    under study, and a registration costs minutes at 10k tools."""
    catalog = synthetic_catalog(tools)
    queries = synthetic_queries(QUERIES)
    step(console, "search: the running system, or a private one")
    with running_system(settings, console) as live:
        tenant = f"bench-{uuid.uuid4().hex[:10]}"
        stub = client.search_stub(live)
        with client.scratch_tenants(live, console, tenant):
            started = time.perf_counter()
            _register(live, tenant, catalog, console)
            register_s = time.perf_counter() - started
            # The measured phase must not share the cores with the registration's consumers
            # (the trainer reads the whole catalog for each registered batch).
            with phase(console, "waiting until the consumers of the registration catch up"):
                caught_up_s = client.consumers_caught_up(live, (ToolsRegistered,), CATCH_UP_S)
            call = _search_call(stub, tenant)
            first = _search_call(stub, tenant, FIRST_SEARCH_TIMEOUT_S)
            first_ms = _warm_up(call, first, queries, console)
            stages: list[dict[str, float]] = []
            measured = _search_call(stub, tenant, stages=stages)
            runs = [
                _measure_grpc(measured, queries, requests, clients, console, (r, repeats))
                for r in range(1, repeats + 1)
            ]
            inproc = asyncio.run(_measure_inproc(live, tenant, catalog, queries, console))
    figures = [_run_figures(latencies, wall) for latencies, wall in runs]
    p50 = statistics.median(f["p50_ms"] for f in figures)
    inproc_p50 = statistics.median(inproc)
    return {
        "tools": tools,
        "clients": clients,
        "requests": len(runs[0][0]),
        "register_s": round(register_s, 1),
        # None: not caught up within CATCH_UP_S, and the measurement shared the machine
        "consumers_caught_up_s": caught_up_s,
        "first_search_ms": round(first_ms, 1),
        "p50_ms": round(p50, 3),
        "p99_ms": round(statistics.median(f["p99_ms"] for f in figures), 3),
        "qps": round(statistics.median(f["qps"] for f in figures), 1),
        "repeats": figures,
        "inproc_p50_ms": round(inproc_p50, 3),
        "inproc_p99_ms": round(_percentile(inproc, 0.99), 3),
        "grpc_over_inproc_p50": round(p50 / inproc_p50, 2) if inproc_p50 else None,
        # Where the measured requests' time went (all repeats), as the service timed its stages.
        "stages_p50_ms": stage_percentiles(stages, 0.5),
        "stages_p99_ms": stage_percentiles(stages, 0.99),
    }


def _run_figures(latencies: list[float], wall: float) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(_percentile(latencies, 0.99), 3),
        "qps": round(len(latencies) / wall, 1),
    }


def bench_search_beside_registration(
    settings: Settings,
    tools: int,
    neighbour_tools: int,
    requests: int,
    clients: int,
    console: Console,
) -> dict[str, Any]:
    """A tenant's Search latency alone, then while a neighbour registers `neighbour_tools`."""
    catalog = synthetic_catalog(tools)
    run = uuid.uuid4().hex[:6]
    neighbour_catalog = synthetic_catalog(neighbour_tools, prefix=f"n{run}_")
    queries = synthetic_queries(QUERIES)
    step(console, "search: the running system, or a private one")
    with running_system(settings, console) as live:
        tenant, neighbour = f"bench-{run}", f"bench-{run}-neighbour"
        stub = client.search_stub(live)
        with client.scratch_tenants(live, console, tenant, neighbour):
            _register(live, tenant, catalog, console)
            call = _search_call(stub, tenant)
            _warm_up(call, _search_call(stub, tenant, FIRST_SEARCH_TIMEOUT_S), queries, console)
            alone, _ = _measure_grpc(call, queries, requests, clients, console)
            beside = _Beside(call, queries)
            registration = beside.measure(live, neighbour, neighbour_catalog, clients, console)
    return {
        "tools": tools,
        "neighbour_tools": neighbour_tools,
        "clients": clients,
        "alone": _summary([(ms, True) for ms in alone]),
        DURING: _summary(beside.of(DURING)),
        AFTER: _summary(beside.of(AFTER)),
        "registration": registration,
    }


def _summary(samples: list[tuple[float, bool]]) -> dict[str, Any]:
    """Latency percentiles of the searches that succeeded, and how many failed."""
    done = [ms for ms, ok in samples if ok]
    return {
        "requests": len(samples),
        "errors": len(samples) - len(done),
        "p50_ms": round(statistics.median(done), 3) if done else None,
        "p99_ms": round(_percentile(done, 0.99), 3) if done else None,
    }


class _Beside:
    """Searches of one tenant from several clients, each sample marked with the phase of a
    neighbour's registration it started in."""

    def __init__(self, call: SearchCall, queries: list[str]) -> None:
        self._call = call
        self._queries = queries
        self._phase = DURING
        self._samples: list[tuple[str, float, bool]] = []
        self._stop = threading.Event()

    def of(self, phase_name: str) -> list[tuple[float, bool]]:
        return [(ms, ok) for name, ms, ok in self._samples if name == phase_name]

    def measure(
        self,
        settings: Settings,
        neighbour: str,
        catalog: list[ToolSpec],
        clients: int,
        console: Console,
    ) -> dict[str, Any]:
        """Search from `clients` threads while `neighbour` registers `catalog` in one request,
        then until its event is consumed; the registration's outcome."""
        with ThreadPoolExecutor(clients) as pool:
            searching = [pool.submit(self._search, c, clients) for c in range(clients)]
            try:
                what = f"{clients} clients search while {neighbour} registers {len(catalog)} tools"
                with phase(console, f"{what} in one request"):
                    registration = _register_at_once(settings, neighbour, catalog)
                self._phase = AFTER
                with phase(console, "searching on until the consumers of its event catch up"):
                    registration["consumers_caught_up_s"] = client.consumers_caught_up(
                        settings, (ToolsRegistered,), CATCH_UP_S
                    )
            finally:
                self._stop.set()
            for future in searching:
                future.result()
        return registration

    def _search(self, first: int, step_by: int) -> None:
        for i in itertools.count(first, step_by):
            if self._stop.is_set():
                return
            phase_name = self._phase
            start = time.perf_counter()
            try:
                self._call(self._queries[i % len(self._queries)])
                ok = True
            except grpc.RpcError:
                ok = False
            self._samples.append((phase_name, (time.perf_counter() - start) * 1000, ok))


def _register_at_once(settings: Settings, tenant: str, catalog: list[ToolSpec]) -> dict[str, Any]:
    """One RegisterTools request with the whole catalog: its status, count and seconds."""
    request = search_pb2.RegisterToolsRequest(
        tenant_id=tenant, tools=[client.tool_message(t) for t in catalog]
    )
    stub = client.search_stub(settings)  # a connection of its own, as young as the request
    start = time.perf_counter()
    try:
        reply = stub.RegisterTools(request, timeout=REGISTER_TIMEOUT_S)
        outcome: dict[str, Any] = {"status": "OK", "registered": reply.registered}
    except grpc.RpcError as exc:
        outcome = {"status": exc.code().name, "details": exc.details()}
    outcome["request_bytes"] = request.ByteSize()
    outcome["seconds"] = round(time.perf_counter() - start, 1)
    return outcome


def _warm_up(
    call: SearchCall, first_call: SearchCall, queries: list[str], console: Console
) -> float:
    """Run every query once; returns the first one's milliseconds (the tenant's first request,
    which reads its graph view and catalog from the stores, under `FIRST_SEARCH_TIMEOUT_S`)."""
    what = f"warm-up: {len(queries)} queries fill the embedding cache"
    with counted_phase(console, what, len(queries)) as bar:
        first = first_call(queries[0])
        bar.advance()
        for query in queries[1:]:
            call(query)
            bar.advance()
    return first


def _register(settings: Settings, tenant: str, catalog: list[ToolSpec], console: Console) -> None:
    what = f"registering {len(catalog)} synthetic tools under {tenant}"
    with counted_phase(console, what, len(catalog)) as bar:
        for start in range(0, len(catalog), client.REGISTER_BATCH):
            batch = catalog[start : start + client.REGISTER_BATCH]
            client.register_tools(settings, tenant, batch)
            bar.advance(len(batch))


def _search_call(
    stub: Any,
    tenant: str,
    timeout_s: float = SEARCH_TIMEOUT_S,
    stages: list[dict[str, float]] | None = None,
) -> Any:
    """A Search call that returns its milliseconds; with `stages`, each reply's stage timings
    are appended to it, with the client's milliseconds as `CLIENT`."""

    def call(query: str) -> float:
        start = time.perf_counter()
        request = search_pb2.SearchRequest(tenant_id=tenant, query=query, limit=10)
        reply = stub.Search(request, timeout=timeout_s)
        ms = (time.perf_counter() - start) * 1000
        if stages is not None:
            timed = {CLIENT: ms}
            for timing in reply.timings:
                timed[timing.stage] = timed.get(timing.stage, 0.0) + timing.ms
            stages.append(timed)
        return ms

    return call


def stage_percentiles(stages: list[dict[str, float]], q: float) -> dict[str, float]:
    """Percentile `q` of each server stage, of their sum (`server`), of what the client
    waited beyond it (`outside_server`: gRPC, interceptors, the event loop's queue) and of what
    it waited in all (`client`), all over the same requests (with repeats, every repeat's: the
    report's top-level p50 and p99 are medians of the repeats' instead)."""
    if not stages:
        return {}
    names = sorted({name for timed in stages for name in timed} - {CLIENT})
    columns = {name: [timed.get(name, 0.0) for timed in stages] for name in names}
    columns["server"] = [sum(timed.get(n, 0.0) for n in names) for timed in stages]
    columns["outside_server"] = [
        timed[CLIENT] - server for timed, server in zip(stages, columns["server"], strict=True)
    ]
    columns[CLIENT] = [timed[CLIENT] for timed in stages]
    return {name: round(_percentile(values, q), 3) for name, values in columns.items()}


def _measure_grpc(
    call: Any,
    queries: list[str],
    requests: int,
    clients: int,
    console: Console,
    repeat: tuple[int, int] = (1, 1),
) -> tuple[list[float], float]:
    work = [queries[i % len(queries)] for i in range(requests)]
    what = f"measured: {requests} gRPC searches from {clients} clients"
    if repeat[1] > 1:
        what += f" ({repeat[0]} of {repeat[1]})"
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
    from pml_common.embedding import build_tool_embedder
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
                catalog_index = CatalogIndex(store, build_tool_embedder(local, redis))
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
