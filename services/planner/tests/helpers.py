"""Helpers of the planner's tests: the scorer and search it calls, as small gRPC servers with a
fixed answer (the real ones need trained models and embedders; the planner only reads their
rankings), so the planner's own code runs unchanged over real gRPC; and a tenant's graph in the
trainer's schema."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import grpc
import neo4j

from pml.v1 import scorer_pb2, scorer_pb2_grpc, search_pb2, search_pb2_grpc
from pml_planner.targets import UNTRAINED, TargetSource


@dataclass
class Rankings:
    """What search answers, per kind of node, best first; requests are recorded."""

    tools: list[tuple[str, float]] = field(default_factory=list)
    capabilities: list[tuple[str, float]] = field(default_factory=list)
    requests: list[search_pb2.SearchRequest] = field(default_factory=list)


class _Search(search_pb2_grpc.SearchServiceServicer):
    def __init__(self, rankings: Rankings) -> None:
        self._rankings = rankings

    async def Search(
        self, request: search_pb2.SearchRequest, context: grpc.aio.ServicerContext
    ) -> search_pb2.SearchResponse:
        self._rankings.requests.append(request)
        kind = request.kinds[0]
        ranked = (
            self._rankings.tools
            if kind == search_pb2.NODE_KIND_TOOL
            else self._rankings.capabilities
        )
        return search_pb2.SearchResponse(
            results=[
                search_pb2.SearchResult(id=i, kind=kind, final_score=s)
                for i, s in ranked[: request.limit]
            ]
        )


class _Scorer(scorer_pb2_grpc.ScorerServiceServicer):
    async def ScoreCapabilities(
        self, request: scorer_pb2.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> scorer_pb2.ScoreResponse:
        return scorer_pb2.ScoreResponse(model_version=UNTRAINED)  # search ranks then


@dataclass
class StandIns:
    rankings: Rankings
    targets: TargetSource

    def rank(self, tools: Sequence[str], capabilities: Sequence[str] = ()) -> None:
        """Search's answer from now on: each list best first, scores 0.9, 0.8, …"""
        self.rankings.tools = [(t, 0.9 - 0.1 * i) for i, t in enumerate(tools)]
        self.rankings.capabilities = [(c, 0.9 - 0.1 * i) for i, c in enumerate(capabilities)]


@asynccontextmanager
async def stand_in_server(
    search: search_pb2_grpc.SearchServiceServicer,
    scorer: scorer_pb2_grpc.ScorerServiceServicer | None = None,
    maximum_concurrent_rpcs: int | None = None,
) -> AsyncIterator[grpc.aio.Channel]:
    """`search` (and `scorer`) served on a free port; a channel to them."""
    server = grpc.aio.server(maximum_concurrent_rpcs=maximum_concurrent_rpcs)
    search_pb2_grpc.add_SearchServiceServicer_to_server(search, server)
    if scorer is not None:
        scorer_pb2_grpc.add_ScorerServiceServicer_to_server(scorer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel
    finally:
        await channel.close()
        await server.stop(None)


@asynccontextmanager
async def serving_stand_ins() -> AsyncIterator[StandIns]:
    """The scorer (untrained: search ranks the capabilities) and search, on a free port."""
    rankings = Rankings()
    async with stand_in_server(_Search(rankings), _Scorer()) as channel:
        targets = TargetSource(
            scorer_pb2_grpc.ScorerServiceStub(channel), search_pb2_grpc.SearchServiceStub(channel)
        )
        yield StandIns(rankings, targets)


async def write_graph(
    driver: neo4j.AsyncDriver, tenant: str, capabilities: dict[str, Sequence[str]]
) -> None:
    """Tools and capabilities with their ordered members, as the trainer writes them."""
    for cap, members in capabilities.items():
        await driver.execute_query(
            """
            MERGE (c:Capability {tenant_id: $tenant, id: $cap})
            WITH c
            UNWIND range(0, size($members) - 1) AS i
            MERGE (t:Tool {tenant_id: $tenant, id: $members[i]})
            MERGE (c)-[:CONTAINS {position: i}]->(t)
            """,
            tenant=tenant,
            cap=cap,
            members=list(members),
        )
