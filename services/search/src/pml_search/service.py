"""The `SearchService` servicer (proto/pml/v1/search.proto).

- `Search`: unified search over tools and capabilities (ADR-051):
  ``final = min(semantic × reliability, 0.95)``, where `semantic` is the first stage's
  relevance (`pml_common.first_stage`: BM25 and dense similarity fused, or one of them when the
  request names a `retriever`). Candidates are the `max(2·limit, candidate_pool)` most relevant
  entries of each requested kind (reliability can lift a candidate by ×1.2 only, so deeper
  candidates cannot overtake the pool), ranked by final score.
- `SearchTools`: hybrid tool search (seeds 003/004): candidate generation (the
  `candidate_pool` most relevant tools by the fused first stage) → re-rank by
  ``α·semantic + (1−α)·graph`` then
  reliability (``min(hybrid × reliability, 0.95)``) → top-k. α = 1 without context tools, else
  adaptive from the tenant's LINK graph (see `ranking.adaptive_alpha`).
- `GetNode`, `RegisterTools`, `RegisterCapabilities`, `DeleteTenant`: see the proto.

A registration is all or nothing: the batch is validated whole, stored in bounded chunks
(`CatalogIndex.writing`), and its event published only once everything is stored. A failure on
the way (the store, the embedder, the bus, the caller's deadline) or the caller going away puts
the catalog back as it was, and the caller is told why and that nothing was registered. One
`ToolsRegistered` describes a whole batch, up to 50,000 tools: one stream entry is published
atomically, where chunked events could be left half published by a bus failing between them.
Once publishing has started it is finished even if the caller goes away (`publish_all`): what
is published is applied by the consumers, so it must stay stored. Capabilities have an event
each; should the bus fail after some of them are out, the answer names those (registered, their
consumers store them again) and says the others are not.

Every response of the searches carries per-stage wall times (`timings`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, NamedTuple

import grpc  # type: ignore[import-untyped, unused-ignore]
import numpy as np
import structlog

from pml.v1 import common_pb2, search_pb2, search_pb2_grpc
from pml_common.bus import EventBus
from pml_common.events import (
    CapabilityLearned,
    CapabilitySpec,
    Event,
    TenantDeleted,
    ToolSpec,
    ToolsRegistered,
)
from pml_common.first_stage import HYBRID, retriever_problem, sub_goals
from pml_common.grpc_server import RequestError, check_deadline, invalid_argument, not_found
from pml_common.publishing import PublishInterrupted, publish_all
from pml_common.settings import Settings
from pml_search import ranking
from pml_search.catalog_index import CAPABILITY, TOOL, CatalogEntry, CatalogIndex, Scored
from pml_search.graph_view import GraphView, NodeStats, TenantGraph
from pml_search.validation import (
    ENUM_OF_KIND,
    capability_entry,
    capability_specs_of,
    context_tools_of,
    kinds_of,
    limit_of,
    min_score_of,
    node_id_of,
    query_of,
    tenant_of,
    tool_entry,
    tool_specs_of,
)

RELATED_PER_RELATION = 5
#: Ids of what the first events announced, quoted when the bus fails midway through.
_SHOWN_IDS = 10

log = structlog.get_logger(__name__)


class PartlyRegistered(RequestError):
    """The bus failed after some of a registration's events were published."""


class Timings:
    """Wall time of each stage of one request, in milliseconds."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, float]] = []

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stages.append((name, (time.perf_counter() - start) * 1000.0))

    def proto(self) -> list[common_pb2.StageTiming]:
        return [common_pb2.StageTiming(stage=s, ms=ms) for s, ms in self.stages]


class SearchServicer(search_pb2_grpc.SearchServiceServicer):
    def __init__(
        self, settings: Settings, catalog: CatalogIndex, graph: GraphView, bus: EventBus
    ) -> None:
        self._settings = settings
        self._catalog = catalog
        self._graph = graph
        self._bus = bus

    # --- searches -----------------------------------------------------------------------------

    async def Search(
        self, request: search_pb2.SearchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> search_pb2.SearchResponse:
        timings = Timings()
        with timings.stage("validate"):
            tenant = tenant_of(request.tenant_id, self._settings)
            query = query_of(request.query, self._settings)
            limit = limit_of(request.limit, self._settings)
            kinds = kinds_of(request.kinds)
            min_semantic = min_score_of(request.min_semantic_score)
            problem = retriever_problem(request.retriever)
            if problem:
                raise invalid_argument(problem)
        retriever = request.retriever or HYBRID
        texts = [query, *sub_goals(query)] if retriever == HYBRID else [query]
        vectors = await self._embed(texts, timings, context)
        pool = max(2 * limit, self._settings.candidate_pool)
        with timings.stage("retrieve"):
            candidates = [
                scored
                for kind in kinds
                for scored in await self._catalog.ranked(
                    tenant, kind, texts, vectors, pool, retriever
                )
                if scored.relevance >= min_semantic
            ]
        with timings.stage("graph"):
            view = await self._graph.get(tenant)
        check_deadline(context)
        with timings.stage("rank"):
            results = rank_unified(candidates, view, limit)
        return search_pb2.SearchResponse(results=results, timings=timings.proto())

    async def SearchTools(
        self, request: search_pb2.SearchToolsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> search_pb2.SearchToolsResponse:
        timings = Timings()
        with timings.stage("validate"):
            tenant = tenant_of(request.tenant_id, self._settings)
            query = query_of(request.query, self._settings)
            limit = limit_of(request.limit, self._settings)
            context_tools = context_tools_of(request.context_tools, self._settings)
            unknown = await self._catalog.missing(tenant, TOOL, context_tools)
            if unknown:
                raise not_found(
                    f"context_tools not in tenant {tenant!r}'s catalog: "
                    + ", ".join(repr(u) for u in unknown)
                )
        texts = [query, *sub_goals(query)]
        vectors = await self._embed(texts, timings, context)
        with timings.stage("retrieve"):
            pool = max(limit, self._settings.candidate_pool)
            candidates = await self._catalog.ranked(tenant, TOOL, texts, vectors, pool, HYBRID)
        with timings.stage("graph"):
            view = await self._graph.get(tenant)
            tool_count = await self._catalog.size(tenant, TOOL)
        check_deadline(context)
        with timings.stage("rerank"):
            links = view.links
            alpha = ranking.adaptive_alpha(
                bool(context_tools), links.edge_count(), max(tool_count, links.node_count())
            )
            tools = rank_hybrid(candidates, view, context_tools, alpha, limit)
        if request.include_related:
            with timings.stage("related"):
                for tool in tools:
                    tool.related_tools.extend(_related(links, tool.tool_id))
        return search_pb2.SearchToolsResponse(tools=tools, alpha=alpha, timings=timings.proto())

    async def GetNode(
        self, request: search_pb2.GetNodeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> search_pb2.SearchResult:
        tenant = tenant_of(request.tenant_id, self._settings)
        node_id = node_id_of(request.id)
        for kind in (TOOL, CAPABILITY):
            entry = await self._catalog.get(tenant, kind, node_id)
            if entry is not None:
                view = await self._graph.get(tenant)
                return _node_result(entry, view.stats(kind, node_id))
        raise not_found(f"no tool or capability {node_id!r} in tenant {tenant!r}")

    # --- writes -------------------------------------------------------------------------------

    async def RegisterTools(
        self, request: search_pb2.RegisterToolsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> search_pb2.RegisterResponse:
        tenant = tenant_of(request.tenant_id, self._settings)
        # Up to 50,000 tools: validating them and building their event is CPU work for a
        # thread, so that other requests are served meanwhile.
        specs = await asyncio.to_thread(tool_specs_of, request.tools)
        entries, named = await asyncio.to_thread(_tools_registered, tenant, specs)
        event_ids = await self._register("tools", tenant, TOOL, entries, named, context)
        return search_pb2.RegisterResponse(registered=len(specs), event_ids=event_ids)

    async def RegisterCapabilities(
        self,
        request: search_pb2.RegisterCapabilitiesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> search_pb2.RegisterResponse:
        tenant = tenant_of(request.tenant_id, self._settings)
        specs = await asyncio.to_thread(capability_specs_of, request.capabilities)
        entries, named = await asyncio.to_thread(_capabilities_learned, tenant, specs)
        ids = await self._register("capabilities", tenant, CAPABILITY, entries, named, context)
        return search_pb2.RegisterResponse(registered=len(specs), event_ids=ids)

    async def _register(
        self,
        what: str,
        tenant: str,
        kind: str,
        entries: Sequence[CatalogEntry],
        events: Sequence[tuple[str, Event]],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> list[str]:
        """Store the entries, then publish the events that announce them (each named by what
        it announces): all or nothing."""
        async with (
            _nothing_registered(what),
            self._catalog.writing(
                tenant,
                kind,
                entries,
                chunk=self._settings.catalog_write_chunk,
                proceed=lambda: check_deadline(context),
            ),
        ):
            check_deadline(context)  # a caller that gave up is not announced anything
            try:
                return await publish_all(self._bus, [event for _, event in events])
            except PublishInterrupted as exc:
                raise _partly([name for name, _ in events], exc) from exc

    async def DeleteTenant(
        self, request: search_pb2.DeleteTenantRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> search_pb2.DeleteTenantResponse:
        # Destructive: the tenant must be named, never defaulted.
        if not request.tenant_id.strip():
            raise invalid_argument("tenant_id must be given to delete a tenant")
        tenant = tenant_of(request.tenant_id, self._settings)
        deleted = await self._catalog.delete_tenant(tenant)
        self._graph.forget(tenant)
        event_id = await self._bus.publish(TenantDeleted.create(tenant_id=tenant))
        return search_pb2.DeleteTenantResponse(deleted=deleted, event_id=event_id)

    # --- helpers ------------------------------------------------------------------------------

    async def _embed(
        self, texts: Sequence[str], timings: Timings, context: grpc.aio.ServicerContext[Any, Any]
    ) -> np.ndarray:
        """Embeddings of a request and its sub-goals, in one call."""
        check_deadline(context)
        with timings.stage("embed"):
            vectors = await self._catalog.embedder.embed_queries(texts)
        check_deadline(context)
        return np.asarray(vectors, dtype=np.float32)


def _tools_registered(
    tenant: str, specs: Sequence[ToolSpec]
) -> tuple[list[CatalogEntry], list[tuple[str, Event]]]:
    """The entries of a RegisterTools batch, and its one event (named by what it announces)."""
    entries = [tool_entry(tenant, s) for s in specs]
    event = ToolsRegistered.create(tenant_id=tenant, tools=specs)
    return entries, [(f"{len(specs)} tools", event)]


def _capabilities_learned(
    tenant: str, specs: Sequence[CapabilitySpec]
) -> tuple[list[CatalogEntry], list[tuple[str, Event]]]:
    """The entries of a RegisterCapabilities batch, and an event for each, named by its id."""
    entries = [capability_entry(tenant, s) for s in specs]
    named: list[tuple[str, Event]] = [
        (s.id, CapabilityLearned.create(tenant_id=tenant, capability=s)) for s in specs
    ]
    return entries, named


@asynccontextmanager
async def _nothing_registered(what: str) -> AsyncIterator[None]:
    """A failure of a registration past its validation, as the caller should hear it: the
    catalog was put back, so it says why and that nothing was registered."""
    try:
        yield
    except PartlyRegistered:
        raise
    except RequestError as exc:  # the caller's deadline
        raise RequestError(exc.code, f"{exc.message}; nothing was registered") from exc
    except Exception as exc:
        log.warning("search.registration_failed", what=what, error=f"{type(exc).__name__}: {exc}")
        raise RequestError(
            grpc.StatusCode.UNAVAILABLE,
            f"the {what} could not be stored and announced ({type(exc).__name__}: {exc}); "
            "nothing was registered, retry later",
        ) from exc


def _partly(names: Sequence[str], exc: PublishInterrupted) -> PartlyRegistered:
    published = len(exc.published)
    out = ", ".join(repr(n) for n in names[:published][:_SHOWN_IDS])
    more = " ..." if published > _SHOWN_IDS else ""
    return PartlyRegistered(
        grpc.StatusCode.UNAVAILABLE,
        f"{exc}: {out}{more} are registered; the other {len(names) - published} are not, "
        "register them again",
    )


def rank_unified(
    candidates: Sequence[Scored], view: TenantGraph, limit: int
) -> list[search_pb2.SearchResult]:
    """ADR-051 final scores of the candidates, best first (ties by id), `limit` kept."""
    ranked = [_Unified.of(scored, view) for scored in candidates]
    # The 0.95 cap makes ties; the better semantic match goes first among them.
    ranked.sort(key=lambda u: (-u.final, -u.scored.relevance, u.scored.entry.id))
    # Messages for the kept ones only: building one costs more than scoring it.
    return [u.result() for u in ranked[:limit]]


def rank_hybrid(
    candidates: Sequence[Scored],
    view: TenantGraph,
    context_tools: Sequence[str],
    alpha: float,
    limit: int,
) -> list[search_pb2.ToolResult]:
    """Re-rank first-stage candidates with the graph and reliability, best first, `limit` kept."""
    ranked = [_Hybrid.of(scored, view, context_tools, alpha) for scored in candidates]
    ranked.sort(key=lambda h: (-h.final, -h.scored.relevance, h.scored.entry.id))
    return [h.result() for h in ranked[:limit]]


def _stats_fields(stats: NodeStats | None) -> tuple[float | None, int]:
    if stats is None:
        return None, 0
    return stats.success_rate, stats.executions


class _Unified(NamedTuple):
    """A candidate's ADR-051 score and what its result reports."""

    scored: Scored
    rate: float | None
    executions: int
    factor: float
    final: float

    @classmethod
    def of(cls, scored: Scored, view: TenantGraph) -> _Unified:
        rate, executions = _stats_fields(view.stats(scored.entry.kind, scored.entry.id))
        factor = ranking.reliability_factor(rate)
        final = ranking.unified_score(scored.relevance, factor)
        return cls(scored, rate, executions, factor, final)

    def result(self) -> search_pb2.SearchResult:
        entry = self.scored.entry
        return search_pb2.SearchResult(
            id=entry.id,
            kind=ENUM_OF_KIND[entry.kind],
            name=entry.name,
            description=entry.description,
            server=entry.server,
            semantic_score=self.scored.relevance,
            reliability_factor=self.factor,
            final_score=self.final,
            success_rate=self.rate,
            executions=self.executions,
            dense_score=self.scored.dense,
            lexical_score=self.scored.lexical,
        )


def _node_result(entry: CatalogEntry, stats: NodeStats | None) -> search_pb2.SearchResult:
    rate, executions = _stats_fields(stats)
    return search_pb2.SearchResult(
        id=entry.id,
        kind=ENUM_OF_KIND[entry.kind],
        name=entry.name,
        description=entry.description,
        server=entry.server,
        reliability_factor=ranking.reliability_factor(rate),
        success_rate=rate,
        executions=executions,
    )


class _Hybrid(NamedTuple):
    """A candidate's seeds 003/004 score and what its result reports."""

    scored: Scored
    graph: float
    factor: float
    final: float

    @classmethod
    def of(
        cls, scored: Scored, view: TenantGraph, context_tools: Sequence[str], alpha: float
    ) -> _Hybrid:
        graph = ranking.graph_relatedness(view.links, scored.entry.id, context_tools)
        rate, _ = _stats_fields(view.stats(TOOL, scored.entry.id))
        factor = ranking.reliability_factor(rate)
        hybrid = ranking.hybrid_score(scored.relevance, graph, alpha)
        return cls(scored, graph, factor, ranking.unified_score(hybrid, factor))

    def result(self) -> search_pb2.ToolResult:
        entry = self.scored.entry
        return search_pb2.ToolResult(
            tool_id=entry.id,
            server_id=entry.server,
            name=entry.name,
            description=entry.description,
            semantic_score=self.scored.relevance,
            graph_score=self.graph,
            reliability_factor=self.factor,
            final_score=self.final,
            dense_score=self.scored.dense,
            lexical_score=self.scored.lexical,
        )


def _related(links: ranking.LinkGraph, tool_id: str) -> list[search_pb2.RelatedTool]:
    return [
        search_pb2.RelatedTool(tool_id=r.tool_id, relation=r.relation, score=r.score)
        for r in ranking.related_tools(links, tool_id, RELATED_PER_RELATION)
    ]
